"""Kernels for the record/replay tests, importable by name (``replay_kernels``) from tests/.

Importing this module reads TRITON_CACHE_AUTOTUNING (Triton reads it when @autotune runs), so
set it first where autotune results should be written.
"""

import triton
import triton.language as tl

from aot_kernels import add_kernel  # noqa: F401 - recorded by its defining module's name


@triton.jit
def square(x):
    return x * x


@triton.jit
def map_kernel(x_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, FN(tl.load(x_ptr + offs, mask=mask)), mask=mask)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 64}, num_warps=2),
        triton.Config({"BLOCK": 128}, num_warps=4),
        triton.Config({"BLOCK": 256}, num_warps=4, num_stages=2),
    ],
    key=["n"],
)
@triton.jit
def tuned_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)
