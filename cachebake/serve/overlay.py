"""The overlay, ``$CACHEBAKE_OVERLAY_DIR``: private to the server's uid, or refused.

The overlay is where a server's misses go (cachebake.serve.layered) and, by default, its miss
log (cachebake.serve.misslog).  Whoever can write into it decides what the server loads: a
planted kernel is served as a hit, a planted launcher ``.so`` is dlopened, a symlinked
``triton`` or ``misses.jsonl`` sends the server's writes wherever it points.  So a process
uses the overlay only when it is its own:

- made by this process: ``mkdir`` mode 0700 (``fchmod`` to exactly that, whatever the umask),
  and so are ``triton/`` and each key dir inside it;
- found: used only if it is a directory, not a symbolic link (opened O_NOFOLLOW), owned by this
  process's euid and not group- or world-writable; so is every directory inside it that is
  used.  Otherwise the whole overlay is refused: one line on stderr per process saying why, and
  the caller keeps its misses in its private spill (a miss costs a compile, never the server,
  never a write through someone else's path).

The root is pinned by fd once per process, and everything inside it is opened relative to
that fd with O_NOFOLLOW (O_NONBLOCK too, so a FIFO never blocks) and checked with fstat of what
was opened (a regular file, ours, of bounded size), as install does (cachebake.fsops,
cachebake.jsonio.open_regular).  Triton opens the paths it is handed by name, so before one is
handed out the overlay's name is checked to still be the pinned directory: its parent may let
others rename entries (an emptyDir is 0777, kubernetes/kubernetes#76158), while nobody else can
change anything inside a 0700 directory of ours.

The functions below return a reason (a string) or None rather than raising: they run on the
server's cache lookups, where a refusal is a miss, never an exception.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import uuid
from typing import Optional

from cachebake.fsops import DIR_FLAGS, read_at_most, write_all
from cachebake.roles import OVERLAY_ENV

ROLE = "triton"  # the overlay mirrors an installed tree: <overlay>/triton/<KEY>/...
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
APPEND_FLAGS = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                | getattr(os, "O_NOCTTY", 0))
PRIVATE_DIR_MODE = 0o700
FILE_MODE = 0o644  # what Triton's own manager gives its files; the dirs above them are 0700
FOREIGN_WRITE = stat.S_IWGRP | stat.S_IWOTH


class Refused(Exception):
    """An overlay path that is not this process's own; the message says why."""


class OverlayRefused(Refused):
    """The whole overlay is refused; its own stderr line has said why."""

    def __init__(self) -> None:
        super().__init__("the overlay is refused")


_warned: set = set()


def warn_once(message: str, key=None) -> None:
    """One stderr line per process and ``key`` (default: the message up to its first ';')."""
    key = message.split(";")[0] if key is None else key
    if key not in _warned:
        _warned.add(key)
        print(message, file=sys.stderr, flush=True)


