"""Atomicity: racing installs, SIGKILL at every checkpoint, non-root, read-only source."""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from installkit import (INSTALL_PYTHON, REPO, Checkpoints, at_checkpoint_script, baked, cli,  # noqa: F401
                        compile_kernels, env_with, resolved_view, spawn_at_checkpoint, spawn_install)

from cachebake.install import install_artifact


@pytest.fixture(scope="module")
def fp_file(tmp_path_factory):
    """The serving fingerprint as a file: the installer subprocesses then never import Triton."""
    p = tmp_path_factory.mktemp("fp") / "fingerprint.json"
    cli("fingerprint", "--target", "sm_90", "--out", p, check=True)
    return p


def _spawn(artifact, to, fp_file, kill_at=0):
    return spawn_install(artifact, "--to", to, "--fingerprint", fp_file, "--json", kill_at=kill_at)


def _assert_clean(to: Path):
    """One version, the current one; no staging leftovers, no temporary links."""
    state = to / ".cachebake"
    current = os.readlink(state / "current")
    assert [f"versions/{v.name}" for v in (state / "versions").iterdir()] == [current]
    assert not any((state / "staging").iterdir()) if (state / "staging").exists() else True
    assert not list(state.glob("current.tmp-*")) and not list(to.glob(".*cachebake-tmp*"))


def test_eight_racing_installs_end_with_one_complete_tree(baked, fp_file, tmp_path):
    to = tmp_path / "shared"
    procs = [_spawn(baked["artifact"], to, fp_file) for _ in range(8)]
    outs = [(p.wait(), p.stdout.read(), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _, _ in outs), outs
    statuses = sorted(json.loads(out)["status"] for _, out, _ in outs)
    assert statuses == ["already installed"] * 7 + ["installed"]
    _assert_clean(to)
    result = compile_kernels(to / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)


def test_racing_installs_of_two_bakes_end_with_one_of_them(baked, fp_file, tmp_path):
    to = tmp_path / "shared"
    procs = [_spawn(baked["artifact" if i % 2 else "artifact2"], to, fp_file) for i in range(8)]
    outs = [(p.wait(), p.stdout.read(), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _, _ in outs), outs
    _assert_clean(to)
    assert len(list((to / "triton").iterdir())) in (3, 4)
    result = compile_kernels(to / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)


def _views(baked, fp_file, to):
    """What DIR/triton shows with bake A and with bake B installed at ``to``."""
    views = {}
    for name in ("artifact", "artifact2"):
        shutil.rmtree(to, ignore_errors=True)
        install_artifact(baked[name], to, fingerprint_file=str(fp_file))
        views[name] = resolved_view(to / "triton")
    shutil.rmtree(to)
    return views


def _count_checkpoints(baked, fp_file, to, first_install) -> int:
    if not first_install:
        install_artifact(baked["artifact"], to, fingerprint_file=str(fp_file))
    steps = Checkpoints()
    install_artifact(baked["artifact2"], to, fingerprint_file=str(fp_file), checkpoint=steps)
    shutil.rmtree(to)
    return steps.passed


@pytest.mark.slow
@pytest.mark.parametrize("first_install", [False, True], ids=["replace", "first"])
def test_sigkill_at_every_checkpoint_leaves_old_or_complete(baked, fp_file, tmp_path, first_install):
    to = tmp_path / "cache"
    views = _views(baked, fp_file, to)
    total = _count_checkpoints(baked, fp_file, to, first_install)
    assert total >= 20, total
    print(f"{total} kill points")
    old = None if first_install else views["artifact"]
    outcomes = {"old": 0, "new": 0}
    for kill_at in range(1, total + 1):
        shutil.rmtree(to, ignore_errors=True)
        if not first_install:
            install_artifact(baked["artifact"], to, fingerprint_file=str(fp_file))
        p = _spawn(baked["artifact2"], to, fp_file, kill_at=kill_at)
        assert p.wait() == -signal.SIGKILL, (kill_at, p.stderr.read())
        seen = resolved_view(to / "triton")
        assert seen in (old, views["artifact2"]), f"partial tree after a kill at checkpoint {kill_at}"
        outcomes["old" if seen == old else "new"] += 1
        # the next install completes and leaves nothing behind
        report = install_artifact(baked["artifact2"], to, fingerprint_file=str(fp_file))
        assert report.status in ("installed", "replaced", "already installed")
        assert resolved_view(to / "triton") == views["artifact2"]
        _assert_clean(to)
    assert outcomes["old"] > 0 and outcomes["new"] > 0, outcomes


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
@pytest.mark.parametrize("flag", ["--sync", "--no-sync"])
def test_no_sync_makes_no_flush_and_installs_the_same(baked, fp_file, tmp_path, flag):
    """The system calls an install makes, seen by strace: a syncfs and fsyncs by default, none
    with --no-sync; both trees serve every kernel."""
    to, trace = tmp_path / "cache", tmp_path / "trace"
    r = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=syncfs,fsync,fdatasync,sync",
                        sys.executable, "-m", "cachebake.cli", "install", str(baked["artifact"]), "--to", str(to),
                        "--fingerprint", str(fp_file), "--json", flag],
                       capture_output=True, text=True, env=env_with(), cwd="/")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    calls = re.findall(r"\b(syncfs|fsync|fdatasync|sync)\(", trace.read_text())
    if flag == "--sync":
        assert report["synced"] is True and "syncfs" in calls and "fsync" in calls, calls
    else:
        assert report["synced"] is False and calls == [], calls
    assert report["status"] == "installed"
    _assert_clean(to)
    result = compile_kernels(to / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)


