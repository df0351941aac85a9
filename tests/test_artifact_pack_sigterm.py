"""SIGTERM (what `kill`, systemd, docker stop and the kubelet send) stops a pack as Ctrl-C
does: at each step of the swap, one line saying what --out holds, and nothing the pack made
left beside --out.  A SIGKILLed pack's temp dir is removed by the next pack into that --out,
and only then: not while its pack lives, not another user's, not a name pack never makes."""

from __future__ import annotations

import fcntl
import os
import shutil

import pytest

from installkit import env_with, spawn_at_checkpoint
from test_artifact_pack import SWAP_STEPS, _pack, _siblings, _two_bakes
from cachebake.artifact.oci import open_artifact


@pytest.mark.parametrize("how", SWAP_STEPS, ids=list(SWAP_STEPS))
def test_sigterm_at_each_step_says_what_it_left_and_leaves_no_temp_dir(triton_cache, tmp_path, how):
    out, other, old, new = _two_bakes(triton_cache, tmp_path)
    env = env_with(NOEXCHANGE="1") if how == "two renames" else env_with()
    for at, step in enumerate(SWAP_STEPS[how], 1):
        shutil.rmtree(out)
        _pack(triton_cache, out)
        p = spawn_at_checkpoint("pack", f"triton={other}", "--out", out, "--target", "sm_90", at=at,
                                action="TERM", env=env)
        _, err = p.communicate()
        assert p.returncode == 130 and "Traceback" not in err, (step, p.returncode, err)
        (line,) = err.splitlines()
        assert line.startswith("cachebake: error: interrupted: "), line
        digest = open_artifact(out).select().layer_digest
        if step in ("written", "aside"):
            assert line.endswith(f"nothing written: {out} is as it was") and digest == old, (step, line)
        else:
            assert f"{out} holds the new artifact" in line and digest == new, (step, line)
        assert _siblings(out) == [], (step, _siblings(out))


def test_sigterm_of_a_first_pack_leaves_nothing(triton_cache, tmp_path):
    out = tmp_path / "art"
    p = spawn_at_checkpoint("pack", f"triton={triton_cache}", "--out", out, "--target", "sm_90", at=1,
                            action="TERM")
    _, err = p.communicate()
    assert p.returncode == 130 and "Traceback" not in err, err
    assert not out.exists() and _siblings(out) == []


def test_only_a_dead_packs_own_temp_dirs_are_removed(triton_cache, tmp_path):
    """What the next pack removes: a temp dir of its --out's name pattern, owned by this user,
    whose pack is gone (no flock on it); a live pack's, another user's, another name's and a
    plain file of that name stay."""
    out = tmp_path / "art"
    dead = tmp_path / ".art.tmp-dead"
    (dead / "blobs").mkdir(parents=True)
    live = tmp_path / ".art.tmp-live"
    live.mkdir()
    foreign = tmp_path / ".art.tmp-foreign"
    foreign.mkdir()
    os.chown(foreign, 65534, 65534)
    unrelated = tmp_path / ".other.tmp-x"
    unrelated.mkdir()
    plain = tmp_path / ".art.tmp-file"
    plain.write_text("not a pack's")
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        report = _pack(triton_cache, out)
    finally:
        os.close(fd)
    assert report.cleaned == [".art.tmp-dead"] and not dead.exists()
    assert live.is_dir() and foreign.is_dir() and unrelated.is_dir() and plain.is_file()
