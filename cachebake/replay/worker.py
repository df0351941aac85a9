"""Compile one record entry for a target: the code that runs in replay's worker processes.

The inputs of ``triton.compile`` are rebuilt from the entry as Triton 3.6's JIT builds them for
a launch (cachebake.capture.keys).  Given those, ``triton.compile(src, target=...)`` writes the
entry under the key a launch on that target computes, with no GPU and no libcuda.

What a worker trusts: nothing in the entry.  It runs with this process's own environment (a
record's variables are compared with Triton's view of it, never applied: they would reach
LLVM, gcc, ld and ptxas), imports only modules its ``ModuleAllowlist`` allows, and compiles
only entries whose options pass the allowlist (cachebake.capture.keys ``entry_problems``, checked
again here whoever submitted the entry).

Launcher helpers: ``cuda_utils`` and ``__triton_launcher`` are C sources Triton builds with
gcc and caches under ``sha256(source + platform)`` (runtime/build.py
``compile_module_from_src``); the source depends on the signature and constants, never on the
GPU.  ``build_helper`` builds and stores them the same way but does not load them (loading
needs libcuda).  Linking wants a ``libcuda.so.1``; where none is installed a stub with that
soname stands in: the helper only records the dependency, the real library is bound when a
server loads it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from cachebake.capture.keys import (ModuleAllowlist, ReplayProblem, autotune_result_hash,
                                    build_source, compile_options, config_text, entry_problems,
                                    env_problem, kernel_problem, make_config, option_problems,
                                    resolve_kernel, target_of)
from cachebake.capture.record import AutotuneSpec, CompileSpec, shown


def check_env(spec_env: dict) -> None:
    """ReplayProblem unless Triton reads, in this process, the cache-invalidating variables the
    entry was recorded under."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    problem = env_problem(spec_env, dict(get_cache_invalidating_env_vars()))
    if problem:
        raise ReplayProblem(problem)


# -- what a worker process runs ----------------------------------------------------------------

