"""The CPU quick start's warmup (README, "Quick start on a CPU"): two small real Triton kernels,
compiled ahead of time for a GPU target, on a machine with no GPU.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs Triton's whole
compiler, ptxas included, and writes the same cache entries (key dir, cubin, metadata, group
file) as the first launch of that specialization on an sm_90 GPU.  So a ``cachebake build``
whose warmup is this module bakes a real cache anywhere, and ``cachebake verify`` with it
against the installed bake sees hits where the bake covered the specialization and a compile
where it did not (``--block`` something new).

    cachebake build --target sm_90 --out DIR -- python3 -m cachebake.drivers.example_warmup
    cachebake verify --cache INSTALLED -- python3 -m cachebake.drivers.example_warmup --block 64

It needs Triton (the ``triton`` extra) and nothing else: no torch, no GPU, no CUDA driver.
"""

from __future__ import annotations

import argparse
import sys

# Specializations a server would launch: (kernel, dtype, BLOCK); --block replaces the BLOCKs.
DEFAULT_BLOCKS = (256, 1024)
DTYPES = ("fp32", "fp16")


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)

    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)

    return add_kernel, scale_kernel


def compile_all(target: str, blocks=DEFAULT_BLOCKS) -> list[str]:
    """Compile each kernel at each dtype and BLOCK for ``target``; return what was compiled."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from cachebake.gpu import GPUTargetSpec

    spec = GPUTargetSpec.parse(target)
    gpu = GPUTarget(spec.backend, spec.arch, spec.warp_size)
    add_kernel, scale_kernel = _kernels()
    done = []
    for block in blocks:
        for dtype in DTYPES:
            ptr = f"*{dtype}"
            compile(ASTSource(add_kernel, {"x_ptr": ptr, "y_ptr": ptr, "out_ptr": ptr, "n": "i32",
                                           "BLOCK": "constexpr"}, constexprs={"BLOCK": block}), target=gpu)
            compile(ASTSource(scale_kernel, {"x_ptr": ptr, "out_ptr": ptr, "n": "i32", "alpha": "fp32",
                                             "BLOCK": "constexpr"}, constexprs={"BLOCK": block}), target=gpu)
            done.append(f"add_kernel, scale_kernel [{dtype}, BLOCK={block}]")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m cachebake.drivers.example_warmup",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="sm_90", help="GPU target to compile for (default sm_90)")
    parser.add_argument("--block", type=int, action="append",
                        help=f"a BLOCK size to compile (repeatable; default {', '.join(map(str, DEFAULT_BLOCKS))})")
    args = parser.parse_args(argv)
    blocks = tuple(args.block) if args.block else DEFAULT_BLOCKS
    if any(b < 16 or b > 4096 or b & (b - 1) for b in blocks):
        parser.error("--block must be a power of 2 from 16 to 4096")
    for line in compile_all(args.target, blocks):
        print(f"compiled {line} for {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