def _nobody_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="cachebake-nobody-"))
    d.chmod(0o755)
    return d


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_non_root_install_from_a_read_only_source(baked, fp_file):
    base = _nobody_dir()
    try:
        src = base / "ro-artifact"
        shutil.copytree(baked["artifact"], src)
        for p in [src, *src.rglob("*")]:  # read-only for everyone, root-owned
            p.chmod(0o555 if p.is_dir() else 0o444)
        fp = base / "fp.json"
        shutil.copy(fp_file, fp)
        fp.chmod(0o444)
        to = base / "vol"  # its parent stays root-owned 0755: nothing may be written beside DIR
        to.mkdir()
        os.chown(to, 65534, 65534)  # the writable volume, owned by the unprivileged user
        assert os.access(REPO, os.R_OK | os.X_OK)
        r = cli("install", src, "--to", to, "--fingerprint", fp, "--json", user=65534)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["status"] == "installed"
        for p in to.rglob("*"):
            st = p.lstat()
            assert st.st_uid == 65534
            if not stat.S_ISLNK(st.st_mode):
                assert stat.S_IMODE(st.st_mode) in (0o644, 0o755), p
        again = cli("install", src, "--to", to, "--fingerprint", fp, user=65534)
        assert again.returncode == 0 and again.stdout.startswith("already installed")
        result = compile_kernels(to / "triton")
        assert (result["hits"], result["misses"]) == (3, 0)
    finally:
        for p in base.rglob("*"):
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(base)


def _can_unshare_mounts() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -o remount,bind,ro / 2>/dev/null || "
                        "mount --bind / / && mount -o remount,bind,ro /"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs root, unshare -m and setpriv")