def init_worker(cache_dir: str) -> None:
    """Pool initializer, before Triton reads its knobs: the fresh cache, written by Triton's own
    file manager whatever manager the caller's environment names (a replay run where ``install
    --overlay``'s variables are set would otherwise send every entry to that overlay, not into
    ``cache_dir``).  Nothing else of the environment changes: a record's variables are never
    applied.  The worker's stdout goes to stderr: the caller's stdout may be one JSON document
    (``--json``), and an imported kernel module or Triton may print.

    Ctrl-C is the parent's to handle (it stops the workers and says what was done): a worker
    starts with SIGINT blocked (``engine._sigint_blocked``), ignores it here, then unblocks it,
    dropping one that arrived while it started.  SIGTERM keeps its default: the parent's way
    to stop a worker, silently."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ.pop("TRITON_CACHE_MANAGER", None)
    os.dup2(2, 1)


def compile_job(spec_dict: dict, target_text: str, allowed_modules: list[str]) -> dict:
    """Compile one entry for ``target_text``; a plain dict back (it crosses processes).
    ``allowed_modules``: the whole allowlist (``ModuleAllowlist.names``) the caller checked."""
    t0 = time.monotonic()
    spec = CompileSpec.from_dict(spec_dict)
    allowed = ModuleAllowlist(allowed_modules, defaults=False)
    out = {"spec_id": spec.spec_id(), "label": spec.label(), "kernel": spec.kernel.label}
    try:
        import triton

        problems = entry_problems(spec, allowed)
        if problems:
            raise ReplayProblem("; ".join(problems))
        check_env(spec.env_vars)
        target = target_of(target_text)
        fn = resolve_kernel(spec.kernel, allowed)
        src = build_source(spec, fn, allowed)
        events = []
        triton.knobs.compilation.listener = (
            lambda *, src, metadata, metadata_group, times, cache_hit: events.append(cache_hit))
        kernel = triton.compile(src, target=target, options=compile_options(spec))
        out.update(ok=True, hash=kernel.hash, cache_hit=bool(events and events[-1]),
                   launcher=launcher_source(src, kernel.metadata))
    except ReplayProblem as e:
        out.update(ok=False, problem=str(e))
    except Exception as e:  # a compile error for this target: reported with the entry
        first = (str(e).strip().splitlines() or [""])[0]
        out.update(ok=False, problem=f"{spec.kernel.label}: compile failed for {target_text}: "
                                     f"{type(e).__name__}: {shown(first, 300)}")
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def autotune_job(spec_dict: dict, target_text: str, allowed_modules: list[str]) -> dict:
    """Write a recorded autotune result where this Triton looks for it on ``target_text``
    (the recorded target only: timings from another GPU would pick wrong configs)."""
    import json

    from triton.runtime.cache import get_cache_manager

    spec = AutotuneSpec.from_dict(spec_dict)
    allowed = ModuleAllowlist(allowed_modules, defaults=False)
    try:
        problem = kernel_problem(spec.kernel, allowed)
        if problem:
            raise ReplayProblem(problem)
        check_env(spec.env_vars)
        fn = resolve_kernel(spec.kernel, allowed)
        for c in spec.configs:
            bad = option_problems({"num_warps": c.num_warps, "num_stages": c.num_stages,
                                   "num_ctas": c.num_ctas, "maxnreg": c.maxnreg})
            if bad:
                raise ReplayProblem(f"{spec.kernel.label}: a config's {'; '.join(bad)}")
            if c.text and config_text(c, allowed) != c.text:
                raise ReplayProblem(f"{spec.kernel.label}: config {shown(c.text, 120)} does not rebuild exactly")
        key = autotune_result_hash(spec, target_of(target_text), fn, allowed)
        # make_config sets no pre_hook and no ir_override: what Triton reads back is data only
        timings = [(make_config(c, allowed).__dict__, t) for c, t in zip(spec.configs, spec.timings or [])]
        cache = get_cache_manager(key)
        body = json.dumps({"key": _tuning_values(spec.tuning_key), "configs_timings": timings},
                          default=lambda o: None)
        cache.put(body, f"{fn.__name__[:150]}.autotune.json", binary=False)
        return {"ok": True, "kernel": spec.kernel.label, "hash": key}
    except ReplayProblem as e:
        return {"ok": False, "kernel": spec.kernel.label, "problem": str(e)}


def _tuning_values(text: str):
    """The tuning key's values for the file's "key" field (informational: Triton reads only
    configs_timings back)."""
    import ast

    try:
        return list(ast.literal_eval(text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text


def launcher_source(src, metadata) -> str | None:
    """The C source of this kernel's ``__triton_launcher`` (triton/backends/nvidia/driver.py
    CudaLauncher.__init__, without building or loading it); None where Triton builds no
    per-kernel launcher (3.8: CudaLauncher launches through cuda_utils' generic ``launch``,
    and the driver module has no ``make_launcher``)."""
    try:
        from triton.backends.nvidia.driver import make_launcher
    except ImportError:
        return None

    constants = getattr(src, "constants", None) or {}
    arg_idx = lambda x: (src.fn.arg_names.index(x),) if isinstance(x, str) else x  # noqa: E731
    constants = {arg_idx(k): v for k, v in constants.items()}
    signature = dict(src.signature.items())
    return make_launcher(constants, signature, getattr(metadata, "tensordesc_meta", None))


def cuda_utils_source() -> str:
    from triton.backends.nvidia import driver

    return Path(driver.dirname, "driver.c").read_text()


def helper_job(c_source: str, name: str) -> dict:
    """Build one helper into the cache as ``compile_module_from_src`` would (not loaded)."""
    from triton.backends.nvidia import driver
    from triton.runtime.build import _build, platform_key
    from triton.runtime.cache import get_cache_manager

    key = hashlib.sha256((c_source + platform_key()).encode()).hexdigest()
    cache = get_cache_manager(key)
    filename = f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if cache.get_file(filename):
        return {"ok": True, "name": name, "hash": key, "cache_hit": True}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            c_path = os.path.join(tmp, name + ".c")
            Path(c_path).write_text(c_source)
            try:
                libs = driver.library_dirs()
            except Exception:  # no libcuda here: link against a stub of the same soname
                libs = [driver.libdevice_dir, _stub_libcuda(os.path.join(tmp, "stub"), c_path)]
            so = _build(name, c_path, tmp, libs, driver.include_dirs, driver.libraries, [])
            cache.put(Path(so).read_bytes(), filename, binary=True)
    except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
        return {"ok": False, "name": name, "problem": f"building {name} failed: {e}"}
    return {"ok": True, "name": name, "hash": key, "cache_hit": False}


def _stub_libcuda(stub_dir: str, c_path: str) -> str:
    """A ``libcuda.so.1`` to link a helper against where no driver is installed.

    It must define every ``cu*`` symbol the helper calls: gcc links with ``--as-needed`` on
    Debian and Ubuntu, and a stub that defines nothing is dropped, leaving the helper without
    a ``NEEDED libcuda.so.1`` entry.  Such a helper fails to load on the GPU server
    ("undefined symbol: cuFuncSetAttribute"), and Triton rebuilds it at the first launch: seen
    on an H200 with helpers replayed on a CPU machine (bench/RESULTS.md).  At load time the
    real driver's ``libcuda.so.1`` is found by soname; the stub only satisfies the linker."""
    from triton.backends.nvidia import driver

    Path(stub_dir).mkdir(parents=True, exist_ok=True)
    obj = os.path.join(stub_dir, "helper.o")
    includes = [f"-I{d}" for d in driver.include_dirs] + [f"-I{sysconfig.get_paths()['include']}"]
    subprocess.run(["gcc", "-c", "-fPIC", "-w", c_path, "-o", obj, *includes], check=True,
                   capture_output=True)
    undefined = subprocess.run(["nm", "-u", obj], check=True, capture_output=True, text=True).stdout
    symbols = sorted({ln.split()[-1] for ln in undefined.splitlines()
                      if ln.split() and ln.split()[-1].startswith("cu")})
    stub_c = os.path.join(stub_dir, "libcuda_stub.c")
    Path(stub_c).write_text("".join(f"void {sym}(void) {{}}\n" for sym in symbols))
    lib = os.path.join(stub_dir, "libcuda.so.1")
    subprocess.run(["gcc", "-shared", "-fPIC", stub_c, "-o", lib, "-Wl,-soname,libcuda.so.1"],
                   check=True, capture_output=True)
    os.symlink("libcuda.so.1", os.path.join(stub_dir, "libcuda.so"))  # what -lcuda looks for
    return stub_dir
