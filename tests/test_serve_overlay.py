"""The overlay is the server's own or refused: real servers (fresh processes compiling real
sm_90 kernels), overlays made by uid 65534 and by root, planted kernels and a planted launcher
``.so`` whose constructor would leave a file behind."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import servekit
from conftest import NOBODY, as_nobody
from test_serve_layered import ALSO_NOT_IN_BAKE, IN_BAKE, NOT_IN_BAKE

from cachebake.serve import overlay as overlay_mod

REFUSAL_TAIL = ("keeps its misses in a private spill (recompiled by each process) and logs them "
                "to stderr unless CACHEBAKE_MISS_LOG is outside the overlay")


@pytest.fixture
def bake(installed, public_tmp) -> Path:
    """The installed bake, read-only, where uid 65534 can read it."""
    base = public_tmp / "bake" / "triton"
    servekit.relocate(Path(shutil.copytree(installed, base)))
    os.system(f"chmod -R a-w,a+rX {public_tmp / 'bake'}")
    return base


@pytest.fixture
def shared(public_tmp) -> Path:
    """A directory where anyone may make entries, as /tmp (1777) is."""
    d = public_tmp / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


def refusals(out: dict) -> list[str]:
    return [ln for ln in out["stderr"].splitlines() if "is refused" in ln]


def stderr_misses(out: dict) -> list[dict]:
    return [json.loads(ln.split("cachebake: miss: ", 1)[1]) for ln in out["stderr"].splitlines()
            if ln.startswith("cachebake: miss: ")]


def chown_tree(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, uid)


def test_made_private_whatever_the_umask(bake, public_tmp):
    """An absent overlay (and its parents) made by the server: the overlay, triton/ and the
    key dir 0700 and the server's, under umask 000 too."""
    overlay = public_tmp / "a" / "b" / "overlay"

    def umask_zero(argv, **kw):
        return subprocess.run(argv, capture_output=True, text=True, preexec_fn=lambda: os.umask(0), **kw)

    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE], servekit.serve_env(bake, overlay), runner=umask_zero)
    assert out["error"] is None and out["cache_hits"] == [True, False], out["stderr"]
    key = out["compiles"][1]["key"]
    for d in (overlay, overlay / "triton", overlay / "triton" / key):
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(), d
    assert all(p.startswith(f"{overlay}/triton/{key}/") for p in out["compiles"][1]["paths"])
    assert [m["kernel"] for m in servekit.miss_lines(overlay / "misses.jsonl")] == ["add_kernel"]
    assert refusals(out) == []


@pytest.mark.slow
def test_overlay_made_by_nobody_is_refused_by_root(bake, public_tmp, shared):
    """uid 65534 gets to the overlay's path first (a real server of its own fills it), plants
    another kernel's cubin under the key of the one root will ask for, and points
    misses.jsonl at a root-only file.  Root's server serves none of it: the genuine compile,
    into its spill; the root-only file and the overlay are left as they were."""
    overlay = shared / "overlay"
    first = servekit.run_server([NOT_IN_BAKE, ALSO_NOT_IN_BAKE], servekit.serve_env(bake, overlay),
                                runner=as_nobody)
    assert first["error"] is None and first["cache_hits"] == [False, False], first["stderr"]
    assert os.stat(overlay).st_uid == NOBODY
    wanted, other = first["compiles"]
    planted = overlay / "triton" / wanted["key"] / "add_kernel.cubin"
    planted.write_bytes((overlay / "triton" / other["key"] / "rowsum_kernel.cubin").read_bytes())
    secret = public_tmp / "root-only"
    secret.write_text("root's own\n")
    secret.chmod(0o600)
    (overlay / "misses.jsonl").unlink()
    os.symlink(secret, overlay / "misses.jsonl")
    chown_tree(overlay, NOBODY)
    before = servekit.tree_state(overlay)
    genuine = servekit.run_server([NOT_IN_BAKE], servekit.serve_env(bake, public_tmp / "mine"))

    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE, NOT_IN_BAKE], servekit.serve_env(bake, overlay))
    assert out["rc"] == 0 and out["error"] is None, out["stderr"]
    assert out["cache_hits"] == [True, False, True]  # the planted entry is not a hit
    served = out["compiles"][1]
    assert served["cubin_sha256"] == genuine["compiles"][0]["cubin_sha256"] != hashlib.sha256(
        planted.read_bytes()).hexdigest()
    assert all("/cachebake-spill-" in p for p in served["paths"])
    assert refusals(out) == [f"cachebake: the overlay {overlay} is refused: it is owned by uid "
                             f"{NOBODY}, not this process's uid 0; pid {stderr_misses(out)[0]['pid']} "
                             + REFUSAL_TAIL]
    assert [m["kernel"] for m in stderr_misses(out)] == ["add_kernel"]
    assert secret.read_text() == "root's own\n"
    assert servekit.tree_state(overlay) == before


