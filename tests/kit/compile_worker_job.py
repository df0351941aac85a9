"""Run by Inductor's compile workers in tests/test_capture_compile_workers.py: an ahead-of-time
Triton compile for sm_90 (no GPU needed), as Inductor's workers run ``triton.compile``."""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def worker_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


def compile_in_worker(block: int) -> int:
    src = ASTSource(worker_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                                    "BLOCK": "constexpr"}, {"BLOCK": block})
    triton.compile(src, target=GPUTarget("cuda", 90, 32))
    return os.getpid()


def main() -> None:
    """In the parent: start Inductor's worker pool and compile there."""
    import json

    from torch._inductor.async_compile import AsyncCompile

    pool = AsyncCompile.process_pool()
    pids = [pool.submit(compile_in_worker, b).result() for b in (64, 128)]
    print("RESULT " + json.dumps({"parent": os.getpid(), "workers": pids,
                                  "pool": type(pool).__name__}))


if __name__ == "__main__":
    main()
