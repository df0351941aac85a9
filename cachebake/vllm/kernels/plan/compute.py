"""Compute an engine plan with vLLM's own code, on any machine where ``vllm`` imports.

``compute_plan(hf_config, serve_args, target)`` runs the steps a ``vllm serve`` start-up runs
up to the first kernel launch, with vLLM's own functions:

* the engine config: ``vllm serve``'s argument parser and
  ``EngineArgs.create_engine_config(OPENAI_API_SERVER)`` (batch defaults, prefix caching ->
  Mamba "align" mode, NemotronH's float32 SSM state, CUDA-graph capture sizes);
* the model: the real model class instantiated on the ``meta`` device as TP rank 0 of the
  planned TP group, so the Mamba mixers' per-rank widths, groups, dtypes and activation are
  the engine's own;
* the KV cache: ``Platform.update_block_size_for_backend`` with FlashAttention (attention
  block raised until a page holds the Mamba state, Mamba page padded to it), every layer's
  ``get_kv_cache_spec``, ``resolve_kv_cache_layout``, ``get_kv_cache_configs`` and
  ``create_kv_cache_views`` + ``MambaBase.bind_kv_cache`` on a ``meta`` buffer, which give the
  state views' shapes, strides, byte offsets and dtypes;
* the block-table width (``max_num_blocks_per_req``/``get_block_table_width``), the CUDA-graph
  mode and capture descriptors (``resolve_cudagraph_mode_and_sizes``,
  ``CudaGraphManager._init_candidates``), the start-up warm-up batch (``warmup.py``'s block
  counting) and the prefix-cache hash granularity.

The engine is built by ``cachebake.vllm.kernels.plan.engine`` (vLLM on its CPU platform, the target's
hardware answers).  ``vllm`` is imported inside the functions only: importing this module
costs nothing.
"""

from __future__ import annotations

from typing import Any

from cachebake.errors import BadInput
from cachebake.vllm.kernels.plan import PLAN_FORMAT
from cachebake.vllm.kernels.plan.engine import GiB, Engine, engine_session, one_line

# Memory a served model holds besides weights and KV cache (activations of the profile run,
# CUDA graphs, the CUDA context).  Only the start-up warm-up batch depends on the KV block
# count derived with it, and only when blocks are scarce (see warmup below).
NON_KV_RESERVE_GIB = 6.0


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def compute_plan(hf_config: dict[str, Any], serve_args: dict[str, Any], target: dict[str, Any],
                 *, recipe: str | None = None) -> dict[str, Any]:
    """The engine plan of ``vllm serve MODEL <serve_args>`` for a model with ``hf_config`` on
    ``target``; pure data (JSON-ready)."""
    with engine_session(hf_config, serve_args, target) as engine:
        try:
            return _plan(engine, serve_args, target, recipe)
        except ValueError as e:  # vLLM's start-up refusals (e.g. too few Mamba blocks)
            raise BadInput(f"vLLM would refuse to start: {one_line(e)}") from e


