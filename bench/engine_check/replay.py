#!/usr/bin/env python3
"""Launch recorded engine traces on a GPU with vLLM's Mamba2 ops and count what compiles.

The independent check of a bake: record_trace.py recorded, with vLLM's own scheduler, metadata
builder and MambaMixer2, every Mamba2 op call a server makes at start-up and under traffic;
this script makes each call again on the GPU, every tensor at the recorded dtype, shape,
strides and storage offset (so at the same 16-byte alignment: checked), integer tensors with
the recorded values.  It imports torch, Triton and ``vllm.model_executor.layers.mamba.ops``
(a full vllm or the ops-only extract), nothing of cachebake.

    TRITON_CACHE_DIR=... python3 bench/engine_check/replay.py T1.json.gz [T2.json.gz ...] --out R.json

Counts, through Triton's compilation listener, every real compile (cache_hit False) and every
cache hit, per kernel and per recorded step; new autotune results and launcher builds in
TRITON_CACHE_DIR; and calls that failed (on a read-only cache a compile raises
PermissionError).  Prints one JSON line; exit 0 when nothing compiled or failed, 8 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def _files(cache: str | None, suffix: str) -> set[str]:
    if not cache or not Path(cache).is_dir():
        return set()
    return {str(p) for p in Path(cache).rglob(f"*{suffix}")}


class Materializer:
    """Recorded arguments as tensors on ``device``.  ``fill``: float tensors get random
    values (on a GPU: the kernels compute on something finite); integer tensors always get
    the recorded values."""

    def __init__(self, torch, device, fill: bool = True):
        self.torch, self.device, self.fill = torch, device, fill

    def tensor(self, rec: dict):
        torch = self.torch
        dtype = getattr(torch, rec["tensor"])
        item = torch.empty(0, dtype=dtype).element_size()
        nbytes = max(rec["storage"], item)
        raw = torch.empty(nbytes - nbytes % item, dtype=torch.int8, device=self.device)
        flat = raw.view(dtype)
        if dtype.is_floating_point:
            if self.fill:
                flat.normal_()
        else:
            flat.zero_()
        t = flat.as_strided(rec["shape"], rec["stride"], rec["offset"])
        if t.data_ptr() % 16 != rec["align16"]:
            raise AssertionError(f"alignment {t.data_ptr() % 16} != recorded {rec['align16']}")
        if rec.get("values") is not None and t.numel():
            t.copy_(torch.tensor(rec["values"], dtype=dtype).view(rec["shape"]))
        return t

    def value(self, v):
        if isinstance(v, dict):
            if "tensor" in v:
                return self.tensor(v)
            if "dtype" in v:
                return getattr(self.torch, v["dtype"])
            if "seq" in v:
                items = [self.value(x) for x in v["seq"]]
                return tuple(items) if v["kind"] == "tuple" else items
            if "dict" in v:
                keys = v.get("keys") or ["str"] * len(v["dict"])
                return {(int(k) if kind == "int" else k): self.value(x)
                        for (k, x), kind in zip(v["dict"].items(), keys)}
            if "object" in v:
                return SimpleNamespace(**{k: self.value(x) for k, x in v["object"].items()})
        return v


def load_ops():
    """vLLM's Mamba2 ops, by the names record_trace.py records (the SSU as the Triton backend
    calls it: vllm's ssu_dispatch.TritonSSUBackend adds the stochastic-rounding options)."""
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update
    from vllm.model_executor.layers.mamba.ops.ssd_checkpoint import store_prefill_checkpoint
    from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen

    return {"causal_conv1d_fn": causal_conv1d_fn, "causal_conv1d_update": causal_conv1d_update,
            "mamba_chunk_scan_combined_varlen": mamba_chunk_scan_combined_varlen,
            "selective_state_update": selective_state_update,
            "store_prefill_checkpoint": store_prefill_checkpoint}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--out", default=None, help="write the result JSON here too")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    import torch
    import triton

    compiles = collections.Counter()
    hits = collections.Counter()
    by_step: dict[str, list[str]] = collections.defaultdict(list)
    current = {"label": "-"}

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        name = metadata.get("name", "?") if isinstance(metadata, dict) else "?"
        if cache_hit:
            hits[name] += 1
        else:
            compiles[name] += 1
            by_step[current["label"]].append(name)

    triton.knobs.compilation.listener = listener
    cache = os.environ.get("TRITON_CACHE_DIR")
    autotune_before, so_before = _files(cache, ".autotune.json"), _files(cache, ".so")
    ops = load_ops()
    mat = Materializer(torch, torch.device("cuda"))
    failures: list[dict] = []
    n_steps = n_calls = 0
    per_trace = []
    for path in args.traces:
        with gzip.open(path, "rt") as f:
            trace = json.load(f)
        extra = {"enable_stochastic_rounding": trace["ops"]["enable_stochastic_rounding"],
                 "cache_philox_rounds": trace["ops"]["stochastic_rounding_philox_rounds"]}
        before = sum(compiles.values())
        for step in trace["steps"]:
            current["label"] = f"{trace['recipe']}:{step['label']}"
            for call in step["calls"]:
                kwargs = {k: mat.value(v) for k, v in call["args"].items()}
                if call["op"] == "selective_state_update":
                    kwargs.update(extra)
                try:
                    ops[call["op"]](**kwargs)
                    torch.cuda.synchronize()
                except Exception as e:  # a compile on a read-only cache raises here
                    failures.append({"step": current["label"], "op": call["op"],
                                     "error": f"{type(e).__name__}: {str(e)[:200]}"})
                n_calls += 1
            n_steps += 1
        per_trace.append({"trace": Path(path).name, "recipe": trace["recipe"], "plan": trace["plan_key"],
                          "steps": len(trace["steps"]), "compiles": sum(compiles.values()) - before})
    result = {
        "traces": per_trace, "steps": n_steps, "calls": n_calls,
        "compiles": sum(compiles.values()), "cache_hits": sum(hits.values()),
        "autotune_new": len(_files(cache, ".autotune.json") - autotune_before),
        "helper_builds_new": len(_files(cache, ".so") - so_before),
        "failures": len(failures), "failure_examples": failures[:5],
        "compiles_by_kernel": dict(sorted(compiles.items())),
        "compiles_by_step": {k: v for k, v in list(by_step.items())[:40]},
        "uid": os.getuid(), "wall_s": round(time.perf_counter() - t_start, 2),
    }
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line, flush=True)
    clean = not (result["compiles"] or result["autotune_new"] or result["helper_builds_new"] or failures)
    return 0 if clean else 8


if __name__ == "__main__":
    sys.exit(main())
