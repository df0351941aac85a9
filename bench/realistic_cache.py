"""Build a realistic Triton cache on a CPU machine: hundreds of real sm_90 compiles.

Kernels of the shapes a Mamba2 model compiles (tiled matmuls with tl.dot, reductions,
elementwise with masks), each at many specializations (block sizes, dtypes, num_warps,
num_stages), compiled ahead of time with triton.compile(target=GPUTarget("cuda", 90, 32)).
Every entry is a genuinely different compile, so compression ratios are honest (copies of one
entry would flatter zstd's long-distance matching).  Reused across runs from CACHE_DIR.

    python3 bench/realistic_cache.py [CACHE_DIR] [--jobs 2]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import triton
import triton.language as tl

DEFAULT_DIR = Path(os.environ.get("CACHEBAKE_BENCH_CACHE", "/tmp/cachebake-bench/triton"))


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ACT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    if ACT == 1:
        acc = acc * tl.sigmoid(acc)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def rmsnorm_gated_kernel(x_ptr, z_ptr, w_ptr, out_ptr, stride, N, eps, BLOCK: tl.constexpr, HAS_Z: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + row * stride + cols, mask=m, other=0.0).to(tl.float32)
        x = x * z * tl.sigmoid(z)
    var = tl.sum(x * x, axis=0) / N
    y = x / tl.sqrt(var + eps) * tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def specs():
    out = []
    for dt, (bm, bn, bk), warps, stages, act in itertools.product(
            ["fp16", "bf16"], [(64, 64, 32), (64, 128, 32), (128, 64, 64), (128, 128, 32), (32, 64, 64)],
            [4, 8], [2, 3, 4], [0, 1]):
        sig = {"a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "c_ptr": f"*{dt}", "M": "i32", "N": "i32", "K": "i32",
               "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32",
               "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "ACT": "constexpr"}
        out.append(("matmul_kernel", sig, {"BM": bm, "BN": bn, "BK": bk, "ACT": act},
                    {"num_warps": warps, "num_stages": stages}))
    for dt, block, has_z, warps in itertools.product(["fp16", "bf16", "fp32"], [256, 512, 1024, 2048, 4096, 8192],
                                                     [False, True], [4, 8]):
        sig = {"x_ptr": f"*{dt}", "z_ptr": f"*{dt}", "w_ptr": f"*{dt}", "out_ptr": f"*{dt}", "stride": "i32",
               "N": "i32", "eps": "fp32", "BLOCK": "constexpr", "HAS_Z": "constexpr"}
        out.append(("rmsnorm_gated_kernel", sig, {"BLOCK": block, "HAS_Z": has_z}, {"num_warps": warps}))
    return out


def _compile(args):
    cache_dir, spec = args
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, sig, constexprs, options = spec
    fn = globals()[name]
    index = {a: (i,) for i, a in enumerate(fn.arg_names)}
    src = ASTSource(fn, sig, constexprs={index[k]: v for k, v in constexprs.items()}, attrs={})
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return name


def build(cache_dir: Path = DEFAULT_DIR, jobs: int = 2) -> Path:
    cache_dir = Path(cache_dir)
    marker = cache_dir.parent / f".{cache_dir.name}.complete"  # outside the cache: pack would ship it
    if marker.exists():
        return cache_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(_compile, [(cache_dir, s) for s in specs()], chunksize=4))
    marker.write_text("")
    return cache_dir


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cache_dir", nargs="?", default=str(DEFAULT_DIR))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    d = build(Path(a.cache_dir), a.jobs)
    files = [p for p in d.rglob("*") if p.is_file()]
    print(f"{d}: {len([p for p in d.iterdir() if p.is_dir()])} key dirs, {len(files)} files, "
          f"{sum(p.stat().st_size for p in files) / 1e6:.1f} MB")
    sys.exit(0)
