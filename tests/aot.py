"""Real Triton cache entries without a GPU: a few small @triton.jit kernels and an
ahead-of-time compile that writes them into a cache directory, exactly as a launch on an H100
or H200 (sm_90) would (FACTS.md, "Compiling without a GPU").
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)


ADD_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                 "BLOCK": "constexpr"}
SCALE_SIGNATURE = {"x_ptr": "*fp16", "out_ptr": "*fp16", "n": "i32", "alpha": "fp32",
                   "BLOCK": "constexpr"}


def aot_compile(cache_dir, kernel=add_kernel, signature=None, constexprs=None,
                target=("cuda", 90, 32), options=None):
    """Compile ``kernel`` for ``target`` into ``cache_dir`` (None: the current
    TRITON_CACHE_DIR / knob) and return the CompiledKernel."""
    if signature is None:
        signature = ADD_SIGNATURE if kernel is add_kernel else SCALE_SIGNATURE
    if constexprs is None:
        constexprs = {"BLOCK": 128}
    if cache_dir is not None:
        triton.knobs.cache.dir = os.fspath(cache_dir)
    src = ASTSource(kernel, signature, constexprs=constexprs, attrs={})
    return triton.compile(src, target=GPUTarget(*target), options=options)


def compile_round(blocks=(128,), kernel="add_kernel"):
    """One warmup round for an InProcessDriver: AOT-compile ``kernel`` at each BLOCK into
    the current TRITON_CACHE_DIR."""
    fn = {"add_kernel": add_kernel, "scale_kernel": scale_kernel}[kernel]
    for block in blocks:
        aot_compile(None, fn, constexprs={"BLOCK": block})
