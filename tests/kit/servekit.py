"""A stand-in server process for the runtime tests: real Triton compiles for sm_90 (no GPU),
under whatever cache environment the test gives, as a fresh process (as vLLM's workers are).

The child imports nothing of cachebake itself: the layered cache is turned on by environment
only (TRITON_CACHE_MANAGER and CACHEBAKE_OVERLAY_DIR), exactly as ``install --overlay`` hands
it to a server.  It prints one JSON line: per compile, the kernel, whether it was a cache hit,
its key dir and the cubin's bytes' sha256, plus the error if a compile raised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent.parent
# The test modules that define kernels (or import them from their own dir), and so must be
# imported from one place by every process of a session.
KERNEL_MODULES = ("aot.py", "aot_kernels.py", "replay_kernels.py", "compile_worker_job.py",
                  "jit_launch.py")
_KERNELS: list[Path] = []


def _reachable_by_others(path: Path) -> bool:
    """Whether a uid that owns nothing here can reach ``path``'s files: every directory on the
    way searchable (o+x) and the kernel modules readable (o+r)."""
    import stat

    for d in [path, *path.parents]:
        if not d.stat().st_mode & stat.S_IXOTH:
            return False
    return all((path / m).stat().st_mode & stat.S_IROTH for m in KERNEL_MODULES)


def kernels_dir() -> Path:
    """Where every process of this test session imports the test kernels (aot.py and its kind)
    from: the checkout's tests/ where uid 65534 can read it, else a world-readable copy made
    once per session (the checkout may sit under a 0700 home, and the as-nobody tests start
    children as uid 65534).  One place for all: the key of a kernel holds no path, but its
    cubin's line info does, so a kernel imported from two places compiles to other bytes."""
    if not _KERNELS:
        if _reachable_by_others(TESTS):
            _KERNELS.append(TESTS)
        else:
            import atexit
            import shutil
            import tempfile

            d = Path(tempfile.mkdtemp(prefix="cachebake-test-kernels-"))
            d.chmod(0o755)
            for name in KERNEL_MODULES:
                shutil.copy(TESTS / name, d / name)
                (d / name).chmod(0o644)
            atexit.register(shutil.rmtree, d, True)
            _KERNELS.append(d)
    return _KERNELS[0]


_CHILD = r"""
import hashlib, json, os, sys
sys.path[:0] = {paths!r}
import triton, aot
from triton.runtime.cache import _base32
out = {{"compiles": [], "error": None}}
seen = []
triton.knobs.compilation.listener = None if {no_listener!r} else (
    lambda src, metadata, metadata_group, times, cache_hit: seen.append(cache_hit))
try:
    for spec in json.loads({specs!r}):
        k = aot.compile_spec(spec)
        out["compiles"].append({{"kernel": k.name, "key": _base32(k.hash),
                                 "cubin_sha256": hashlib.sha256(k.kernel).hexdigest(),
                                 "paths": sorted(k.metadata_group.values())}})
        if {replace_listener!r}:  # a program that assigns its own listener after start-up
            triton.knobs.compilation.listener = lambda **kw: None
except Exception as e:
    out["error"] = f"{{type(e).__name__}}: {{e}}"
out["cache_hits"] = seen
print(json.dumps(out))
"""


def child_code(specs, no_listener=False, replace_listener=False) -> str:
    return _CHILD.format(paths=[str(REPO), str(kernels_dir())], specs=json.dumps(specs),
                         no_listener=no_listener, replace_listener=replace_listener)


def serve_env(base: os.PathLike | str, overlay: os.PathLike | str | None = None, **extra) -> dict:
    """The environment install --overlay hands a server (plus PYTHONPATH for the checkout)."""
    from cachebake.roles import overlay_env

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRITON_", "CACHEBAKE_", "POD_", "NODE_NAME"))}
    env["TRITON_CACHE_DIR"] = str(base)
    if overlay is not None:
        env.update(overlay_env(overlay))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(kernels_dir())])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_server(specs, env: dict, runner=None, timeout: float = 300, **flags) -> dict:
    """Compile ``specs`` (tests/kit/aot.py SPECS entries) in a fresh process; its JSON report plus
    ``stderr`` and ``rc``.  ``runner``: e.g. conftest.as_nobody; ``timeout``: seconds before
    subprocess.TimeoutExpired (a hang fails the test)."""
    argv = [sys.executable, "-c", child_code(specs, **flags)]
    if runner is None:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd="/")
    else:
        proc = runner(argv, env=env, timeout=timeout, cwd="/")
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"compiles": [], "error": "no output"}
    result["stderr"], result["rc"] = proc.stderr, proc.returncode
    return result


def tree_state(root: os.PathLike | str) -> dict:
    """Every entry under ``root``: name -> (mode, uid, sha256 of the bytes) for regular files,
    (mode, uid, target) for links, (mode, uid) for dirs and anything else (a FIFO is never
    opened, a link never followed).  Equal states mean nothing was written, created, removed,
    re-moded or re-owned."""
    import hashlib
    import stat

    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            entry: tuple = (oct(st.st_mode), st.st_uid)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    entry += (hashlib.sha256(fh.read()).hexdigest(),)
            elif stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(p),)
            state[os.path.relpath(p, root)] = entry
    return state


def miss_lines(path: os.PathLike | str) -> list[dict]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def relocate(cache: Path, root: str | None = None) -> Path:
    """Point ``cache``'s group files at ``root`` (default: where it is), as install and pack do
    (a copy of a cache still names where it was built)."""
    from cachebake.artifact.groups import relocated_group

    for grp in cache.glob("*/__grp__*.json"):
        grp.write_bytes(relocated_group(grp.read_bytes(), f"{root or cache}/{grp.parent.name}"))
    return cache