def test_read_only_root_filesystem_as_nobody_into_a_writable_volume(baked, fp_file):
    """The init-container shape: root filesystem read-only, one writable volume, uid 65534."""
    base = _nobody_dir()
    try:
        vol = base / "vol"
        vol.mkdir()
        os.chown(vol, 65534, 65534)
        fp = base / "fp.json"
        shutil.copy(fp_file, fp)
        fp.chmod(0o444)
        art = base / "art"
        shutil.copytree(baked["artifact"], art)
        for p in [art, *art.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o444)
        script = (f"mount --bind {vol} {vol} && mount -o remount,bind,ro / && "
                  f"! touch {base}/probe 2>/dev/null && cd / && "
                  f"exec setpriv --reuid=65534 --regid=65534 --clear-groups "
                  f"{sys.executable} -m cachebake.cli install {art} --to {vol} --fingerprint {fp} --json")
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                           env=env_with(PYTHONDONTWRITEBYTECODE=1))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["status"] == "installed"
        result = compile_kernels(vol / "triton")
        assert (result["hits"], result["misses"]) == (3, 0)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_a_kill_while_cleaning_a_previous_kill_still_recovers(baked, fp_file, tmp_path):
    """Two crashes in a row: the second install dies while removing the first one's leftovers."""
    to = tmp_path / "cache"
    views = _views(baked, fp_file, to)
    total = _count_checkpoints(baked, fp_file, to, first_install=False)
    for first in range(3, total, 6):
        for second in (1, 2, 3):
            shutil.rmtree(to, ignore_errors=True)
            install_artifact(baked["artifact"], to, fingerprint_file=str(fp_file))
            for kill_at in (first, second):
                p = _spawn(baked["artifact2"], to, fp_file, kill_at=kill_at)
                p.wait()
                assert resolved_view(to / "triton") in (views["artifact"], views["artifact2"])
            install_artifact(baked["artifact2"], to, fingerprint_file=str(fp_file))
            assert resolved_view(to / "triton") == views["artifact2"]
            _assert_clean(to)


def test_a_transaction_undoes_whatever_ends_it_but_a_commit(baked, fp_file, tmp_path):
    """The destination owns its finalize step: leaving the block without a commit, or an
    exception in it, leaves DIR as it was (a fresh DIR is removed again); only commit switches."""
    from cachebake.install.atomic import InstallDir
    from installkit import tree_state

    fresh = tmp_path / "a" / "new"
    with InstallDir(fresh).transaction(5) as tx:
        os.mkdir("triton", dir_fd=tx.staged_fd)
        assert (fresh / ".cachebake" / "staging").is_dir() and tx.marker is None
    assert not (tmp_path / "a").exists()

    to = tmp_path / "cache"
    install_artifact(baked["artifact"], to, fingerprint_file=str(fp_file))
    before = tree_state(to)
    with pytest.raises(RuntimeError):
        with InstallDir(to).transaction(5) as tx:
            assert tx.marker is not None and tx.damage == []
            os.mkdir("triton", dir_fd=tx.staged_fd)
            raise RuntimeError("the extraction failed")
    assert tree_state(to) == before


def test_the_kill_hook_is_not_read_from_the_environment(baked, fp_file, tmp_path):
    """Production code takes its checkpoint as an argument: the variable the crash tests once
    set in the environment does nothing now."""
    r = cli("install", baked["artifact"], "--to", tmp_path / "c", "--fingerprint", fp_file, "--json",
            env=env_with(CACHEBAKE_TEST_KILL_AT=1, CACHEBAKE_TEST_SIGNAL="KILL"))
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "installed", r.stderr
    assert not any("CACHEBAKE_TEST" in p.read_text() for p in (REPO / "cachebake").rglob("*.py"))


# -- faults: a full volume, a read-only one, Ctrl-C at every step ------------------------------
def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                          capture_output=True).returncode == 0


needs_tmpfs = pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and unshare -m to mount a small tmpfs")


def _in_a_mount_namespace(script: str) -> subprocess.CompletedProcess:
    """``script`` under ``unshare -m``: its mounts vanish with it, so it records what the test
    checks into files outside them."""
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"set -e\n{script}"], capture_output=True, text=True,
                       env=env_with(), cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _view_cmd(role_dir, out) -> str:
    prog = ("import json, sys; sys.path.insert(0, sys.argv[3]); from installkit import resolved_view; "
            "from pathlib import Path; Path(sys.argv[2]).write_text(json.dumps(resolved_view(Path(sys.argv[1]))))")
    return f"{sys.executable} -c '{prog}' {role_dir} {out} {REPO / 'tests' / 'kit'}"


