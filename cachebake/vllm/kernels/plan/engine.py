"""vLLM's engine, as far as start-up goes before the GPU, built on this CPU by vLLM itself.

``engine_session(hf_config, serve_args, target)`` yields an ``Engine``: the engine config
from ``vllm serve``'s own argument parser and ``EngineArgs.create_engine_config
(OPENAI_API_SERVER)``; the model's real layers, instantiated on the ``meta`` device as TP
rank 0 of the planned TP group; every layer's KV-cache spec after vLLM's own hybrid
block-size alignment (``Platform.update_block_size_for_backend`` with FlashAttention); the
KV-cache layout and groups.  ``cachebake.vllm.kernels.plan.compute`` reads the engine plan off it; the
engine check (bench/engine_check/reference.py) runs vLLM's own Mamba2 layer in it.

vLLM runs here on its CPU platform.  The hardware questions vLLM asks -- GPU name, memory,
compute capability, whether CUDA graphs exist, whether Triton is there -- are answered with
the target's (``cachebake.vllm.kernels.plan.gpu_target``); CUDA's own config hook changes nothing a kernel
sees (it picks the worker class), so the CPU platform's, which would turn graphs and Model
Runner V2 off, is skipped.  Binary CUDA extensions are never imported.  ``vllm`` is imported
inside the functions only.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator

from cachebake.errors import BadInput, Unsupported, shorten
from cachebake.vllm.versions import uses_v2_runner

GiB = 1 << 30


class Engine:
    """What a vLLM start-up has built before its first kernel launch, on this CPU: the engine
    config, the model's layers (``meta`` tensors), every layer's KV-cache spec with the
    hybrid block sizes applied, the KV-cache layout and groups."""

    def __init__(self, vc, model):
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
        from vllm.platforms.interface import Platform
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
        from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend
        from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                      resolve_kv_cache_layout)
        from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        self.vc, self.model = vc, model
        mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
        self.mixers = {m.prefix: m for m in model.modules() if isinstance(m, MambaMixer2)}
        if not self.mixers:
            raise Unsupported(f"{mc.architecture} has no Mamba2 mixer: nothing for the kernels driver")
        self.mixer = next(iter(self.mixers.values()))
        self.attn_layers = [name for name, layer in vc.compilation_config.static_forward_context.items()
                            if isinstance(layer, AttentionLayerBase) and not isinstance(layer, MambaMixer2)]

        # Block sizes: vLLM's own hybrid alignment, with the attention backend the target runs.
        class _PlannedPlatform(Platform):
            @classmethod
            def _find_non_ssm_backends(cls, vllm_config):
                return [FlashAttentionBackend]

        with set_current_vllm_config(vc):
            _PlannedPlatform.update_block_size_for_backend(vc)

        # Every layer's KV-cache spec, as the worker collects them.
        kv_dtype = mc.dtype if cc.cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cc.cache_dtype]
        self.attn_spec = FlashAttentionBackend.customize_spec(FullAttentionSpec(
            block_size=cc.block_size, num_kv_heads=mc.get_num_kv_heads(pc),
            head_size=mc.get_head_size(), dtype=kv_dtype))
        self.specs: dict[str, Any] = {name: m.get_kv_cache_spec(vc) for name, m in self.mixers.items()}
        self.specs.update({name: self.attn_spec for name in self.attn_layers})
        self.mamba_spec = self.specs[self.mixer.prefix]
        if len({self.specs[n] for n in self.mixers}) != 1:
            raise Unsupported("the Mamba layers of this model have different state specs")
        names = [layout.name for layout in get_supported_kv_cache_layouts(
            [FlashAttentionBackend, Mamba2AttentionBackend])]
        self.layout = resolve_kv_cache_layout(vc, [names], list(self.specs.values()))
        self.groups = get_global_kv_cache_groups(vc, [self.specs])

    def kv_config(self, num_blocks: int):
        """The KV-cache config vLLM makes for ``num_blocks`` blocks (as the memory-profiling
        capture does for its minimal cache)."""
        from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder

        builder = get_kv_cache_config_builder(self.vc)
        return builder.get_kv_cache_config_from_groups(self.vc, self.groups, num_blocks)

    def bind_states(self, kv_config, device: str = "meta"):
        """Carve the first Mamba layer's states out of a raw buffer of ``device`` the way the
        worker does (create_kv_cache_views + MambaBase.bind_kv_cache).  Returns the layer's
        raw view (its storage offset is the layer's byte 0)."""
        import torch
        from vllm.v1.kv_cache_interface import create_kv_cache_views

        tensor = next(t for t in kv_config.kv_cache_tensors if self.mixer.prefix in t.layers)
        raw = torch.zeros(tensor.size, dtype=torch.int8, device=device)
        view = create_kv_cache_views(raw, self.mamba_spec, kv_config.num_blocks, self.layout, tensor)[
            tensor.layers.index(self.mixer.prefix)]
        self.mixer.bind_kv_cache(view)
        return view, tensor


@contextlib.contextmanager
def engine_session(hf_config: dict[str, Any], serve_args: dict[str, Any],
                   target: dict[str, Any]) -> Iterator[Engine]:
    """vLLM's engine as far as start-up gets before the GPU, with the target's hardware
    answers and the planned TP rank in force while the caller uses it."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout may carry JSON
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise Unsupported(f"computing an engine plan needs the vllm package ({e}); "
                          "use a stored plan or run `cachebake plan` where vllm is installed") from e
    with _virtual_target(target):
        with tempfile.TemporaryDirectory(prefix="cachebake-plan-") as model_dir:
            vc = _engine_config(hf_config, serve_args, model_dir)
        _check_supported(vc)
        with _tp_rank_zero(vc):
            _, model = _instantiate_model(vc)
            try:
                engine = Engine(vc, model)
            except ValueError as e:
                raise BadInput(f"vLLM would refuse to start: {one_line(e)}") from e
            yield engine


def _check_supported(vc) -> None:
    cc, pc = vc.cache_config, vc.parallel_config
    if not uses_v2_runner(vc):
        raise Unsupported("vLLM would serve this configuration with its V1 model runner; "
                          "the kernels driver replays Model Runner V2 only")
    if str(getattr(vc.mamba_config.backend, "name", vc.mamba_config.backend)).upper() != "TRITON":
        raise Unsupported("only the Triton Mamba SSU backend is planned (the default)")
    if cc.use_replayssm:
        raise Unsupported("--use-replayssm is not planned (ReplaySSM decode kernels)")
    if pc.pipeline_parallel_size != 1 or pc.decode_context_parallel_size != 1:
        raise Unsupported("pipeline / decode-context parallelism is not planned")


@contextlib.contextmanager
def _virtual_target(target: dict[str, Any]) -> Iterator[None]:
    """Answer vLLM's hardware questions with ``target`` while the plan is computed."""
    import vllm.config.vllm as config_vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    cls = type(current_platform)
    major, minor = target["capability"]
    memory = int(target["memory_gib"] * GiB)
    answers = {
        "get_device_capability": classmethod(lambda c, device_id=0: DeviceCapability(major, minor)),
        "get_device_name": classmethod(lambda c, device_id=0: target["gpu_name"]),
        "get_device_total_memory": classmethod(lambda c, device_id=0: memory),
        "support_static_graph_mode": classmethod(lambda c: True),  # CUDA graphs exist there
        # CudaPlatform.check_and_update_config only picks the worker class; the CPU
        # platform's would turn graphs and Model Runner V2 off.
        "check_and_update_config": classmethod(lambda c, vllm_config: None),
    }
    saved = {k: cls.__dict__.get(k) for k in answers}
    # 0.33 picks Model Runner V2 only with Triton (config/vllm.py:27, 745-760); 0.34 has no V1
    # and no HAS_TRITON there (its CPU platform needs CUDA_VISIBLE_DEVICES= instead)
    saved_triton = getattr(config_vllm, "HAS_TRITON", None)
    for k, v in answers.items():
        setattr(cls, k, v)
    if saved_triton is not None:
        config_vllm.HAS_TRITON = True  # the GPU builder has Triton: Model Runner V2 applies
    batch_defaults = EngineArgs.__dict__["get_batch_defaults"]
    EngineArgs.get_batch_defaults = classmethod(_target_batch_defaults(batch_defaults.__func__))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                delattr(cls, k)
            else:
                setattr(cls, k, v)
        if saved_triton is not None:
            config_vllm.HAS_TRITON = saved_triton
        EngineArgs.get_batch_defaults = batch_defaults


def _target_batch_defaults(batch_defaults):
    """``EngineArgs.get_batch_defaults`` as the target answers it: the default max_num_seqs and
    max_num_batched_tokens (used when the serve args leave them out) go by the GPU's name and
    memory, but vLLM checks ``current_platform.is_cpu()`` last and would give this CPU's tier
    (128 sequences, 2048 tokens) instead of the target's (1024 and 8192 on an H200).  The
    platform reads as CUDA for that one call only."""
    from vllm.platforms import PlatformEnum, current_platform

    def target(cls, *args, **kwargs):
        own = "_enum" in vars(current_platform)
        saved = current_platform._enum
        current_platform._enum = PlatformEnum.CUDA
        try:
            return batch_defaults(cls, *args, **kwargs)
        finally:
            if own:
                current_platform._enum = saved
            else:
                del current_platform._enum
    return target


def _engine_config(hf_config: dict[str, Any], serve_args: dict[str, Any], model_dir: str):
    """``vllm serve model_dir <flags>``'s engine config."""
    import argparse

    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from cachebake.vllm.serveargs import BAKE_ONLY, serve_args_to_flags, validate_serve_args

    validate_serve_args(serve_args)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(hf_config, f)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    flags = serve_args_to_flags({**BAKE_ONLY, **serve_args})
    try:
        ns = parser.parse_args(["--model", model_dir, *flags])
        engine_args = EngineArgs.from_cli_args(argparse.Namespace(**vars(ns)))
        return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except SystemExit as e:  # argparse's way to refuse a flag
        raise BadInput(f"vLLM refuses these serve args: {' '.join(flags)}") from e
    except (ValueError, TypeError, AssertionError) as e:
        raise BadInput(f"vLLM refuses this configuration: {one_line(e)}") from e


def one_line(e: BaseException) -> str:
    return shorten(" ".join(str(e).split()), 400, keep=400, mark="") or type(e).__name__


_DIST_INIT = False


@contextlib.contextmanager
def _tp_rank_zero(vllm_config) -> Iterator[None]:
    """Make this process TP rank 0 of a group of the planned size.

    Layers read their TP size from vLLM's TP group, when built and when asked for their state
    shapes; a one-process gloo group stands in, told the planned size.  Nothing communicates:
    the model lives on the ``meta`` device."""
    global _DIST_INIT
    import vllm.distributed.parallel_state as ps
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vllm_config):
        if not _DIST_INIT:
            ps.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method=f"file://{tempfile.mktemp(prefix='cachebake-plan-')}")
            ps.initialize_model_parallel(1, 1)
            _DIST_INIT = True

    class _RankZero:
        def __init__(self, real, size):
            self._real, self.world_size, self.rank_in_group = real, size, 0

        def __getattr__(self, name):
            return getattr(self._real, name)

    real_tp = ps._TP
    ps._TP = _RankZero(real_tp, vllm_config.parallel_config.tensor_parallel_size)
    try:
        yield
    finally:
        ps._TP = real_tp


def _instantiate_model(vllm_config):
    """The model on the ``meta`` device (inside ``_tp_rank_zero``): the engine's own layers,
    nothing allocated."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models import ModelRegistry
    from vllm.utils.torch_utils import set_default_torch_dtype

    mc = vllm_config.model_config
    model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
    try:
        with set_current_vllm_config(vllm_config), set_default_torch_dtype(mc.dtype), \
                torch.device("meta"):
            model = model_cls(vllm_config=vllm_config, prefix="")
    except (AssertionError, ValueError) as e:  # the layers' own checks (e.g. TP vs groups)
        raise BadInput(f"vLLM's {mc.architecture} refuses this configuration: {one_line(e)}") from e
    return model_cls, model
