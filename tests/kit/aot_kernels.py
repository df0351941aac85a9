"""Compile a few real Triton kernels for sm_90 without a GPU and report hits and misses.

Run as a script in a fresh process (TRITON_CACHE_DIR is read when Triton starts):
    TRITON_CACHE_DIR=... python tests/kit/aot_kernels.py  ->  {"hits": n, "misses": n, "keys": [...]}
The tests bake with it, then run it again against an installed cache: same kernels, same
signature/constexprs/attrs/target, so every compile must be a cache hit.

``--visible-gpu``: compile for the GPU nvidia-smi reports (its compute capability), as Triton
compiles for the GPU its driver reports on a real node; the bake Job's play
(tests/test_distribute_bakejob.py) gives each Pod the nvidia-smi of its stand-in node.
"""

import json
import subprocess
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)


SPECS = [
    (add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128}),
    (add_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "out_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 256}),
    (scale_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32", "BLOCK": "constexpr"}, {"BLOCK": 64}),
]


def visible_target() -> GPUTarget:
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True, check=True, timeout=20).stdout
    major, minor = out.strip().splitlines()[0].strip().split(".")
    return GPUTarget("cuda", int(major) * 10 + int(minor), 32)


def main() -> None:
    target = visible_target() if sys.argv[1:] == ["--visible-gpu"] else GPUTarget("cuda", 90, 32)
    seen = []
    previous = triton.knobs.compilation.listener  # e.g. cachebake's monitor under build/verify

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        seen.append(bool(cache_hit))
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)

    triton.knobs.compilation.listener = listener
    keys = []
    for fn, sig, consts in SPECS:
        k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs={}), target=target)
        keys.append(k.hash)
    json.dump({"hits": seen.count(True), "misses": seen.count(False), "keys": keys}, sys.stdout)


if __name__ == "__main__":
    main()
