"""The destination pack and merge write through: a temp dir beside --out, finalized (world-readable,
fsync'ed, swapped into place, the old artifact removed) or removed; what killed writers left
beside --out cleaned by the next.  Real directories and renames; the kill and Ctrl-C of a real
pack at each step: tests/test_artifact_pack.py, of a merge: tests/test_artifact_merge.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cachebake.artifact import destination
from cachebake.artifact.destination import FINALIZE_STEPS, ArtifactDestination, clean_leftovers, work_dir_beside


def _layout(root: Path, tag: str) -> None:
    """What is_artifact recognizes, and a blob that says which artifact it is."""
    (root / "blobs" / "sha256").mkdir(parents=True)
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text("{}")
    (root / "blobs" / "sha256" / "which").write_text(tag)


def _which(out: Path) -> str:
    return (out / "blobs" / "sha256" / "which").read_text()


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def _write(out: Path, tag: str, checkpoint=destination.no_checkpoint) -> tuple[ArtifactDestination, list[str]]:
    steps: list[str] = []

    def seen(what: str) -> None:
        steps.append(what)
        checkpoint(what)

    dest = ArtifactDestination(out, seen)
    with dest.open() as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(f".{out.name}.tmp-")
        _layout(tmp, tag)
        dest.finalize()
    return dest, steps


@pytest.fixture
def no_exchange(monkeypatch):
    """A kernel or filesystem without RENAME_EXCHANGE (renameat2 answers EINVAL there)."""
    monkeypatch.setattr(destination, "_rename_exchange", lambda a, b: False)


def test_a_new_out_is_the_artifact_world_readable_and_nothing_beside_it(tmp_path):
    out = tmp_path / "art"
    old_umask = os.umask(0o077)
    try:
        dest, steps = _write(out, "new")
    finally:
        os.umask(old_umask)
    assert _which(out) == "new" and _siblings(out) == [] and dest.swapped
    assert steps == ["written", "swapped", "old-removed"]
    for p in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o755 if p.is_dir() else 0o644), (p, oct(mode))
    assert dest.left() == f"{out} holds the new artifact: the pack had finished"


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two renames"])
def test_an_existing_out_is_replaced_and_the_old_one_removed(tmp_path, request, exchange):
    if not exchange:
        request.getfixturevalue("no_exchange")
    out = tmp_path / "art"
    _write(out, "old")
    _, steps = _write(out, "new")
    assert _which(out) == "new" and _siblings(out) == []
    expected = [s for s in FINALIZE_STEPS if exchange is False or s != "aside"]
    assert steps == expected


def test_leaving_without_finalize_removes_the_temp_dir_and_out_is_as_it_was(tmp_path):
    out = tmp_path / "art"
    _write(out, "old")
    dest = ArtifactDestination(out)
    with pytest.raises(RuntimeError), dest.open() as tmp:
        _layout(tmp, "new")
        raise RuntimeError("a writer's error")
    assert _which(out) == "old" and _siblings(out) == [] and not dest.swapped
    assert dest.left() == f"nothing written: {out} is as it was"


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two renames"])
def test_ctrl_c_at_each_finalize_step_leaves_what_left_says(tmp_path, request, exchange):
    """A Ctrl-C is raised at a step (errors.DeferredInterrupt.check): at "written" and "aside"
    out is the old artifact, after the swap the new one, and the old one is removed even then."""
    if not exchange:
        request.getfixturevalue("no_exchange")
    out = tmp_path / "art"
    steps = [s for s in FINALIZE_STEPS if exchange is False or s != "aside"]
    for at in steps:
        _write(out, "old")

        def interrupt(what: str, at=at) -> None:
            if what == at:
                raise KeyboardInterrupt

        dest = ArtifactDestination(out, interrupt, command="merge")
        with pytest.raises(KeyboardInterrupt), dest.open() as tmp:
            _layout(tmp, "new")
            dest.finalize()
        assert _siblings(out) == [], (at, _siblings(out))
        if at in ("written", "aside"):
            assert _which(out) == "old" and dest.left() == f"nothing written: {out} is as it was", at
        else:
            assert _which(out) == "new", at
            assert dest.left() == f"{out} holds the new artifact: the merge had finished", at


def test_clean_leftovers_takes_only_a_dead_writers_dirs(tmp_path):
    out = tmp_path / "art"
    _write(out, "current")
    dead, dead_fd = work_dir_beside(out)
    os.close(dead_fd)  # a killed writer's: the kernel drops its flock with its process's fds
    live, live_fd = work_dir_beside(out)  # a writer still at work holds its flock
    (tmp_path / ".art.tmp-file").write_text("not a writer's dir")
    (tmp_path / ".other.tmp-x").mkdir()  # another --out's
    try:
        removed = clean_leftovers(out)
    finally:
        os.close(live_fd)
    assert removed == [dead.name]
    assert live.is_dir() and not dead.exists() and (tmp_path / ".art.tmp-file").is_file()
    assert (tmp_path / ".other.tmp-x").is_dir() and _which(out) == "current"


def test_clean_leftovers_puts_back_an_old_artifact_set_aside_by_a_killed_writer(tmp_path):
    """Killed between its two renames (no RENAME_EXCHANGE): out is gone, the old artifact aside."""
    out = tmp_path / "art"
    _write(out, "old")
    aside = tmp_path / ".art.old-0badf00d"
    os.rename(out, aside)
    removed = clean_leftovers(out)
    assert removed == [".art.old-0badf00d (put back as art)"] and _which(out) == "old"
    # with out there again, an old artifact aside is the one the swap replaced: removed
    _layout(tmp_path / ".art.old-feedf00d", "older")
    assert clean_leftovers(out) == [".art.old-feedf00d"] and _which(out) == "old"


def test_the_next_writer_reports_what_it_cleaned(tmp_path):
    out = tmp_path / "art"
    _write(out, "old")
    dead, fd = work_dir_beside(out)
    os.close(fd)  # the flock goes with the fd, as with a killed process
    dest, _ = _write(out, "new")
    assert dest.cleaned == [dead.name] and _siblings(out) == [] and _which(out) == "new"
