"""System calls install needs beyond ``os``, all relative to directory fds, never following
a link: renameat2(RENAME_NOREPLACE), syncfs, fstatfs's filesystem type, a link-safe
recursive remove, and a whole write to an fd."""

from __future__ import annotations

import ctypes
import errno
import os
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_libc = None
# renameat2(2) flags (linux/fs.h) and the dir fd that means "relative to the cwd"
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        # CDLL(None): the symbols already loaded (libc among them).  find_library would run
        # ldconfig/gcc, which a read-only root filesystem may not allow.
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def renameat2(src: os.PathLike | str, dst: os.PathLike | str, flags: int, *, src_dir_fd: int = AT_FDCWD,
              dst_dir_fd: int = AT_FDCWD) -> bool:
    """renameat2(2) through libc: True when done; False where libc, the kernel or the
    filesystem lacks it or ``flags`` (glibc < 2.28, Linux < 3.15: ENOSYS, EINVAL, EOPNOTSUPP);
    an OSError naming ``dst`` for anything else.  The one call of it (install's no-replace
    rename, pack's exchange of --out)."""
    fn = getattr(_c(), "renameat2", None)
    if fn is None:
        return False
    if fn(src_dir_fd, os.fsencode(src), dst_dir_fd, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(dst))


def rename_noreplace(src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
    """rename(2) that fails with EEXIST instead of replacing ``dst``: renameat2's
    RENAME_NOREPLACE where libc and the kernel have it (glibc >= 2.28, Linux >= 3.15 on local
    filesystems), else a check that ``dst`` is absent followed by rename(2), under our lock."""
    if renameat2(src, dst, RENAME_NOREPLACE, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd):
        return
    if lexists(dst, dst_dir_fd):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


def read_at_most(fd: int, limit: int) -> bytes:
    """What ``fd`` holds from its offset, up to end of file and never more than ``limit``
    bytes, whatever the file does meanwhile (it may grow or shrink while it is read).  One
    read(2) in the common case of a regular file no larger than ``limit``.  The one bounded
    read: a caller that must know the file was larger asks for ``cap + 1``."""
    data = os.read(fd, limit)
    if not data or len(data) >= limit:
        return data
    chunks, total = [data], len(data)
    while total < limit:
        chunk = os.read(fd, min(limit - total, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (os.write may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def sync_tree(fd: int) -> None:
    """Make everything below directory ``fd`` durable before it is renamed into place.

    syncfs(2) flushes the filesystem in one call, far cheaper than an fsync per file for
    thousands of small cache files; where it is missing, fsync each file and directory."""
    try:
        if getattr(_c(), "syncfs", None) is not None and _c().syncfs(fd) == 0:
            return
    except OSError:
        pass
    for entry in os.scandir(fd):
        flags = (DIR_FLAGS if entry.is_dir(follow_symlinks=False) else os.O_RDONLY | os.O_NOFOLLOW)
        sub = os.open(entry.name, flags | os.O_CLOEXEC, dir_fd=fd)
        try:
            if entry.is_dir(follow_symlinks=False):
                sync_tree(sub)
            else:
                os.fsync(sub)
        finally:
            os.close(sub)
    os.fsync(fd)


# statfs(2) f_type of the filesystems that keep files in memory only (linux/magic.h)
MEMORY_FS_TYPES = frozenset({0x01021994, 0x858458F6})  # TMPFS_MAGIC, RAMFS_MAGIC


def in_memory(fd: int) -> bool:
    """Whether ``fd``'s filesystem is tmpfs or ramfs (False when that cannot be told).

    ``os.statvfs`` does not return the type; fstatfs(2) does, in ``f_type``, the first word of
    struct statfs on every Linux ABI (a long; 256 bytes cover the struct everywhere)."""
    buf = ctypes.create_string_buffer(256)
    fn = getattr(_c(), "fstatfs", None)
    if fn is None or fn(fd, buf) != 0:
        return False
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF in MEMORY_FS_TYPES


def lexists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def readlink(name: str, dir_fd: int) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:  # absent, or not a link
        return None


def rmtree_at(parent_fd: int, name: str) -> None:
    """Remove ``name`` below ``parent_fd`` and everything in it, never following a link:
    each directory is opened O_NOFOLLOW relative to its parent's fd (shutil.rmtree takes a
    dir_fd only from Python 3.11; install supports 3.10)."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        if not os.path.samestat(st, os.fstat(fd)):
            return  # replaced while we looked: not ours to remove
        for entry in list(os.scandir(fd)):
            if entry.is_dir(follow_symlinks=False):
                rmtree_at(fd, entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def rmdir_quiet(name: str, dir_fd: int) -> bool:
    try:
        os.rmdir(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False
