"""The destination of a command that writes an artifact (``pack``, ``merge``): ``--out``,
written whole or not at all.

Each writer decides what goes into the artifact; the destination owns where it is written and
how that ends, as pypa/installer's destination owns ``finalize_installation``: one private
temp sibling of ``--out`` to write in (``work_dir_beside``), what killed writers left beside
``--out`` removed first (``clean_leftovers``), and one finalize step (``finalize``): every
file world-readable, every file fsync'ed, the new artifact swapped into place (one
renameat2(RENAME_EXCHANGE) when ``--out`` exists), the old one removed.  An interrupted,
killed or refused writer leaves ``--out`` as it was or the new artifact, never neither.

A writer runs::

    dest = ArtifactDestination(out, checkpoint)
    try:
        with DeferredInterrupt() as interrupts, dest.open(interrupts) as tmp:
            ...                       # write the artifact into tmp, dest.step("...") between steps
            dest.finalize()
    except KeyboardInterrupt:
        raise Interrupted(dest.left()) from None
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cachebake import fsops
from cachebake.artifact import oci
from cachebake.errors import CachebakeError, DeferredInterrupt

__all__ = ["ArtifactDestination", "clean_leftovers", "no_checkpoint", "work_dir_beside"]

# The siblings of --out a writer makes: its temp dir (the new artifact, then the old one after
# the exchange) and, from cachebake 0.1 or without RENAME_EXCHANGE, the old artifact set aside.
_TMP_PREFIX = ".%s.tmp-"
_OLD_PREFIX = ".%s.old-"

# The steps of ``finalize``, in order ("aside" only where two renames stand in for the exchange):
# a test's checkpoint kills or interrupts the writer at each of them.
FINALIZE_STEPS = ("written", "aside", "swapped", "old-removed")


def no_checkpoint(_what: str = "") -> None:
    """The default checkpoint: nothing happens between steps (the crash tests pass one that
    kills the process at the n-th step, as install's do)."""


class ArtifactDestination:
    """``out`` and the temp dir beside it that a writer fills; ``finalize`` makes it ``out``.

    ``checkpoint`` is called with the name of each step (the writer's own, through ``step``,
    and ``finalize``'s, FINALIZE_STEPS); a Ctrl-C is raised at those steps only, where
    ``left`` says what was left."""

    def __init__(self, out: Path, checkpoint: Callable[[str], None] = no_checkpoint, command: str = "pack"):
        self.out = out
        self.command = command  # for the line: "the pack had finished"
        self.checkpoint = checkpoint
        self.swapped = False  # out holds the new artifact
        self.cleaned: list[str] = []  # what killed writers into out left beside it
        self.tmp: Path | None = None
        self._lock_fd: int | None = None
        self._interrupts: DeferredInterrupt | None = None

    def left(self) -> str:
        """What ``out`` holds now, for the line a Ctrl-C or an OS error prints."""
        if self.swapped:
            return f"{self.out} holds the new artifact: the {self.command} had finished"
        return f"nothing written: {self.out} is as it was"

    def check_interrupt(self) -> None:
        """Raise a Ctrl-C recorded since the last step (between files: no checkpoint)."""
        if self._interrupts is not None:
            self._interrupts.check()

    def step(self, what: str) -> None:
        self.checkpoint(what)
        self.check_interrupt()

    @contextmanager
    def open(self, interrupts: DeferredInterrupt | None = None) -> Iterator[Path]:
        """Remove what killed writers left beside ``out``, then yield a fresh private dir
        beside it to write the artifact in.  Left without ``finalize`` (an error, a Ctrl-C),
        the dir is removed: ``out`` is as it was."""
        self._interrupts = interrupts
        self.cleaned = clean_leftovers(self.out)
        self.tmp, self._lock_fd = work_dir_beside(self.out)
        try:
            yield self.tmp
        finally:
            self._close()

    def finalize(self) -> None:
        """Make the artifact written in the temp dir ``out``: world-readable, on disk, swapped
        into place, the old artifact removed (even on Ctrl-C; a kill leaves it to the next
        writer's ``clean_leftovers``)."""
        assert self.tmp is not None, "finalize outside open()"
        try:
            world_readable(self.tmp)
            fsync_tree(self.tmp)
            self.step("written")
            old = _swap_into_place(self.tmp, self.out, self)
        finally:
            self._close()
        try:
            self.step("swapped")
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        self.step("old-removed")

    def _close(self) -> None:
        if self.tmp is not None and not self.swapped:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def world_readable(root: Path) -> None:
    """0755 directories, 0644 files, whatever the umask: mkdtemp and NamedTemporaryFile create
    0700/0600, and an init container installs as another, unprivileged user."""
    os.chmod(root, 0o755)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)


