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
REPO = TESTS.parent
_PUBLIC: list[Path] = []


def reachable_tests() -> Path:
    """A world-readable copy of the test helpers that server children import (aot.py and its
    kind), made once per session: the checkout may sit under a 0700 home, where a child run
    as uid 65534 could not import them.  Module names and sources are the same, so kernel keys
    and records are the checkout's."""
    if not _PUBLIC:
        import atexit
        import shutil
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="cachebake-tests-"))
        d.chmod(0o755)
        for f in TESTS.glob("*.py"):
            if not f.name.startswith("test_"):
                shutil.copy(f, d / f.name)
                (d / f.name).chmod(0o644)
        atexit.register(shutil.rmtree, d, True)
        _PUBLIC.append(d)
    return _PUBLIC[0]

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
    return _CHILD.format(paths=[str(REPO), str(reachable_tests())], specs=json.dumps(specs),
                         no_listener=no_listener, replace_listener=replace_listener)


def serve_env(base: os.PathLike | str, overlay: os.PathLike | str | None = None, **extra) -> dict:
    """The environment install --overlay hands a server (plus PYTHONPATH for the checkout)."""
    from cachebake.runtime import overlay_env

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRITON_", "CACHEBAKE_", "POD_", "NODE_NAME"))}
    env["TRITON_CACHE_DIR"] = str(base)
    if overlay is not None:
        env.update(overlay_env(overlay))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(reachable_tests())])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_server(specs, env: dict, runner=None, **flags) -> dict:
    """Compile ``specs`` (tests/aot.py SPECS entries) in a fresh process; its JSON report plus
    ``stderr`` and ``rc``.  ``runner``: e.g. conftest.as_nobody."""
    argv = [sys.executable, "-c", child_code(specs, **flags)]
    if runner is None:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd="/")
    else:
        proc = runner(argv, env=env, timeout=300, cwd="/")
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"compiles": [], "error": "no output"}
    result["stderr"], result["rc"] = proc.stderr, proc.returncode
    return result


def tree_state(root: os.PathLike | str) -> dict:
    """Every entry under ``root``: name -> (mode, sha256 of the bytes) for files, mode for dirs.
    Equal states mean nothing was written, created, removed or re-moded."""
    import hashlib

    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            state[os.path.relpath(p, root)] = oct(os.lstat(p).st_mode)
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                state[os.path.relpath(p, root)] = (oct(os.lstat(p).st_mode),
                                                   hashlib.sha256(fh.read()).hexdigest())
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
