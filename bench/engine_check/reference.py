"""vLLM's own Mamba2 layer and metadata builder on this CPU, every op call recorded.

The reference for what the engine hands its Mamba2 kernels: the model's real ``MambaMixer2``
(built by vLLM as TP rank 0 of the planned TP group, states carved out of a paged buffer by
vLLM's ``create_kv_cache_views``/``bind_kv_cache``), vLLM's real
``Mamba2AttentionMetadataBuilder`` fed the way Model Runner V2 feeds it, and
``MambaMixer2.conv_ssm_forward`` / ``_warmup_ssd_kernels`` run with the op functions replaced
by recorders.  A record holds, per op call, every argument by name: tensors as dtype, shape,
strides, storage offset, 16-byte pointer alignment and (for integer tensors) values; plain
values as they are.  Nothing is launched: no GPU is needed, only the real ``vllm`` package.

Used by tests/test_vllm_kernels_plan_vllm.py (the kernels driver's calls must equal these) and by
bench/engine_check/record_trace.py (the traces bench/engine_check/replay.py launches on a GPU).
Model Runner V2's input preparation (persistent query_start_loc / seq_lens / block-table
buffers, dummy batches for capture) is mirrored here from vllm/v1/worker/gpu/, written
independently of cachebake's driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any

# Arguments that hold state block ids: their values depend on which blocks a run happened to
# use, never on the engine's layout, so comparisons skip their values.
BLOCK_INDEX_ARGS = {"cache_indices", "conv_state_indices", "state_batch_indices",
                    "dst_state_batch_indices", "final_state_indices", "checkpoint.state_indices"}
# Object arguments: the attributes the ops read from them.
OBJECT_FIELDS = {"metadata": ("nums_dict", "batch_ptr", "token_chunk_offset_ptr"),
                 "checkpoint": ("checkpoint_offsets", "state_indices")}
MAX_VALUES = 1 << 16


def encode(value: Any, name: str = "") -> Any:
    """A JSON-ready description of an op argument."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value
        rec = {"tensor": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
               "stride": list(t.stride()), "offset": t.storage_offset(),
               "storage": t.untyped_storage().nbytes(),
               "align16": (t.data_ptr() % 16) if t.device.type != "meta" else
               (t.storage_offset() * t.element_size()) % 16}
        if not t.is_floating_point() and t.device.type != "meta" and t.numel() <= MAX_VALUES:
            rec["values"] = t.reshape(-1).tolist() if t.dim() else [t.item()]
        return rec
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v, f"{name}.{k}") for k, v in value.items()},
                "keys": [type(k).__name__ for k in value]}
    if isinstance(value, (list, tuple)):
        return {"seq": [encode(v, name) for v in value], "kind": type(value).__name__}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    fields = OBJECT_FIELDS.get(name.split(".")[-1])
    if fields is None:
        raise TypeError(f"cannot encode {name}: {type(value).__name__}")
    return {"object": {f: encode(getattr(value, f), f"{name}.{f}") for f in fields}}


# Where each recorded op is defined.  Signatures come from the source files (parsed, not
# imported): on a CPU platform vLLM rebinds the conv ops to CPU versions with other
# signatures, and the recorded calls must be bound the way the CUDA ops bind them.
OP_SOURCES = {
    "causal_conv1d_fn": "vllm/model_executor/layers/mamba/ops/causal_conv1d.py",
    "causal_conv1d_update": "vllm/model_executor/layers/mamba/ops/causal_conv1d.py",
    "mamba_chunk_scan_combined_varlen": "vllm/model_executor/layers/mamba/ops/ssd_combined.py",
    "selective_state_update": "vllm/model_executor/layers/mamba/ops/ssu_dispatch.py",
    "store_prefill_checkpoint": "vllm/model_executor/layers/mamba/ops/ssd_checkpoint.py",
}