@pytest.mark.slow
def test_overlay_made_by_root_is_refused_by_nobody(bake, shared):
    overlay = shared / "overlay"
    first = servekit.run_server([NOT_IN_BAKE], servekit.serve_env(bake, overlay))
    assert first["error"] is None and os.stat(overlay).st_uid == 0
    overlay.chmod(0o755)  # readable by all: the refusal is not for want of permission
    before = servekit.tree_state(overlay)
    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE], servekit.serve_env(bake, overlay), runner=as_nobody)
    assert out["rc"] == 0 and out["error"] is None and out["cache_hits"] == [True, False], out["stderr"]
    assert all("/cachebake-spill-" in p for p in out["compiles"][1]["paths"])
    (line,) = refusals(out)
    assert f"is refused: it is owned by uid 0, not this process's uid {NOBODY};" in line
    assert servekit.tree_state(overlay) == before


CANARY_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void canary(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("the planted library ran\n", f); fclose(f); }
}
"""

PROBE_SRC = ("#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"cb_canary\"};\n"
             "PyMODINIT_FUNC PyInit_cb_canary(void) { return PyModule_Create(&m); }\n")

LOAD_HELPER = r"""
import sys
sys.path.insert(0, {repo!r})
from triton.runtime.build import compile_module_from_src
print(compile_module_from_src({src!r}, "cb_canary").__file__)
"""


def test_planted_launcher_is_never_loaded(public_tmp, shared):
    """The launcher helpers are dlopened from the cache (runtime/build.py): uid 65534 puts a
    library whose constructor writes a file where root's server will look for its helper.
    The constructor never runs; the helper is built into the spill and loads from there."""
    if not shutil.which("gcc"):
        pytest.skip("needs gcc to build the canary library")
    from triton.runtime.build import platform_key
    from triton.runtime.cache import _base32

    ran = public_tmp / "canary-ran"
    (public_tmp / "canary.c").write_text(CANARY_C % ran)
    lib = public_tmp / "canary.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(public_tmp / "canary.c")], check=True)
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r})"], check=True)
    assert ran.exists()  # the canary works: loading it leaves the file
    ran.unlink()

    key = _base32(hashlib.sha256((PROBE_SRC + platform_key()).encode()).hexdigest())
    overlay = shared / "overlay"
    key_dir = overlay / "triton" / key
    key_dir.mkdir(parents=True)
    planted = key_dir / f"cb_canary{sysconfig.get_config_var('EXT_SUFFIX')}"
    shutil.copy(lib, planted)
    for d in (overlay, overlay / "triton", key_dir):
        d.chmod(0o700)
    chown_tree(overlay, NOBODY)

    env = servekit.serve_env(public_tmp / "no-bake", overlay)
    code = LOAD_HELPER.format(repo=str(servekit.REPO), src=PROBE_SRC)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "/cachebake-spill-" in out.stdout and str(overlay) not in out.stdout
    assert not ran.exists()
    assert f"cachebake: the overlay {overlay} is refused: it is owned by uid {NOBODY}" in out.stderr
    (miss,) = [json.loads(ln.split("miss: ", 1)[1]) for ln in out.stderr.splitlines() if "miss: " in ln]
    assert miss["kind"] == "helper" and miss["stored"] == "spill"

    # Triton's own manager, pointed at the same directory, runs the planted code.
    plain = {**env, "TRITON_CACHE_DIR": str(overlay / "triton")}
    for var in ("TRITON_CACHE_MANAGER", "CACHEBAKE_OVERLAY_DIR", "CACHEBAKE_MISS_LOG"):
        plain.pop(var)
    subprocess.run([sys.executable, "-c", code], env=plain, capture_output=True, text=True, timeout=120)
    assert ran.exists()


@pytest.mark.parametrize("owner", ["nobody", "server"])
def test_symlinked_triton_dir_is_not_followed(bake, public_tmp, shared, owner):
    """``<overlay>/triton`` a link to another directory (one the server may write, root's own
    here): nothing is written there, whoever made the overlay."""
    overlay = shared / "overlay"
    overlay.mkdir(mode=0o700)
    elsewhere = public_tmp / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, overlay / "triton")
    if owner == "nobody":
        chown_tree(overlay, NOBODY)
    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE], servekit.serve_env(bake, overlay))
    assert out["rc"] == 0 and out["error"] is None and out["cache_hits"] == [True, False], out["stderr"]
    assert list(elsewhere.iterdir()) == []
    assert all("/cachebake-spill-" in p for p in out["compiles"][1]["paths"])
    (line,) = refusals(out)
    why = (f"it is owned by uid {NOBODY}, not this process's uid 0" if owner == "nobody"
           else "its triton/ is a symbolic link")
    assert line.startswith(f"cachebake: the overlay {overlay} is refused: {why};"), line
    assert not (overlay / "misses.jsonl").exists()  # the log went to stderr with the rest
    assert [m["kernel"] for m in stderr_misses(out)] == ["add_kernel"]


@pytest.mark.parametrize("case", ["world-writable", "group-writable", "symlink", "key-dir-foreign"])
def test_refused_overlays(bake, public_tmp, case):
    """An emptyDir's own mode (0777), a group-writable dir, a link to a private dir of ours,
    and a key dir inside a private overlay that is another uid's: each refused, none written."""
    overlay = public_tmp / "overlay"
    overlay.mkdir()
    if case == "world-writable":
        overlay.chmod(0o777)
        why = "it is group- or world-writable (mode 0777)"
    elif case == "group-writable":
        overlay.chmod(0o770)
        why = "it is group- or world-writable (mode 0770)"
    elif case == "symlink":
        overlay.chmod(0o700)
        overlay.rename(public_tmp / "real")
        os.symlink(public_tmp / "real", overlay)
        why = "it is a symbolic link"
    else:
        overlay.chmod(0o700)
        probe = servekit.run_server([NOT_IN_BAKE], servekit.serve_env(bake, public_tmp / "probe"))
        key = probe["compiles"][0]["key"]
        (overlay / "triton" / key).mkdir(parents=True, mode=0o700)
        os.chown(overlay / "triton" / key, NOBODY, NOBODY)
        why = f"its triton/{key}/ is owned by uid {NOBODY}, not this process's uid 0"
    before = servekit.tree_state(public_tmp / "real" if case == "symlink" else overlay)
    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE], servekit.serve_env(bake, overlay))
    assert out["rc"] == 0 and out["error"] is None and out["cache_hits"] == [True, False], out["stderr"]
    (line,) = refusals(out)
    assert line.startswith(f"cachebake: the overlay {overlay} is refused: {why};"), line
    assert servekit.tree_state(public_tmp / "real" if case == "symlink" else overlay) == before