def fsync_tree(root: Path) -> None:
    """Every file under ``root`` on disk before the swap makes it ``out``."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def work_dir_beside(out: Path, kind: str = "") -> tuple[Path, int]:
    """A fresh private dir beside ``out`` (``.OUT.tmp-[KIND-]XXXXXXXX``) for a command that
    writes ``out``, and an fd holding its flock: the caller keeps the fd open while the dir is
    in use and closes it after removing the dir.  A killed command's dir is then the next
    writer's to remove (``clean_leftovers``: the name, the owner, no live holder of the lock;
    the kernel drops a flock when its process dies, where a pid could have been reused)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX % out.name + (f"{kind}-" if kind else ""),
                                dir=out.parent))
    lock_fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    return tmp, lock_fd


def clean_leftovers(out: Path) -> list[str]:
    """Remove what killed writers into ``out`` left beside it; returns their names.  A temp dir
    is ours to remove once no live writer holds its flock; an old artifact set aside by a writer
    killed between its two renames is put back when ``out`` is missing (else removed)."""
    removed = []
    try:
        names = sorted(os.listdir(out.parent))
    except FileNotFoundError:
        return removed
    for name in names:
        if not name.startswith((_TMP_PREFIX % out.name, _OLD_PREFIX % out.name)):
            continue
        path = out.parent / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # not a directory, or gone: not a writer's
            continue
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a writer in progress
            if name.startswith(_OLD_PREFIX % out.name) and not os.path.lexists(out) and oci.is_artifact(path):
                os.rename(path, out)
                removed.append(f"{name} (put back as {out.name})")
            else:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
        finally:
            os.close(fd)
    return removed


def _swap_into_place(tmp: Path, out: Path, dest: ArtifactDestination) -> Path | None:
    """Make the finished artifact ``out``; returns where the artifact ``out`` held before now
    is (for the caller to remove), or None.  An existing ``out`` is exchanged with ``tmp`` in
    one renameat2(RENAME_EXCHANGE): at every moment ``out`` is the old artifact or the new
    one.  Where the kernel or filesystem lacks it, two renames, and a kill between them
    leaves the old artifact beside ``out``, which the next writer puts back."""
    if not os.path.lexists(out):
        os.rename(tmp, out)
        dest.swapped = True
        return None
    if _rename_exchange(tmp, out):
        dest.swapped = True
        return tmp
    aside = out.parent / f"{_OLD_PREFIX % out.name}{secrets.token_hex(4)}"
    os.rename(out, aside)
    try:
        dest.step("aside")
        os.rename(tmp, out)
    except BaseException as e:  # Ctrl-C between the renames too: the old artifact goes back
        os.rename(aside, out)
        if isinstance(e, OSError):
            raise CachebakeError(f"could not move the new artifact into {out}: {e.strerror}") from None
        raise
    dest.swapped = True
    return aside


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically; False where renameat2 or RENAME_EXCHANGE is missing
    (glibc < 2.28, Linux < 3.15, a filesystem without it), an OSError for anything else."""
    return fsops.renameat2(a, b, fsops.RENAME_EXCHANGE)