def _plan(engine: Engine, serve_args, target, recipe) -> dict[str, Any]:
    import vllm
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.mamba_mixer2 import Mixer2RMSNormGated
    from vllm.model_executor.layers.mamba.mamba_utils import get_conv_state_layout
    from vllm.v1.attention.backend import max_decode_query_len
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder
    from vllm.v1.attention.backends.utils import NULL_BLOCK_ID, PAD_SLOT_ID
    from vllm.v1.core.kv_cache_planning import get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import (resolve_cache_hit_alignment_tokens,
                                             resolve_kv_cache_block_sizes)
    from cachebake.vllm.versions import (get_block_table_width, gpu_memory_utilization,
                                         reserved_block_count, resolve_cudagraph_mode_and_sizes)
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    vc, model = engine.vc, engine.model
    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    sc, comp = vc.scheduler_config, vc.compilation_config
    mixers, mixer = engine.mixers, engine.mixer
    attn_layers, attn_spec, specs = engine.attn_layers, engine.attn_spec, engine.specs
    mamba_spec, layout, groups = engine.mamba_spec, engine.layout, engine.groups
    with set_current_vllm_config(vc):
        gated_norm_op = Mixer2RMSNormGated.enabled()

    # KV memory: the target's memory as vLLM budgets it, less this rank's weights and a
    # reserve (see NON_KV_RESERVE_GIB); or what the serve args fix.
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if cc.kv_cache_memory_bytes:
        kv_bytes = int(cc.kv_cache_memory_bytes)
        kv_source = "serve_args.kv_cache_memory_bytes"
    else:
        kv_bytes = int(target["memory_gib"] * GiB * gpu_memory_utilization(cc)
                       - weight_bytes - NON_KV_RESERVE_GIB * GiB)
        kv_source = (f"estimate: {target['memory_gib']:g} GiB x gpu_memory_utilization "
                     f"{gpu_memory_utilization(cc):g} - weights - {NON_KV_RESERVE_GIB:g} GiB")
    if kv_bytes <= 0:
        raise BadInput(f"the weights ({weight_bytes / GiB:.1f} GiB per rank) do not leave KV-cache "
                       f"memory on a {target['memory_gib']:g} GiB GPU at this TP size")
    try:
        kv_config = get_kv_cache_configs(vc, [specs], [kv_bytes], groups)[0]
    except ValueError as e:
        raise BadInput(f"vLLM cannot fit this KV cache: {one_line(e)}") from e

    # The states as bind_kv_cache carves them out of the layer's raw buffer.
    view, tensor = engine.bind_states(kv_config)
    conv_state, ssm_state = mixer.kv_cache[0], mixer.kv_cache[1]
    layer_offset = view.storage_offset()

    def view_record(name: str, t) -> dict[str, Any]:
        return {"name": name, "dtype": _dtype_name(t.dtype), "shape": list(t.shape[1:]),
                "stride": list(t.stride()),
                "offset_bytes": (t.storage_offset() * t.element_size()) - layer_offset}

    mamba_group = next(g for g in kv_config.kv_cache_groups if mixer.prefix in g.layer_names)
    group_spec = mamba_group.kv_cache_spec
    width = get_block_table_width()(group_spec.max_num_blocks_per_req(vc, mc.max_model_len),
                                  group_spec.block_size,
                                  token_alignment=group_spec.block_table_token_alignment)
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(kv_config, vc)
    hit_alignment = resolve_cache_hit_alignment_tokens(kv_config, vc, scheduler_block, hash_block)

    # CUDA graphs as Model Runner V2 resolves them (FlashAttention and Mamba2 builders).
    num_spec = vc.num_speculative_tokens
    decode_query_len = 1 + num_spec
    min_support = min(FlashAttentionBackend.get_builder_cls().get_cudagraph_support(vc, attn_spec),
                      Mamba2AttentionMetadataBuilder.get_cudagraph_support(vc, mamba_spec),
                      key=lambda s: s.value)
    try:
        cg_mode = resolve_cudagraph_mode_and_sizes(
            comp, min_support, "MAMBA2_ATTN", decode_query_len, use_v2_model_runner=True,
            kv_cache_config=kv_config, max_num_reqs=sc.max_num_seqs,
            piecewise_capture_available=True)
    except ValueError as e:  # e.g. fewer Mamba blocks than max_num_seqs
        raise BadInput(f"vLLM would refuse to start with {kv_bytes / GiB:.1f} GiB of KV cache "
                       f"({kv_source}): {one_line(e)}") from e
    captures = _capture_descriptors(CudaGraphManager, vc, cg_mode, decode_query_len)
    decode_cg_max_bs = sc.max_num_seqs
    if comp.max_cudagraph_capture_size is not None:
        decode_cg_max_bs = min(decode_cg_max_bs, comp.max_cudagraph_capture_size)

    # warmup_kernels' batch (vllm/v1/worker/gpu/warmup.py): prompts of decode_query_len + 1
    # tokens, as many as the scheduler limits and the KV blocks allow.
    prompt_len = decode_query_len + 1
    decode_steps = 5 if num_spec > 0 else 3
    decode_len = prompt_len + decode_steps * decode_query_len
    group_specs = [g.kv_cache_spec for g in kv_config.kv_cache_groups]

    def block_count(n: int, spec) -> int:
        return reserved_block_count(n, spec, vllm_config=vc, num_lookahead_tokens=vc.num_lookahead_tokens,
                                    max_model_len=mc.max_model_len, max_encoder_len=0)

    max_blocks_per_req = sum(block_count(decode_len, s) for s in group_specs)
    by_limit = {"max_num_seqs": sc.max_num_seqs,
                "max_num_batched_tokens": sc.max_num_batched_tokens // max(prompt_len, decode_query_len),
                "kv_blocks": max(1, (kv_config.num_blocks - 1) // max_blocks_per_req)}
    warmup_reqs = min(by_limit.values())

    hp = mixer
    tp = pc.tensor_parallel_size
    return {
        "format": PLAN_FORMAT,
        "vllm_version": vllm.__version__,
        "recipe": recipe,
        "target": dict(target),
        "serve_args": dict(serve_args),
        "model": {
            "architecture": mc.architecture,
            "model_type": getattr(mc.hf_config, "model_type", None),
            "dtype": _dtype_name(mc.dtype),
            "tensor_parallel_size": tp,
            "mamba_layers": len(mixers),
            "attention_layers": len(attn_layers),
            "weight_bytes_per_rank": int(weight_bytes),
            "model_runner": "v2",
        },
        "mixer": {  # one TP rank's MambaMixer2, read off the instantiated layer
            "num_heads": hp.num_heads // tp,
            "head_dim": hp.head_dim,
            "n_groups": hp.n_groups // tp,
            "d_state": hp.ssm_state_size,
            "conv_kernel": hp.conv_kernel_size,
            "chunk_size": mc.get_mamba_chunk_size(),
            "intermediate": hp.tped_intermediate_size,
            "conv_dim": hp.tped_conv_size,
            "in_proj_width": int(hp.in_proj.output_size_per_partition),
            "activation": hp.activation,
            "use_conv_bias": hp.conv1d.bias is not None,
            "conv_weight_dtype": _dtype_name(hp.conv_weights.dtype),
            "A_dtype": _dtype_name(hp.A.dtype),
            "D_dtype": _dtype_name(hp.D.dtype),
            "dt_bias_dtype": _dtype_name(hp.dt_bias.dtype),
            "use_rms_norm": bool(hp.use_rms_norm),
            "rms_norm_eps": float(hp.norm.variance_epsilon),
            # Mixer2RMSNormGated.forward_cuda calls the Triton rms_norm_gated only when the
            # custom op is on, and then only for one group without TP.
            "gated_norm_triton": bool(gated_norm_op and hp.use_rms_norm and hp.norm.n_groups == 1
                                      and hp.norm.tp_size == 1),
            "mup_vector": hasattr(model, "model") and any(
                hasattr(m, "mup_vector") for m in model.modules()),
        },
        "kv_cache": {
            "attention_backend": target.get("attention_backend", "FLASH_ATTN"),
            "layout": layout.name,
            "block_size": cc.block_size,
            "mamba_block_size": group_spec.block_size,
            "page_bytes": mamba_spec.page_size_bytes,
            "state_bytes": mamba_spec.real_page_size_bytes,
            "block_stride_bytes": int(tensor.block_stride),
            "conv_state_layout": get_conv_state_layout(),
            "views": [view_record("conv", conv_state), view_record("ssm", ssm_state)],
            "num_blocks": kv_config.num_blocks,
            "kv_cache_bytes": kv_bytes,
            "kv_cache_bytes_source": kv_source,
            "groups": [{"layers": len(g.layer_names), "spec": type(g.kv_cache_spec).__name__,
                        "block_size": g.kv_cache_spec.block_size}
                       for g in kv_config.kv_cache_groups],
        },
        "cache": {
            "mamba_cache_mode": cc.mamba_cache_mode,
            "prefix_caching": bool(cc.enable_prefix_caching),
            "conv_state_dtype": _dtype_name(mamba_spec.dtypes[0]),
            "ssm_state_dtype": _dtype_name(mamba_spec.dtypes[1]),
            "mamba_cache_dtype": cc.mamba_cache_dtype,
            "mamba_ssm_cache_dtype": cc.mamba_ssm_cache_dtype,
            "num_speculative_blocks": mamba_spec.num_speculative_blocks,
            "num_prefill_checkpoint_blocks": mamba_spec.num_prefill_checkpoint_blocks,
            "prefill_checkpoint_alignment": mamba_spec.prefill_checkpoint_alignment,
            "hash_block_size": hash_block,
            "scheduler_block_size": scheduler_block,
            "cache_hit_alignment_tokens": hit_alignment,
            # MambaPrefillCheckpointBuilder's inputs (vllm/model_executor/layers/mamba/checkpoint.py)
            "drop_eagle_block": bool(vc.speculative_config is not None
                                     and vc.speculative_config.use_eagle_block_drop()
                                     and not vc.num_hash_lookahead_tokens),
            "num_hash_lookahead_tokens": vc.num_hash_lookahead_tokens,
        },
        "block_table": {
            "width": width,
            "dtype": "int32",
            # align mode gathers each row's last 1 + num_speculative_blocks columns into a
            # new (rows, n) tensor (mamba_get_block_table_tensor); "none" passes the table.
            "state_columns": 1 + mamba_spec.num_speculative_blocks,
        },
        "scheduler": {
            "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "max_model_len": mc.max_model_len,
            "chunked_prefill": bool(sc.enable_chunked_prefill),
            "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        },
        "spec": {
            "method": vc.speculative_config.method if vc.speculative_config else None,
            "num_speculative_tokens": num_spec,
            "decode_query_len": decode_query_len,
            "reorder_batch_threshold": max(1, max_decode_query_len(vc)) if num_spec else 1,
        },
        "cudagraph": {
            "mode": cg_mode.name,
            "min_backend_support": min_support.name,
            "capture_sizes": list(comp.cudagraph_capture_sizes or []),
            "max_capture_size": comp.max_cudagraph_capture_size or 0,
            "decode_cudagraph_max_bs": decode_cg_max_bs,
            "captures": captures,
            "profiling_full_captures": 2,  # _FULL_GRAPH_PROFILING_SAMPLES
            "profiling_num_blocks": min(sc.max_num_seqs, comp.max_cudagraph_capture_size or 0) or 1,
        },
        "warmup": {
            "profile_ssd_tokens": mc.get_mamba_chunk_size(),
            "compile_sizes": _compile_warmup_sizes(comp),
            "prompt_len": prompt_len,
            "num_reqs": warmup_reqs,
            "limited_by": min(by_limit, key=lambda k: (by_limit[k], k != "kv_blocks")),
            "limits": by_limit,
            "max_blocks_per_req": max_blocks_per_req,
            "greedy_pass": num_spec > 0,
        },
        "ops": {
            "ssu_backend": str(vc.mamba_config.backend.value if hasattr(vc.mamba_config.backend, "value")
                               else vc.mamba_config.backend).lower(),
            "enable_stochastic_rounding": bool(vc.mamba_config.enable_stochastic_rounding),
            "stochastic_rounding_philox_rounds": int(vc.mamba_config.stochastic_rounding_philox_rounds),
            "is_blackwell": target["capability"][0] == 10,
            "launch_pdl": target["capability"][0] >= 9,
            "null_block_id": NULL_BLOCK_ID,
            "pad_slot_id": PAD_SLOT_ID,
            "replayssm": False,
        },
    }


def _compile_warmup_sizes(comp) -> list[int]:
    """The dummy-run sizes Worker._compile_or_warm_up_model runs before the JIT warm-up: the
    configured compile sizes that are no capture size, plus each compile range's end when no
    such size falls inside it (vllm/v1/worker/gpu_worker.py)."""
    from vllm.config import CompilationMode, CUDAGraphMode

    if comp.mode != CompilationMode.VLLM_COMPILE:
        return []
    sizes = [x for x in (comp.compile_sizes or []) if isinstance(x, int)]
    capture = list(comp.cudagraph_capture_sizes or []) if comp.cudagraph_mode != CUDAGraphMode.NONE else []
    sizes = [x for x in sizes if x not in capture]
    every = set(capture) | set(sizes)
    for r in comp.get_compile_ranges():
        if not any(x in r for x in every):
            sizes.append(r.end)
    return sorted(set(sizes), reverse=True)


def _capture_descriptors(manager_cls, vllm_config, cg_mode, decode_query_len) -> dict[str, list]:
    """The batches Model Runner V2 captures, per mode, from CudaGraphManager itself."""
    from vllm.v1.worker.gpu.cudagraph_utils import CUDAGraphMode

    mgr = manager_cls.__new__(manager_cls)
    mgr.vllm_config = vllm_config
    mgr.compilation_config = vllm_config.compilation_config
    mgr.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
    mgr.cudagraph_mode = cg_mode
    mgr.decode_query_len = decode_query_len
    mgr.varlen_decode = False
    mgr.ubatch_runner = None
    mgr.lora_capture_cases = [0]
    mgr._candidates, mgr._capture_descs = {}, {}
    mgr._init_candidates()
    out: dict[str, list] = {}
    for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
        out[mode.name] = [{"num_tokens": d.num_tokens, "num_reqs": d.num_reqs,
                           "uniform_token_count": d.uniform_token_count,
                           "max_query_len": d.max_query_len}
                          for d in mgr._capture_descs.get(mode, [])]
    return out


__all__ = ["compute_plan", "NON_KV_RESERVE_GIB"]