def op_signature(name: str) -> inspect.Signature:
    """The signature of vLLM's op ``name`` as its source defines it (defaults evaluated with
    vLLM's own constants)."""
    import ast
    import importlib.util

    import vllm
    from vllm.v1.attention.backends import utils as attn_utils

    path = importlib.util.find_spec("vllm").submodule_search_locations[0]
    src = open(f"{path}/{OP_SOURCES[name].removeprefix('vllm/')}").read()
    fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = {"PAD_SLOT_ID": attn_utils.PAD_SLOT_ID, "NULL_BLOCK_ID": attn_utils.NULL_BLOCK_ID,
             "float": float}
    args = fn.args
    params = []
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for a, d in zip(positional, defaults):
        params.append(inspect.Parameter(
            a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=inspect.Parameter.empty if d is None else eval(compile(ast.Expression(d), name, "eval"), scope)))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        params.append(inspect.Parameter(
            a.arg, inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if d is None else eval(compile(ast.Expression(d), name, "eval"), scope)))
    del vllm
    return inspect.Signature(params)


class Recorder:
    """Stands in for one op: records the call (arguments bound to the op's signature, with
    defaults) and returns what the op would, shaped as the op shapes it."""

    def __init__(self, name: str, calls: list, result):
        self.name, self.signature, self.calls, self.result = name, op_signature(name), calls, result

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        self.calls.append({"op": self.name,
                           "args": {k: encode(v, k) for k, v in bound.arguments.items()}})
        return self.result(bound.arguments)


def _conv_fn_result(a):
    import torch

    return torch.empty_like(a["x"])


def _scan_result(a):
    import torch

    if a["return_intermediate_states"]:
        nchunks = a["cu_chunk_seqlens"].numel() - 1
        x = a["x"]
        return torch.zeros(nchunks, x.shape[1], x.shape[2], a["B"].shape[-1],
                           dtype=a["state_dtype"] or x.dtype)
    return None


RECORDED_OPS = {  # name in mamba_mixer2's namespace -> what the stand-in returns
    "causal_conv1d_fn": _conv_fn_result,
    "causal_conv1d_update": lambda a: a["x"],  # in place: the op returns its input
    "mamba_chunk_scan_combined_varlen": _scan_result,
    "selective_state_update": lambda a: None,
    "store_prefill_checkpoint": lambda a: None,
}