def _install_cmd(art, to, fp_file, tag, tmp_path) -> str:
    """An install whose exit code, stdout and stderr land in tmp_path/TAG.{rc,out,err}."""
    return (f"{INSTALL_PYTHON} -m cachebake.cli install {art} --to {to} --fingerprint {fp_file} "
            f"> {tmp_path}/{tag}.out 2> {tmp_path}/{tag}.err && echo 0 > {tmp_path}/{tag}.rc "
            f"|| echo $? > {tmp_path}/{tag}.rc")


def _result(tmp_path, tag) -> tuple[int, str, str]:
    return (int((tmp_path / f"{tag}.rc").read_text()), (tmp_path / f"{tag}.out").read_text(),
            (tmp_path / f"{tag}.err").read_text())


@needs_tmpfs
@pytest.mark.parametrize("first_install", [False, True], ids=["replace", "first"])
def test_a_volume_filled_mid_install_is_exit_3_naming_dir(baked, fp_file, tmp_path, first_install):
    """Real ENOSPC (a 2 MiB tmpfs): the free-space check passes, then another writer fills the
    volume while the layer is being written.  Exit 3, one line naming DIR and what was left;
    DIR holds the old tree (or, on a first install, is gone); the next install completes."""
    steps: list[str] = []
    install_artifact(baked["artifact2"], tmp_path / "probe", fingerprint_file=str(fp_file), checkpoint=steps.append)
    at = steps.index("entry") + 1  # the first entry's checkpoint (1-based): files are still to come
    mnt = tmp_path / "vol"
    mnt.mkdir()
    to = mnt / "dir"
    fill = at_checkpoint_script("install", at, f"FILL:{mnt}/filler", baked["artifact2"], "--to", to,
                                "--fingerprint", fp_file)
    _in_a_mount_namespace("\n".join([
        f"mount -t tmpfs -o size=2m tmpfs {mnt}",
        "" if first_install else _install_cmd(baked["artifact"], to, fp_file, "old", tmp_path),
        _view_cmd(to / "triton", tmp_path / "before.json"),
        f"{fill} > {tmp_path}/full.out 2> {tmp_path}/full.err && echo 0 > {tmp_path}/full.rc || echo $? > {tmp_path}/full.rc",
        _view_cmd(to / "triton", tmp_path / "after.json"),
        f"ls -A {mnt} > {tmp_path}/vol.ls; ls -A {to}/.cachebake/staging > {tmp_path}/staging.ls 2>/dev/null || true",
        f"rm {mnt}/filler",
        _install_cmd(baked["artifact2"], to, fp_file, "again", tmp_path),
        _view_cmd(to / "triton", tmp_path / "again.json"),
    ]))
    rc, out, err = _result(tmp_path, "full")
    assert rc == 3, err
    assert err == (f"cachebake: error: {to}: cannot install: No space left on device; nothing was installed; "
                   f"{to} holds what it held before\n"), err
    assert (tmp_path / "after.json").read_text() == (tmp_path / "before.json").read_text()
    assert (tmp_path / "staging.ls").read_text() == ""  # the half-written tree went with the refusal
    assert (tmp_path / "vol.ls").read_text().split() == (["filler"] if first_install else ["dir", "filler"])
    assert _result(tmp_path, "again")[0] == 0
    # the complete new tree (its group files name this DIR, not the probe's)
    assert sorted(json.loads((tmp_path / "again.json").read_text())) == sorted(resolved_view(tmp_path / "probe" / "triton"))