def test_overlay_swapped_after_the_check(tmp_path, monkeypatch):
    """The overlay's parent may let another uid rename entries (an emptyDir is 0777): once its
    path leads to another directory, nothing more is handed out from it or written to it."""
    path = tmp_path / "overlay"
    ovl = overlay_mod.Overlay(str(path))
    assert ovl.write("K" * 52, "k.cubin", b"first") == f"{path}/triton/{'K' * 52}/k.cubin"
    path.rename(tmp_path / "moved")
    path.mkdir(mode=0o700)  # someone else's, in the real attack; its files would be served
    assert ovl.write("K" * 52, "k2.cubin", b"second") is None
    assert "no longer leads to the directory this process checked" in ovl.refused
    assert ovl.key_dir("K" * 52, create=True) is None
    assert list(path.iterdir()) == []
    assert (tmp_path / "moved" / "triton" / ("K" * 52) / "k.cubin").read_bytes() == b"first"


def test_overlay_resolving_into_the_bake_is_refused(installed):
    """The server's own check, for an overlay set by hand: the install root itself as the
    overlay makes ``<overlay>/triton`` the baked tree, which would then be written."""
    before = servekit.tree_state(installed)
    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE], servekit.serve_env(installed, installed.parent))
    assert out["error"] is None and out["cache_hits"] == [True, False], out["stderr"]
    (line,) = refusals(out)
    assert f"its triton/ dir resolves into the baked tree {installed};" in line, line
    assert servekit.tree_state(installed) == before
