"""Shared helpers and fixtures for the install tests (imported by tests/test_install_*.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import badlayers

REPO = Path(__file__).resolve().parent.parent.parent
KERNELS = Path(__file__).resolve().parent / "aot_kernels.py"


def env_with(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "CACHEBAKE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update({k: str(v) for k, v in extra.items()})
    return env


# The interpreter that runs `cachebake install` in the tests: CACHEBAKE_TEST_PYTHON runs the
# install corpus under another one, e.g. Debian 12's /usr/bin/python3 (3.11.2, no
# tarfile.data_filter) with python3-zstandard/-click/-rich installed.
INSTALL_PYTHON = os.environ.get("CACHEBAKE_TEST_PYTHON") or sys.executable


def cli(*args, env: dict | None = None, user: int | None = None, check: bool = False, timeout=None):
    python = INSTALL_PYTHON if args and args[0] == "install" else sys.executable
    cmd = [python, "-m", "cachebake.cli", *map(str, args)]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]  # numeric ids
    r = subprocess.run(cmd, capture_output=True, text=True, env=env or env_with(), cwd="/", timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


class Checkpoints:
    """``install_artifact(checkpoint=...)`` that counts the steps an install passes (locked:
    the staging lanes' threads pass checkpoints too)."""

    def __init__(self):
        self.passed = 0
        self._lock = threading.Lock()

    def __call__(self, _what: str = "") -> None:
        with self._lock:
            self.passed += 1


# `cachebake install|pack` (the real CLI, its boundary included) with a checkpoint injected
# that acts at the N-th step: install_artifact / pack_artifact is wrapped before the CLI
# imports it.  The actions are real: a signal to the process (os.kill), or FILL:PATH, which
# writes PATH until its filesystem refuses with ENOSPC (another writer filling the volume).
# NOEXCHANGE makes pack swap --out without renameat2's RENAME_EXCHANGE, as on a kernel or
# filesystem without it (the one stand-in here: this machine's has it).  INT_IN_FINALIZER
# sends SIGINT from inside an object's __del__, as a Ctrl-C lands while the garbage collector
# runs one: Python's default handler raises it there, where it is printed as "Exception
# ignored" and dropped.
_AT_CHECKPOINT = """
import errno, os, signal, sys, threading
command, n, action = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lock, passed = threading.Lock(), [0]
def act():
    if action.startswith("FILL:"):
        with open(action[5:], "wb") as f:
            try:
                while True:
                    f.write(b"x" * (1 << 16))
                    f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    elif action == "INT_IN_FINALIZER":
        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(1000))  # bytecodes for the handler to run between
        Finalized()
    else:
        os.kill(os.getpid(), getattr(signal, "SIG" + action))
def checkpoint(what=""):
    with lock:
        passed[0] += 1
        hit = passed[0] == n
    if hit:
        act()
if command == "install":
    import cachebake.install as module
    name = "install_artifact"
else:
    import cachebake.artifact.pack as module
    name = "pack_artifact"
    if os.environ.get("NOEXCHANGE"):  # pack swaps --out through its destination
        import cachebake.artifact.destination as destination
        destination._rename_exchange = lambda a, b: False
real = getattr(module, name)
setattr(module, name, lambda *a, **kw: real(*a, checkpoint=checkpoint, **kw))
from cachebake.cli import main
sys.argv = ["cachebake", command, *sys.argv[4:]]
sys.exit(main())
"""


def spawn_at_checkpoint(command: str, *args, at: int = 0, action: str = "KILL", env: dict | None = None,
                        python: str | None = None) -> subprocess.Popen:
    """``cachebake COMMAND ARGS`` (install or pack) in a child, ``action`` (KILL, INT,
    FILL:PATH) taken at checkpoint ``at`` (0: never)."""
    python = python or (INSTALL_PYTHON if command == "install" else sys.executable)
    return subprocess.Popen([python, "-c", _AT_CHECKPOINT, command, str(at), action, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or env_with(), cwd="/")


def spawn_install(*args, kill_at: int = 0, signal: str = "KILL", env: dict | None = None) -> subprocess.Popen:
    """``cachebake install ARGS`` in a child (INSTALL_PYTHON), sent ``signal`` (KILL, INT)
    at checkpoint ``kill_at`` (0: never)."""
    return spawn_at_checkpoint("install", *args, at=kill_at, action=signal, env=env)


def at_checkpoint_script(command: str, at: int, action: str, *args) -> str:
    """The shell words of ``spawn_at_checkpoint``, for a child that runs inside ``unshare -m``."""
    return " ".join(shlex.quote(str(w)) for w in
                    [INSTALL_PYTHON, "-c", _AT_CHECKPOINT, command, at, action, *args])


def compile_kernels(triton_dir: Path | str) -> dict:
    """Fresh process, TRITON_CACHE_DIR=triton_dir: AOT-compile the test kernels for sm_90."""
    r = subprocess.run([sys.executable, str(KERNELS)], capture_output=True, text=True,
                       env=env_with(TRITON_CACHE_DIR=triton_dir), cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def tree_state(path: Path) -> dict:
    """Every entry below ``path`` (not following links): type, mode, content hash/link target."""
    out = {}
    if not os.path.lexists(path):
        return out
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, path)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir", st.st_mode & 0o7777)
            else:
                out[rel] = ("file", st.st_mode & 0o7777, hashlib.sha256(Path(p).read_bytes()).hexdigest())
    return out


def resolved_view(role_dir: Path) -> dict | None:
    """What a server sees through DIR/<role>: relpath -> content hash; None if it is absent."""
    if not role_dir.is_dir():
        return None
    view = {}
    for root, dirs, files in os.walk(role_dir, followlinks=True):
        for f in files:
            p = os.path.join(root, f)
            view[os.path.relpath(p, role_dir)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return view


def current_fingerprint_dict(target: str = "sm_90") -> dict:
    from cachebake.artifact.fingerprint import current_fingerprint
    return current_fingerprint(target).to_json()


def pack(cache_root: Path, out: Path, roles=("triton",)) -> Path:
    """Pack ``cache_root``/<role> dirs into an artifact: the real packer when it exists."""
    try:
        from cachebake.artifact.pack import CacheRoot, pack_artifact
    except ImportError:
        entries = badlayers.tree_entries(cache_root)
        return badlayers.artifact_from_entries(out, entries, current_fingerprint_dict(), roles=roles)
    pack_artifact([CacheRoot(r, cache_root / r) for r in roles], out, target="sm_90")
    return out


@pytest.fixture(scope="session")
def baked(tmp_path_factory) -> dict:
    """A real bake: kernels compiled at a bake root that is then deleted, packed twice
    (a second artifact with one more kernel entry, to test replacement)."""
    base = tmp_path_factory.mktemp("bake")
    bake_root = base / "bakeroot"
    result = compile_kernels(bake_root / "triton")
    assert result["misses"] == 3
    art = pack(bake_root, base / "artifact")
    # A second, different bake: same kernels plus a copy of one key dir under a new key.
    keydirs = sorted((bake_root / "triton").iterdir())
    shutil.copytree(keydirs[0], bake_root / "triton" / ("Z" * 52))
    art2 = pack(bake_root, base / "artifact2")
    shutil.rmtree(bake_root)  # the baked path is gone, as on a serving node
    return {"artifact": art, "artifact2": art2, "bake_root": bake_root, "base": base}