@needs_tmpfs
def test_another_bake_into_a_read_only_dir_is_exit_3_naming_dir(baked, fp_file, tmp_path):
    """A read-only volume (tmpfs remounted ro) holding bake A: installing A again is the no-op
    it always is (exit 0); installing B is refused in one line naming DIR, exit 3."""
    mnt = tmp_path / "vol"
    mnt.mkdir()
    to = mnt / "dir"
    _in_a_mount_namespace("\n".join([
        f"mount -t tmpfs -o size=4m tmpfs {mnt}",
        _install_cmd(baked["artifact"], to, fp_file, "a", tmp_path),
        f"mount -o remount,ro {mnt}",
        _install_cmd(baked["artifact2"], to, fp_file, "b", tmp_path),
        _install_cmd(baked["artifact"], to, fp_file, "a_again", tmp_path),
        _view_cmd(to / "triton", tmp_path / "after.json"),
    ]))
    assert _result(tmp_path, "a")[0] == 0
    rc, _, err = _result(tmp_path, "b")
    assert rc == 3, err
    assert err == (f"cachebake: error: {to}: cannot install: Read-only file system; nothing was installed; "
                   f"{to} holds what it held before\n"), err
    rc, out, _ = _result(tmp_path, "a_again")
    assert rc == 0 and out.startswith("already installed")
    assert json.loads((tmp_path / "after.json").read_text()) is not None


@pytest.mark.slow
def test_ctrl_c_at_every_checkpoint_says_what_was_left_and_it_is_so(baked, fp_file, tmp_path):
    """SIGINT at every step of replacing a bake: exit 130, one line, never a traceback or an
    'Exception ignored' fragment, and the line is true: 'nothing was installed' leaves the old
    tree, 'switched in' the new one (never 'installed' after an interrupt)."""
    to = tmp_path / "cache"
    views = _views(baked, fp_file, to)
    total = _count_checkpoints(baked, fp_file, to, first_install=False)
    said = {"nothing": 0, "switched": 0}
    for at in range(1, total + 1):
        shutil.rmtree(to, ignore_errors=True)
        install_artifact(baked["artifact"], to, fingerprint_file=str(fp_file))
        p = spawn_install(baked["artifact2"], "--to", to, "--fingerprint", fp_file, kill_at=at, signal="INT")
        out, err = p.communicate()
        assert p.returncode == 130 and out == "", (at, err)
        (line,) = err.splitlines()
        seen = resolved_view(to / "triton")
        if "nothing was installed" in line:
            said["nothing"] += 1
            assert seen == views["artifact"], at
        else:
            assert f"the new bake was switched in at {to}" in line, line
            said["switched"] += 1
            assert seen == views["artifact2"], at
        report = install_artifact(baked["artifact2"], to, fingerprint_file=str(fp_file))
        assert resolved_view(to / "triton") == views["artifact2"] and report.status in ("replaced", "already installed")
        _assert_clean(to)
    assert said["nothing"] > 0 and said["switched"] > 0, said


@pytest.mark.parametrize("step", ["entry", "synced", "switched"])
def test_ctrl_c_inside_a_finalizer_is_not_dropped(baked, fp_file, tmp_path, step):
    """A Ctrl-C that lands while a finalizer runs: Python's own handler would raise it inside
    __del__, print 'Exception ignored ... KeyboardInterrupt' and install anyway.  Install
    takes Ctrl-C at its steps only: exit 130, one line, and the state it names."""
    to = tmp_path / "cache"
    views = _views(baked, fp_file, to)
    steps: list[str] = []
    install_artifact(baked["artifact"], to, fingerprint_file=str(fp_file))
    install_artifact(baked["artifact2"], tmp_path / "probe", fingerprint_file=str(fp_file), checkpoint=steps.append)
    at = steps.index(step) + 1
    p = spawn_at_checkpoint("install", baked["artifact2"], "--to", to, "--fingerprint", fp_file, at=at,
                            action="INT_IN_FINALIZER")
    out, err = p.communicate()
    assert p.returncode == 130 and out == "" and "Exception ignored" not in err, err
    (line,) = err.splitlines()
    if step == "switched":
        assert "the new bake was switched in" in line and resolved_view(to / "triton") == views["artifact2"]
    else:
        assert "nothing was installed" in line and resolved_view(to / "triton") == views["artifact"]
