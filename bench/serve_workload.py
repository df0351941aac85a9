#!/usr/bin/env python3
"""A small serving workload on a CUDA GPU for the serve-time miss proof (bench/gpu_serve_miss.sh).

Two kernels launched the way a server launches them, through Triton's JIT: a plain
``@triton.jit`` one (``add_kernel``) and an ``@triton.autotune`` one (``scale_kernel``, three
candidate configs keyed by ``n``), for each ``--dtypes`` x ``--sizes``.  A dtype the bake never
saw is a new specialization of both kernels (compiles, an autotune benchmark, candidates
compiled); a size it never saw is a new autotune key only (a benchmark, no compile).  Results
are checked against torch.  Prints one JSON line: real compiles, file-cache hits and autotune
benchmarks seen in this process, and whether every result was right.

    python3 bench/serve_workload.py --dtypes fp32,fp16 --sizes 4096
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

# The kernels live in a module of their own: a miss names the kernel by module and qualified
# name, and a script's kernels are __main__'s, which no fold-back can import.
from serve_kernels import add_kernel, scale_kernel

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp32,fp16")
    ap.add_argument("--sizes", default="4096")
    a = ap.parse_args()
    seen = {"compiles": [], "hits": 0, "autotune_benchmarks": 0}

    previous = triton.knobs.compilation.listener  # chain: cachebake's monitor / miss log

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        if cache_hit:
            seen["hits"] += 1
        else:
            seen["compiles"].append(metadata.get("name"))
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)

    triton.knobs.compilation.listener = listener
    t0 = time.monotonic()
    ok = True
    for dname in a.dtypes.split(","):
        for n in map(int, a.sizes.split(",")):
            x = torch.randn(n, device="cuda", dtype=DTYPES[dname])
            y = torch.randn(n, device="cuda", dtype=DTYPES[dname])
            out = torch.empty_like(x)
            add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
            ok &= torch.allclose(out, x + y)
            before = getattr(scale_kernel, "bench_time", None)
            scale_kernel.bench_time = None
            scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 2.0)
            if scale_kernel.bench_time is not None:  # set only when configs were benchmarked
                seen["autotune_benchmarks"] += 1
            scale_kernel.bench_time = before
            ok &= torch.allclose(out, x * 2.0)
    torch.cuda.synchronize()
    print(json.dumps({"ok": bool(ok), "seconds": round(time.monotonic() - t0, 3), **seen}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