def describe(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_error(e: OSError) -> str:
    if e.errno == 40:  # ELOOP: O_NOFOLLOW met a symbolic link
        return "is a symbolic link"
    if e.errno == 20:  # ENOTDIR: O_DIRECTORY met something else
        return "is not a directory"
    if e.errno == 6:  # ENXIO: a FIFO with no reader, opened for writing with O_NONBLOCK
        return "is a FIFO"
    return f"cannot be opened ({e.strerror or e})"


def file_problem(st: os.stat_result, uid: Optional[int], cap: int) -> Optional[str]:
    """Why the (f/l)stat ``st`` is not a cache file to hand Triton (None: it is one)."""
    if not stat.S_ISREG(st.st_mode):
        return f"is {describe(st.st_mode)}, not a regular file"
    if uid is not None and st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not this process's uid {uid}"
    if st.st_size > cap:
        return f"is {st.st_size} bytes, over the {cap} accepted"
    return None


def dir_problem(st: os.stat_result, uid: int) -> Optional[str]:
    if not stat.S_ISDIR(st.st_mode):
        return f"is {describe(st.st_mode)}, not a directory"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not this process's uid {uid}"
    if st.st_mode & FOREIGN_WRITE:
        return f"is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def read_bounded(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of ``fd`` (fewer if it shrank): never more, whatever the file
    does meanwhile (``fsops.read_at_most``)."""
    return read_at_most(fd, size)


def open_private_dir(parent_fd: int, name: str, uid: int, create: bool) -> int:
    """The fd of directory ``name`` below ``parent_fd``: made mode 0700 if absent and
    ``create``; FileNotFoundError if absent otherwise; Refused unless it is a directory (not a
    link) of ours that nobody else can write."""
    created = False
    if create:
        try:
            os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=parent_fd)
            created = True
        except FileExistsError:
            pass
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        # Say what is there (O_NOFOLLOW|O_DIRECTORY gives ENOTDIR for a link) and, for EACCES,
        # whose it is: the likelier news than the errno (another uid's 0700 dir).
        why = open_error(e)
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            why = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else dir_problem(st, uid) or why)
        except OSError:
            pass
        raise Refused(why) from None
    try:
        st = os.fstat(fd)
        if created and st.st_uid == uid and stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
            os.fchmod(fd, PRIVATE_DIR_MODE)  # the umask may have taken bits (or mkdir lost a race)
            st = os.fstat(fd)
        why = dir_problem(st, uid)
        if why:
            raise Refused(why)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Overlay:
    """One process's view of one overlay path: unchecked, pinned (its root fd held after the
    checks) or refused (for the rest of the process)."""

    def __init__(self, path: str):
        self.path = path  # as the environment gives it; the paths handed to Triton start with it
        self.lock = threading.Lock()
        self.uid = os.geteuid()
        self.root_fd: Optional[int] = None
        self.root_stat: Optional[os.stat_result] = None
        self.triton_fd: Optional[int] = None
        self.refused: Optional[str] = None

    # -- the root ---------------------------------------------------------------------------

    def refuse(self, why: str) -> None:
        """Refuse this overlay for the rest of the process, saying why once.  Its fds stay open
        (two at most): another thread may be using them, and a closed fd's number is reused."""
        with self.lock:
            if self.refused is None:
                self.refused = why
        warn_once(f"cachebake: the overlay {self.path} is refused: {why}; pid {os.getpid()} keeps "
                  "its misses in a private spill (recompiled by each process) and logs them to "
                  "stderr unless CACHEBAKE_MISS_LOG is outside the overlay", key=("overlay", self.path))

    def root(self, create: bool) -> Optional[int]:
        """The pinned root fd; None when refused, or absent and not ``create``.  Raises OSError
        when it cannot be made (read-only, full, no permission: the caller spills)."""
        if self.refused is not None:
            return None
        if self.root_fd is not None:
            return self.root_fd
        why = None
        with self.lock:
            if self.root_fd is None and self.refused is None:
                try:
                    self._pin(create)
                except FileNotFoundError:
                    if create:
                        raise
                    return None
                except Refused as e:
                    why = str(e)
        if why is not None:
            self.refuse(why)
            return None
        return self.root_fd if self.refused is None else None

    def _pin(self, create: bool) -> None:
        path = self.path
        if not os.path.isabs(path):
            raise Refused("it is not an absolute path")
        parent, name = os.path.split(os.path.normpath(path))
        if not name:
            raise Refused("it is the root directory")
        if create:
            os.makedirs(parent, exist_ok=True)  # above the overlay: the operator's own path
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = open_private_dir(parent_fd, name, self.uid, create)
        except Refused as e:
            raise Refused(f"it {e}") from None
        finally:
            os.close(parent_fd)
        self.root_stat = os.fstat(fd)
        self.root_fd = fd

    def still_pinned(self) -> bool:
        """Whether the overlay's name still leads to the pinned directory (the paths handed to
        Triton are opened by name); refuses the overlay if not."""
        try:
            same = os.path.samestat(os.stat(self.path), self.root_stat)
        except (OSError, TypeError):
            same = False
        if not same:
            self.refuse("its path no longer leads to the directory this process checked "
                        "(renamed or replaced)")
        return same

    # -- inside it ---------------------------------------------------------------------------

    def key_dir(self, key: str, create: bool) -> Optional[int]:
        """An fd of ``<overlay>/triton/<key>`` for the caller to close; None when absent (and
        not ``create``) or refused.  OSError when it cannot be made."""
        root = self.root(create)
        if root is None:
            return None
        where = f"{ROLE}/"
        try:
            if self.triton_fd is None:
                fd = open_private_dir(root, ROLE, self.uid, create)
                with self.lock:
                    if self.triton_fd is None:
                        self.triton_fd, fd = fd, None
                if fd is not None:  # another thread pinned it first
                    os.close(fd)
            where = f"{ROLE}/{key}/"
            return open_private_dir(self.triton_fd, key, self.uid, create)
        except FileNotFoundError:
            if create:
                raise
            return None
        except Refused as e:
            self.refuse(f"its {where} {e}")
            return None

    def path_of(self, key: str, filename: str) -> Optional[str]:
        """The path Triton is handed for an overlay file, or None if the overlay was swapped."""
        return f"{self.path}/{ROLE}/{key}/{filename}" if self.still_pinned() else None

    def write(self, key: str, filename: str, data: bytes) -> Optional[str]:
        """Write one entry as Triton's FileCacheManager does (a ``tmp.pid_*`` dir, then
        rename), so processes sharing the overlay never read a partial file; every step
        relative to the overlay's fds, no link followed, nothing left on failure.  The path, or
        None when the overlay is refused; OSError when it cannot be written."""
        if "/" in filename or filename in ("", ".", ".."):
            raise OSError(22, f"not a plain file name: {filename!r}")
        kfd = self.key_dir(key, create=True)
        if kfd is None:
            return None
        try:
            tmp = f"tmp.pid_{os.getpid()}_{uuid.uuid4()}"
            os.mkdir(tmp, PRIVATE_DIR_MODE, dir_fd=kfd)
            try:
                tfd = os.open(tmp, DIR_FLAGS, dir_fd=kfd)
                try:
                    fd = os.open(filename, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 FILE_MODE, dir_fd=tfd)
                    try:
                        write_all(fd, data)
                    finally:
                        os.close(fd)
                    os.replace(filename, filename, src_dir_fd=tfd, dst_dir_fd=kfd)
                finally:
                    try:
                        os.unlink(filename, dir_fd=tfd)
                    except OSError:
                        pass
                    os.close(tfd)
            finally:
                try:
                    os.rmdir(tmp, dir_fd=kfd)
                except OSError:
                    pass
        finally:
            os.close(kfd)
        return self.path_of(key, filename)

    def open_append(self, relpath: str) -> int:
        """An O_APPEND fd of the file ``relpath`` inside the overlay (the miss log), its dirs
        made private on the way.  Raises OverlayRefused when the overlay is refused, Refused
        when the file is a link, not a regular file, not ours or has other hard links; OSError
        when it cannot be made."""
        parts = [p for p in relpath.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise Refused(f"{relpath!r} is not a path inside the overlay")
        root = self.root(create=True)
        if root is None:
            raise OverlayRefused()
        opened: list[int] = []
        dir_fd = root
        try:
            for part in parts[:-1]:
                try:
                    dir_fd = open_private_dir(dir_fd, part, self.uid, create=True)
                except Refused as e:
                    self.refuse(f"its {part}/ {e}")
                    raise OverlayRefused() from None
                opened.append(dir_fd)
            try:
                fd = os.open(parts[-1], APPEND_FLAGS, FILE_MODE, dir_fd=dir_fd)
            except OSError as e:
                if e.errno in (6, 20, 40):
                    raise Refused(f"it {open_error(e)}") from None
                raise
            st = os.fstat(fd)
            why = file_problem(st, self.uid, 1 << 62) or (
                f"has {st.st_nlink} hard links" if st.st_nlink != 1 else None)
            if why is not None or not self.still_pinned():
                os.close(fd)
                raise Refused(f"it {why}") if why else OverlayRefused()
            os.set_blocking(fd, True)
            return fd
        finally:
            for fd in opened:
                os.close(fd)


_overlays: dict[str, Overlay] = {}


def current() -> Optional[Overlay]:
    """This process's overlay, per ``$CACHEBAKE_OVERLAY_DIR`` (None when unset)."""
    path = os.environ.get(OVERLAY_ENV)
    if not path:
        return None
    found = _overlays.get(path)
    if found is None:
        found = _overlays.setdefault(path, Overlay(path))
    return found


def _after_fork_in_child() -> None:
    # A fork may copy a lock held by another thread; the child's copies of the fds are its
    # own and stay valid (the same directories), so only the locks are renewed.
    for overlay in _overlays.values():
        overlay.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
