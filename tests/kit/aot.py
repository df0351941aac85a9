"""Real Triton cache entries without a GPU: ahead-of-time compiles for a target.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs the whole compiler
(ptxas included) on a CPU machine and writes exactly the cache entries a launch on an sm_90 GPU
would write and read (shared/FACTS.md, "Compiling without a GPU").  Tests and benchmarks use
these as their caches.  Each compile runs in a subprocess so TRITON_CACHE_DIR is read fresh
and in-memory caches do not hide disk hits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    if SQUARE:
        x = x * x
    tl.store(out_ptr + offs, x * alpha, mask=m)


@triton.jit
def rowsum_kernel(x_ptr, out_ptr, stride, N: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, N)
    tl.store(out_ptr + row, tl.sum(tl.load(x_ptr + row * stride + offs), axis=0))


@triton.jit
def clamp_kernel(x_ptr, out_ptr, n, LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    # a float constexpr, as vLLM's _chunk_cumsum_fwd_kernel takes dt_max=inf
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.minimum(tl.load(x_ptr + offs, mask=m), LIMIT), mask=m)


KERNELS = {"add_kernel": add_kernel, "scale_kernel": scale_kernel, "rowsum_kernel": rowsum_kernel,
           "clamp_kernel": clamp_kernel}

# (kernel, signature, constexprs, attrs, options): several kernels, several specializations
# of one kernel (constexprs, dtypes, divisibility attrs, num_warps), as a sweep would produce.
SPECS = [
    ("add_kernel", {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
     {"BLOCK": 1024}, {}, {}),
    ("add_kernel", {"x_ptr": "*fp16", "y_ptr": "*fp16", "out_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr"},
     {"BLOCK": 512}, {}, {"num_warps": 8}),
    ("scale_kernel", {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "alpha": "fp32", "BLOCK": "constexpr",
                      "SQUARE": "constexpr"}, {"BLOCK": 256, "SQUARE": True}, {}, {}),
    ("scale_kernel", {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32", "BLOCK": "constexpr",
                      "SQUARE": "constexpr"}, {"BLOCK": 256, "SQUARE": False},
     {"x_ptr": [["tt.divisibility", 16]], "out_ptr": [["tt.divisibility", 16]]}, {}),
    ("rowsum_kernel", {"x_ptr": "*fp32", "out_ptr": "*fp32", "stride": "i32", "N": "constexpr"},
     {"N": 128}, {}, {"num_warps": 2}),
]




def compile_spec(spec, target=("cuda", 90, 32)):
    """Compile one spec in this process; returns the CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, signature, constexprs, attrs, options = spec
    fn = KERNELS[name]
    # ASTSource wants attrs keyed by argument index tuples, as the JIT passes them.
    index = {a: (i,) for i, a in enumerate(fn.arg_names)}
    src = ASTSource(fn, signature, constexprs={index[k]: v for k, v in constexprs.items()},
                    attrs={index[k]: v for k, v in attrs.items()})
    return triton.compile(src, target=GPUTarget(*target), options=options or None)


_CHILD = r"""
import json, sys
sys.path.insert(0, {tests!r})
import triton, aot
events = []
triton.knobs.compilation.listener = lambda src, metadata, metadata_group, times, cache_hit: events.append(
    {{"name": src.fn.__name__ if hasattr(src, "fn") else str(src), "cache_hit": cache_hit}})
for spec in json.loads({specs!r}):
    aot.compile_spec(spec, target=tuple({target!r}))
print(json.dumps(events))
"""


def compile_in_subprocess(cache_dir: os.PathLike | str, specs=SPECS, target=("cuda", 90, 32),
                          extra_env: dict | None = None) -> list[dict]:
    """AOT-compile ``specs`` in a fresh process with TRITON_CACHE_DIR=cache_dir.

    Returns the listener's events: one per compile() with its ``cache_hit``.
    """
    code = _CHILD.format(tests=str(Path(__file__).parent), specs=json.dumps(specs), target=list(target))
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache_dir), **(extra_env or {})}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"AOT compile failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_autotune_result(cache_dir: os.PathLike | str, kernel: str = "add_kernel",
                          tuning_key=(4096, "torch.float32"), target=("cuda", 90, 32)) -> Path:
    """Write an autotune result exactly where and how Triton 3.6's Autotuner.check_disk_cache
    does (runtime/autotuner.py), with the key computed for ``target`` instead of the active
    driver: benchmarking itself needs a GPU, the file format and key do not."""
    import hashlib

    from triton import Config
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import FileCacheManager, triton_key

    fn = KERNELS[kernel]
    configs = [Config({"BLOCK": 256}, num_warps=4), Config({"BLOCK": 1024}, num_warps=8)]
    key = [triton_key(), make_backend(GPUTarget(*target)).hash(), fn.cache_key,
           str(sorted(get_cache_invalidating_env_vars().items())), str(tuple(tuning_key))] + [str(c) for c in configs]
    key = hashlib.sha256("-".join(key).encode("utf-8")).hexdigest()
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    try:
        mgr = FileCacheManager(key)
        timings = [(configs[0].__dict__, [0.031, 0.030, 0.033]), (configs[1].__dict__, [0.022, 0.021, 0.024])]
        path = mgr.put(json.dumps({"key": list(tuning_key), "configs_timings": timings}),
                       f"{fn.__name__[:150]}.autotune.json", binary=False)
    finally:
        del os.environ["TRITON_CACHE_DIR"]
    return Path(path)


# -- capture/build tests: compiles in this process, into the current TRITON_CACHE_DIR ----------

ADD_SIGNATURE = SPECS[0][1]
SCALE_SIGNATURE = SPECS[3][1]
_DEFAULT_CONSTEXPRS = {"add_kernel": {"BLOCK": 128}, "scale_kernel": {"BLOCK": 128, "SQUARE": False},
                       "rowsum_kernel": {"N": 128}, "clamp_kernel": {"LIMIT": float("inf"), "BLOCK": 128}}
_DEFAULT_SIGNATURES = {"add_kernel": ADD_SIGNATURE, "scale_kernel": SCALE_SIGNATURE,
                       "rowsum_kernel": SPECS[4][1],
                       "clamp_kernel": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                                        "LIMIT": "constexpr", "BLOCK": "constexpr"}}


def aot_compile(cache_dir, kernel=add_kernel, signature=None, constexprs=None,
                target=("cuda", 90, 32), options=None):
    """Compile ``kernel`` for ``target`` in this process into ``cache_dir`` (None: whatever
    TRITON_CACHE_DIR says) and return the CompiledKernel.  ``constexprs`` override the
    kernel's defaults (BLOCK=128, ...)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name = kernel.__name__
    signature = signature or _DEFAULT_SIGNATURES[name]
    constexprs = {**_DEFAULT_CONSTEXPRS[name], **(constexprs or {})}
    if cache_dir is not None:
        triton.knobs.cache.dir = os.fspath(cache_dir)
    src = ASTSource(kernel, signature, constexprs=constexprs, attrs={})
    return triton.compile(src, target=GPUTarget(*target), options=options)


def compile_round(blocks=(128,), kernel="add_kernel"):
    """One warmup round for an InProcessDriver: compile ``kernel`` at each BLOCK."""
    for block in blocks:
        aot_compile(None, KERNELS[kernel], constexprs={"BLOCK": block})
