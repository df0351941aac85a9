"""The on-disk layout of an installed bake, and the atomic swap that replaces it.

    DIR/
      triton -> .cachebake/current/triton     one relative symlink per role (TRITON_CACHE_DIR)
      .cachebake/
        lock                                  flock(2) target: one installer at a time
        current -> versions/<v>               THE switch: one rename(2) replaces every role
        versions/<digest12>-<rand>/           complete, synced trees; install.json (the marker)
        staging/<rand>/                       an install in progress (or a killed one's leftovers)

Why this shape: DIR itself is usually a mount point (an emptyDir or hostPath volume), which
cannot be renamed or replaced by a symlink, so the swap happens inside it.  A single
``current`` symlink switches all roles at once; the role symlinks never change target and are
relative, so the tree stays valid when the volume is mounted at another path in the serving
container.  Everything is written inside DIR: a read-only root filesystem is fine as long as
DIR is writable, and every rename stays on one filesystem.

Crash safety: a version directory is renamed into ``versions/`` only after its contents are
synced, and ``current`` is switched only after that, so a SIGKILL at any point leaves DIR/<role>
resolving to the old tree (or nothing, on a first install) or to the complete new one.  The
next installer, holding the lock, deletes staging dirs, temporary links, versions other than
``current`` and role links that ``current`` no longer backs.

The lock is flock(2): reliable on local filesystems (emptyDir, hostPath); on NFS it depends on
the server's lock support.

Files a server writes into the cache later (a kernel the bake missed) land in the current
version directory and go away with it when a new bake is installed.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import secrets
import shutil
import signal
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cachebake.errors import BadInput, Locked
from cachebake.roles import ROLE_ENV

STATE = ".cachebake"
MARKER = "install.json"

# -- test hook -------------------------------------------------------------------------------
# CACHEBAKE_TEST_KILL_AT=<n>: SIGKILL ourselves at the n-th checkpoint (1-based).  Used by the
# crash tests to cut an install at every step of the commit and inside the extraction.
_checkpoints = 0


def checkpoint(_what: str = "") -> None:
    global _checkpoints
    _checkpoints += 1
    kill_at = os.environ.get("CACHEBAKE_TEST_KILL_AT")
    if kill_at and int(kill_at) == _checkpoints:
        os.kill(os.getpid(), signal.SIGKILL)


def checkpoints_passed() -> int:
    return _checkpoints


# -- durability ------------------------------------------------------------------------------
_libc = None


def sync_tree(path: str) -> None:
    """Make everything under ``path`` durable before it is renamed into place.

    syncfs(2) flushes the filesystem holding ``path`` in one call, far cheaper than an fsync
    per file for thousands of small cache files; where it is missing, fsync each file and dir.
    """
    global _libc
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc is None:
            # CDLL(None): the symbols already loaded (libc among them).  find_library would
            # run ldconfig/gcc, which a read-only root filesystem may not allow.
            _libc = ctypes.CDLL(None, use_errno=True)
        if getattr(_libc, "syncfs", None) is not None and _libc.syncfs(fd) == 0:
            return
    except OSError:
        pass
    finally:
        os.close(fd)
    for root, dirs, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- layout ----------------------------------------------------------------------------------
class InstallDir:
    """DIR and its state directory; every method that writes expects the lock to be held."""

    def __init__(self, to: str | os.PathLike):
        self.root = Path(os.path.abspath(to))
        self.state = self.root / STATE
        self.versions = self.state / "versions"
        self.staging = self.state / "staging"
        self.current = self.state / "current"

    # read-only checks (safe without the lock: every state they read is switched atomically)
    def check_usable(self, roles: list[str]) -> None:
        """Refuse a DIR we would have to clobber; before anything is written."""
        if self.root.exists() and not self.root.is_dir():
            raise BadInput(f"--to {self.root} exists and is not a directory")
        for role in roles:
            p = self.root / role
            # One lstat, then readlink: a racing install may create the link between two
            # separate checks (is_symlink() False, then exists() True through the new link).
            try:
                is_link = stat.S_ISLNK(os.lstat(p).st_mode)
                if is_link and os.readlink(p) != self.role_link(role):
                    raise BadInput(f"{p} is a symlink not made by cachebake; remove it")
            except FileNotFoundError:
                continue
            if not is_link:
                raise BadInput(f"{p} exists and is not managed by cachebake; remove it or "
                               "install into another directory")

    def check_space(self, needed: int) -> None:
        """Refuse before writing when the bake cannot fit (a half-filled disk helps nobody)."""
        probe = self.root
        while not probe.exists():
            probe = probe.parent
        st = os.statvfs(probe)
        free = st.f_bavail * st.f_frsize
        # file data plus a block per entry's rounding, roughly; an old version stays until the switch
        if needed > free:
            raise BadInput(f"{probe}: {free / 1e6:.0f} MB free, the bake needs {needed / 1e6:.0f} MB")

    @staticmethod
    def role_link(role: str) -> str:
        return f"{STATE}/current/{role}"

    def installed(self) -> dict | None:
        """The marker of the complete installed version, or None."""
        try:
            version = os.readlink(self.current)
            marker = json.loads((self.state / version / MARKER).read_text())
        except (OSError, ValueError):
            return None
        for role in marker.get("roles", []):
            try:  # readlink alone: a racing cleanup may remove the link between two checks
                if os.readlink(self.root / role) != self.role_link(role):
                    return None
            except OSError:
                return None
        return marker

    def has_leftovers(self) -> bool:
        """Anything a killed install left (checked without the lock; cleaned under it)."""
        try:
            if self.staging.is_dir() and any(self.staging.iterdir()):
                return True
            if self.versions.is_dir() and len(list(self.versions.iterdir())) > 1:
                return True
        except OSError:
            return True
        return bool(list(self.state.glob("current.tmp-*")) or list(self.root.glob(".*.cachebake-tmp-*")))

    # writes (lock held)
    @contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        self.state.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() > deadline:
                        raise Locked(f"another install holds {self.state / 'lock'} for over "
                                     f"{timeout:.0f} s") from None
                    time.sleep(0.05)
            checkpoint("locked")
            yield
        finally:
            os.close(fd)  # closing drops the flock; a SIGKILLed holder drops it too

    def clean_leftovers(self, keep_roles: set[str] = frozenset()) -> list[str]:
        """Remove what killed installs left behind; returns what was removed."""
        removed = []
        current = self._current_version()
        for d in (self.staging, self.versions):
            if not d.is_dir():
                continue
            for entry in sorted(d.iterdir()):
                if d == self.versions and entry.name == current:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(str(entry.relative_to(self.root)))
                checkpoint("clean")
        tmp_links = list(self.state.glob("current.tmp-*")) + list(self.root.glob(".*.cachebake-tmp-*"))
        for entry in sorted(tmp_links):
            entry.unlink(missing_ok=True)
            removed.append(str(entry.relative_to(self.root)))
        backed = set(self._roles_of(current)) | set(keep_roles)
        for role in ROLE_ENV:
            p = self.root / role
            if role not in backed and p.is_symlink() and os.readlink(p) == self.role_link(role):
                p.unlink()
                removed.append(role)
        return removed

    def new_staging(self) -> Path:
        self.staging.mkdir(parents=True, exist_ok=True)
        path = self.staging / secrets.token_hex(8)
        path.mkdir(mode=0o755)
        os.chmod(path, 0o755)
        checkpoint("staged")
        return path

    def commit(self, staged: Path, digest: str, marker: dict, roles: list[str]) -> str:
        """Sync ``staged``, move it into versions/, link roles, switch ``current``; returns v."""
        (staged / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        os.chmod(staged / MARKER, 0o644)
        sync_tree(str(staged))
        checkpoint("synced")
        self.versions.mkdir(exist_ok=True)
        version = f"{digest.split(':')[-1][:12]}-{secrets.token_hex(4)}"
        os.rename(staged, self.versions / version)
        fsync_path(str(self.versions))
        checkpoint("renamed")
        for role in roles:  # dangling until the first switch; never retargeted afterwards
            p = self.root / role
            if not p.is_symlink():
                tmp = self.root / f".{role}.cachebake-tmp-{secrets.token_hex(4)}"
                os.symlink(self.role_link(role), tmp)
                os.rename(tmp, p)
                checkpoint("role-link")
        fsync_path(str(self.root))
        tmp = self.state / f"current.tmp-{secrets.token_hex(4)}"
        os.symlink(f"versions/{version}", tmp)
        checkpoint("current-tmp")
        os.rename(tmp, self.current)  # the atomic switch
        fsync_path(str(self.state))
        checkpoint("switched")
        return version

    # helpers
    def _current_version(self) -> str | None:
        try:
            return os.path.basename(os.readlink(self.current))
        except OSError:
            return None

    def _roles_of(self, version: str | None) -> list[str]:
        if version is None:
            return []
        try:
            return json.loads((self.versions / version / MARKER).read_text()).get("roles", [])
        except (OSError, ValueError):
            return []