class ReferenceLayer:
    """One Mamba2 layer of the planned engine, on CPU, recording its op calls."""

    def __init__(self, plan: dict[str, Any], hf_config: dict[str, Any], num_blocks: int = 32):
        import torch
        from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder

        from cachebake.vllm.kernels.plan.engine import engine_session

        self.plan, self.torch = plan, torch
        self._stack = contextlib.ExitStack()
        self.engine = self._stack.enter_context(
            engine_session(hf_config, plan["serve_args"], plan["target"]))
        vc, m = self.engine.vc, self.engine.mixer
        self.vc, self.mixer = vc, m
        # The layer's parameters the kernels read, real CPU tensors (the rest stays on meta).
        def param(t, fill=None):
            out = torch.randn(t.shape, dtype=t.dtype) if fill is None else torch.full(t.shape, fill, dtype=t.dtype)
            return torch.nn.Parameter(out, requires_grad=False)

        m.conv_weights = torch.randn(tuple(m.conv_weights.shape), dtype=m.conv_weights.dtype)
        if m.conv1d.bias is not None:
            m.conv1d.bias = param(m.conv1d.bias)
        m.A, m.D, m.dt_bias = param(m.A, -0.5), param(m.D, 1.0), param(m.dt_bias, 1.0)
        self.num_blocks = num_blocks
        self.kv_config = self.engine.kv_config(num_blocks)
        self.engine.bind_states(self.kv_config, device="cpu")
        self.builder = Mamba2AttentionMetadataBuilder(self.engine.mamba_spec, [m.prefix], vc,
                                                      torch.device("cpu"))
        sched = vc.scheduler_config
        self.max_reqs = sched.max_num_seqs
        self.width = plan["block_table"]["width"]
        # Model Runner V2's persistent input buffers (vllm/v1/worker/gpu/input_batch.py,
        # block_table.py): views of them reach the builder.
        self.qsl_buf = torch.zeros(self.max_reqs + 1, dtype=torch.int32)
        self.seq_lens_buf = torch.zeros(self.max_reqs, dtype=torch.int32)
        self.table_buf = torch.zeros(self.max_reqs, self.width, dtype=torch.int32)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @contextlib.contextmanager
    def _recording(self, calls: list):
        import vllm.model_executor.layers.mamba.mamba_mixer2 as mm

        saved = {name: getattr(mm, name) for name in RECORDED_OPS}
        for name, result in RECORDED_OPS.items():
            setattr(mm, name, Recorder(name, calls, result))
        try:
            yield
        finally:
            for name, real in saved.items():
                setattr(mm, name, real)

    def ssd_warmup(self) -> list[dict]:
        """The profile run: MambaMixer2._warmup_ssd_kernels (attention metadata is None)."""
        torch, m = self.torch, self.mixer
        calls: list[dict] = []
        m._ssd_kernels_warmed_up = False
        projected = torch.empty(self.vc.scheduler_config.max_num_batched_tokens,
                                m.in_proj.output_size_per_partition, dtype=self.vc.model_config.dtype)
        with self._recording(calls):
            m._warmup_ssd_kernels(projected)
        return calls

    def forward(self, rows: list[tuple[int, int, bool]], block_rows: list[list[int]], *,
                capture: bool = False, profiling: bool = False,
                accepted: list[int] | None = None) -> tuple[Any, list[dict]]:
        """One model step through the layer.  ``rows``: (computed, scheduled, prefilling) per
        request in batch order; ``block_rows``: each request's block-table row.  Returns
        vLLM's metadata and the recorded op calls."""
        import numpy as np
        from vllm.forward_context import set_forward_context
        from vllm.v1.attention.backend import CommonAttentionMetadata

        torch, vc = self.torch, self.vc
        n = len(rows)
        sched = [s for _, s, _ in rows]
        num_tokens = sum(sched)
        # prepare_inputs / InputBatch.make_dummy: cumulative starts, the tail = num_tokens.
        qsl = np.zeros(self.max_reqs + 1, dtype=np.int32)
        np.cumsum(sched, out=qsl[1: n + 1])
        qsl[n + 1:] = num_tokens
        self.qsl_buf.copy_(torch.from_numpy(qsl))
        seq = [c + s for c, s, _ in rows]
        self.seq_lens_buf[:n] = torch.tensor(seq, dtype=torch.int32)
        self.seq_lens_buf[n:] = 0
        self.table_buf.zero_()
        for i, r in enumerate(block_rows):
            self.table_buf[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
        cm = CommonAttentionMetadata(
            query_start_loc=self.qsl_buf[: n + 1],
            query_start_loc_cpu=torch.from_numpy(qsl[: n + 1].copy()),
            seq_lens=self.seq_lens_buf[:n],
            num_reqs=n, num_actual_tokens=num_tokens, max_query_len=max(sched),
            max_seq_len=vc.model_config.max_model_len if capture else max(seq),
            block_table_tensor=self.table_buf[:n],
            slot_mapping=torch.zeros(num_tokens, dtype=torch.int64),
            is_prefilling=torch.tensor([p for _, _, p in rows], dtype=torch.bool),
            seq_lens_cpu_upper_bound=torch.tensor(seq, dtype=torch.int32),
        )
        cache = self.plan["cache"]
        vc.cache_config.hash_block_size = None if profiling else cache["hash_block_size"]
        vc.cache_config.cache_hit_alignment_tokens = (None if profiling
                                                      else cache["cache_hit_alignment_tokens"])
        if capture:
            md = self.builder.build_for_cudagraph_capture(cm)
        else:
            kw = {}
            if vc.num_speculative_tokens > 0:  # the model state passes them (ones if new)
                kw["num_accepted_tokens"] = torch.tensor(accepted or [1] * n, dtype=torch.int32)
            md = self.builder.build(0, cm, **kw)
        m = self.mixer
        projected = torch.empty(num_tokens, m.in_proj.output_size_per_partition,
                                dtype=vc.model_config.dtype)  # values never matter: nothing runs
        output = torch.empty(num_tokens, (m.num_heads // m.tp_size) * m.head_dim,
                             dtype=vc.model_config.dtype)
        calls: list[dict] = []
        with self._recording(calls), set_forward_context({m.prefix: md}, vc, num_tokens=num_tokens):
            m.conv_ssm_forward(projected, output)
        return md, calls


def describe_metadata(md) -> dict[str, Any]:
    """vLLM's Mamba2AttentionMetadata, encoded field by field (tensors with layouts)."""
    out = {}
    for f in dataclasses.fields(md):
        v = getattr(md, f.name)
        if f.name in ("nums_dict", "checkpoint_meta", "replayssm_scratch"):
            continue
        out[f.name] = encode(v, f.name)
    return out


# -- comparing two recordings ------------------------------------------------------------------

# What causal_conv1d_fn reads from its metadata object (nums_dict[8] and the pointers).
CONV_META_KEYS = ("tot", "mlist_len", "batch_ptr", "token_chunk_offset_ptr")


def compare_calls(ref: list[dict], got: list[dict]) -> list[str]:
    """Differences between two recordings that a kernel could see: op order, every argument's
    dtype, shape, strides, 16-byte alignment and plain values, integer tensors' values (block
    ids excepted: any valid ids do).  Empty when the calls are the same."""
    diffs: list[str] = []
    if [c["op"] for c in ref] != [c["op"] for c in got]:
        return [f"ops {[c['op'] for c in ref]} != {[c['op'] for c in got]}"]
    for i, (a, b) in enumerate(zip(ref, got)):
        for name in sorted(set(a["args"]) | set(b["args"])):
            if name not in a["args"] or name not in b["args"]:
                diffs.append(f"call {i} {a['op']}: argument {name} only on one side")
                continue
            _compare(a["args"][name], b["args"][name], f"call {i} {a['op']}.{name}", name, diffs)
    return diffs


def _compare(x, y, where: str, name: str, diffs: list[str]) -> None:
    if isinstance(x, dict) and "tensor" in x:
        if not (isinstance(y, dict) and "tensor" in y):
            diffs.append(f"{where}: tensor vs {y!r:.60}")
            return
        for key in ("tensor", "shape", "stride", "align16"):
            if x[key] != y[key]:
                diffs.append(f"{where}: {key} {x[key]} != {y[key]}")
        if name not in BLOCK_INDEX_ARGS and "values" in x and x.get("values") != y.get("values"):
            diffs.append(f"{where}: values differ ({str(x.get('values'))[:60]} vs {str(y.get('values'))[:60]})")
        return
    if isinstance(x, dict) and "object" in x:
        xo, yo = x["object"], (y or {}).get("object", {})
        if "nums_dict" in xo:  # causal_conv1d_fn's metadata
            xn, yn = xo["nums_dict"]["dict"]["8"]["dict"], yo["nums_dict"]["dict"]["8"]["dict"]
            for key in CONV_META_KEYS:
                _compare(xn[key], yn[key], f"{where}.nums_dict[8].{key}", key, diffs)
            for key in ("batch_ptr", "token_chunk_offset_ptr"):
                _compare(xo[key], yo[key], f"{where}.{key}", key, diffs)
        else:
            for key in xo:
                _compare(xo[key], yo.get(key), f"{where}.{key}", f"{name}.{key}", diffs)
        return
    if isinstance(x, dict) and "seq" in x:
        xs, ys = x["seq"], (y or {}).get("seq", [])
        if len(xs) != len(ys):
            diffs.append(f"{where}: {len(xs)} items != {len(ys)}")
        for j, (u, v) in enumerate(zip(xs, ys)):
            _compare(u, v, f"{where}[{j}]", name, diffs)
        return
    if x != y:
        diffs.append(f"{where}: {x!r:.60} != {y!r:.60}")
