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

A hostile DIR (a co-tenant prepared it, or races us in it): DIR must not be a symlink; every
path under ``DIR/.cachebake`` is opened relative to a directory fd with O_NOFOLLOW and checked
with fstat to be a directory (or regular file) owned by the installing uid and not writable
by others, else BadInput (exit 3) names it.  No path below DIR is resolved from a string
twice, and cleanup (``rmtree_at``) walks directory fds, so nothing outside DIR is ever
written or removed.  Role links are made with symlink(2) itself, which never replaces
anything: if ``DIR/<role>`` appears between our check and our link, the install is refused
and the newcomer is left alone.  Removing the link of a role the new bake dropped is a
readlink-then-unlink under the lock: a co-tenant who can write DIR and swaps the link for a
file of their own in the microseconds between the two loses that file (the residual window;
it needs write access to DIR, which already lets them remove our links).

Crash safety: a version directory is renamed into ``versions/`` only after its contents are
synced, and ``current`` is switched only after that, so a SIGKILL at any point leaves DIR/<role>
resolving to the old tree (or nothing, on a first install) or to the complete new one.  The
next installer, holding the lock, deletes staging dirs, temporary links, versions other than
``current`` and role links that ``current`` no longer backs.

The lock is flock(2): reliable on local filesystems (emptyDir, hostPath); on NFS it depends on
the server's lock support.  After taking it the installer checks that DIR, ``.cachebake`` and
the lock file are still the ones at those names (a refused first install removes them again).

The destination owns its layout and its finalize step, as umoci's oci/cas and pypa/installer's
``_core.install`` do: an install is one ``with dest.transaction(timeout) as tx:`` (the lock,
the leftovers cleaned, a staging dir), the caller writes into ``tx.staged_fd``, and only
``tx.commit(marker)`` makes anything visible (marker, sync, role links, the switch); any
exception, or leaving the block without a commit, undoes what the transaction did.

``checkpoint``: a callable each step calls with its name (the crash tests pass one that kills
the process at the n-th call, tests/kit/installkit.py); a no-op by default.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cachebake import jsonio
from cachebake.errors import BadInput, DeferredInterrupt, Locked, from_os_error
from cachebake.fsops import (DIR_FLAGS, lexists, readlink, rename_noreplace, rmdir_quiet,
                                     rmtree_at, sync_tree, write_all)
from cachebake.install.inventory import MARKER, InstallMarker, check_tree
from cachebake.roles import ROLE_ENV

STATE = ".cachebake"
CAP_MARKER = 256 << 20
VERSION_RE = re.compile(r"^[0-9a-f]{12}-[0-9a-f]{8}$")

def no_checkpoint(_what: str = "") -> None:
    """The default checkpoint: nothing happens between steps."""


# -- layout ----------------------------------------------------------------------------------
class InstallDir:
    """DIR and its state directory, reached through directory fds only."""

    def __init__(self, to: str | os.PathLike, *, sync: bool = True,
                 checkpoint: Callable[[str], None] = no_checkpoint):
        """``sync`` False: no syncfs and no fsync (``install --no-sync``); the order of the
        steps still leaves the old tree or the new one, and a crash before writeback can
        leave new files empty, which the next install's tree check finds and repairs.
        ``checkpoint``: called at each step (module doc), on the installing thread."""
        self.root = Path(os.path.abspath(to))
        self.sync = sync
        self._checkpoint = checkpoint
        # Ctrl-C is taken at steps only (errors.DeferredInterrupt), while an install runs
        # ``with dest.interrupts:``
        self.interrupts = DeferredInterrupt()
        self.state = self.root / STATE
        self.uid = os.geteuid()
        self.root_fd: int | None = None
        self.state_fd: int | None = None
        self._created: list[Path] = []  # DIR (and parents) this install made, outermost last
        # the roles a version's marker lists: a version never changes once renamed into
        # versions/ (its name is unique), so what this process wrote or read stays true
        self._roles_by_version: dict[str, list[str]] = {}
        self._created_state = False
        self._links_made: list[str] = []
        self.pending_version: str | None = None  # the version commit() is switching to

    def checkpoint(self, what: str) -> None:
        """A step boundary: the injected checkpoint, then a pending Ctrl-C is raised here."""
        self._checkpoint(what)
        self.interrupts.check()

    # -- opening ----------------------------------------------------------------------------
    def _open_root(self, create: bool) -> int | None:
        if create and not os.path.lexists(self.root):
            missing = []
            p = self.root
            while not os.path.lexists(p):
                missing.append(p)
                p = p.parent
            for d in reversed(missing):
                try:
                    os.mkdir(d, 0o755)
                    self._created.insert(0, d)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise from_os_error(e, self.root, "cannot create it") from None
        try:
            fd = os.open(self.root, DIR_FLAGS)
        except FileNotFoundError:
            if create:
                raise BadInput(f"--to {self.root}: removed while installing") from None
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise BadInput(f"--to {self.root} is a symbolic link or not a directory; pass the real "
                               "directory") from None
            raise
        return fd

    def _open_dir(self, parent_fd: int, name: str, shown: Path, create: bool = False) -> int | None:
        """A directory below DIR: no link, ours, not writable by others (else BadInput)."""
        if create:
            try:
                os.mkdir(name, 0o755, dir_fd=parent_fd)
                if name == STATE:
                    self._created_state = True
            except FileExistsError:
                pass
            except OSError as e:  # DIR not writable for this uid, read-only, full
                raise from_os_error(e, shown, "cannot create it") from None
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise BadInput(f"{shown} is a symbolic link or not a directory; refusing to use it "
                               "(remove it, or install into another directory)") from None
            raise
        self._check_owned(fd, shown)
        return fd

    def _check_owned(self, fd: int, shown: Path) -> os.stat_result:
        st = os.fstat(fd)
        if st.st_uid != self.uid:
            os.close(fd)
            raise BadInput(f"{shown} is owned by uid {st.st_uid}, not the installing uid {self.uid}; "
                           "refusing to use it")
        if st.st_mode & 0o022:
            os.close(fd)
            raise BadInput(f"{shown} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                           "refusing to use it")
        return st

    def _sub(self, name: str, create: bool = False) -> int | None:
        assert self.state_fd is not None
        return self._open_dir(self.state_fd, name, self.state / name, create)

    # -- read-only checks (safe without the lock) -------------------------------------------
    def check_usable(self, roles: list[str]) -> None:
        """Refuse a DIR we would have to clobber or follow; before anything is written."""
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise BadInput(f"--to {self.root} is a symbolic link; pass the real directory")
        if not stat.S_ISDIR(st.st_mode):
            raise BadInput(f"--to {self.root} exists and is not a directory")
        with self.opened(create=False):
            if self.root_fd is None:
                return
            for role in roles:
                self.check_role_path(role)

    def check_role_path(self, role: str) -> None:
        p = self.root / role
        try:
            is_link = stat.S_ISLNK(os.stat(role, dir_fd=self.root_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return
        if not is_link:
            raise BadInput(f"{p} exists and is not managed by cachebake; remove it or install into "
                           "another directory")
        if readlink(role, self.root_fd) != self.role_link(role):
            raise BadInput(f"{p} is a symlink not made by cachebake; remove it")

    def check_space(self, file_bytes: int, entries: int) -> None:
        """Refuse before writing when the bake cannot fit: bytes and inodes."""
        probe = self.root
        while not os.path.lexists(probe):
            probe = probe.parent
        st = os.statvfs(probe)
        free = st.f_bavail * st.f_frsize
        needed = file_bytes + st.f_frsize * entries  # each entry rounds up to a block, roughly
        if needed > free:
            raise BadInput(f"{probe}: {free / 1e6:.0f} MB free, the bake needs {needed / 1e6:.0f} MB")
        # f_files == 0: a filesystem without an inode limit (btrfs, some FUSE); nothing to check
        if st.f_files and entries + 16 > st.f_favail:
            raise BadInput(f"{probe}: {st.f_favail} free inodes, the bake needs {entries} files and "
                           "directories")

    @staticmethod
    def role_link(role: str) -> str:
        return f"{STATE}/current/{role}"

    @contextmanager
    def opened(self, create: bool) -> Iterator[None]:
        """DIR and DIR/.cachebake as fds for the duration (None where absent, create=False)."""
        self.root_fd = self._open_root(create)
        try:
            if self.root_fd is not None:
                self.state_fd = self._open_dir(self.root_fd, STATE, self.state, create)
            yield
        finally:
            for fd in (self.state_fd, self.root_fd):
                if fd is not None:
                    os.close(fd)
            self.root_fd = self.state_fd = None

    def installed(self) -> InstallMarker | None:
        """The marker (install.json) of the installed bake, or None where there is none; for
        readers outside an install (verify, serve-args).  Read-only, through the same
        link-refusing fds.  A marker that is there but malformed is InvalidDocument (exit 5):
        a reader must not take a damaged install for no install (serve-args would export a
        role install left out)."""
        try:
            with self.opened(create=False):
                version, vfd, _ = self._current()
                if vfd is None:
                    return None
                try:
                    return _read_marker(vfd, f"{self.state / 'versions' / version / MARKER}")
                finally:
                    os.close(vfd)
        except (BadInput, OSError):
            return None

    def _current(self) -> tuple[str | None, int | None, list[str]]:
        """(version, an fd of its directory, problems) of what ``current`` names; the fd is None
        where there is no install or it is damaged (``problems`` says how).  Needs
        ``opened()`` or ``locked()``."""
        if self.state_fd is None:
            return None, None, []
        target = readlink("current", self.state_fd)
        if target is None:
            return None, None, []
        version = target.rpartition("/")[2]
        if not target.startswith("versions/") or not VERSION_RE.match(version):
            return None, None, [f"{STATE}/current points at {target!r}"]
        versions_fd = self._sub("versions")
        if versions_fd is None:
            return version, None, [f"{STATE}/versions is missing"]
        try:
            vfd = self._open_dir(versions_fd, version, self.state / "versions" / version)
        finally:
            os.close(versions_fd)
        if vfd is None:
            return version, None, [f"{STATE}/versions/{version} is missing"]
        return version, vfd, []

    def inspect(self) -> tuple[InstallMarker | None, str | None, list[str]]:
        """(marker, version, problems) of the installed bake; (None, None, []) if none.
        ``problems`` lists what differs from the marker's inventory (a damaged tree, an
        unreadable marker: what a repair fixes).  Needs ``opened()`` or ``locked()``."""
        version, vfd, problems = self._current()
        if vfd is None:
            return None, version, problems
        try:
            try:
                marker = _read_marker(vfd)
                self._roles_by_version[version] = list(marker.roles)
            except BadInput:
                raise
            except Exception as e:  # noqa: BLE001 - any unreadable marker is damage to repair
                return None, version, [f"{MARKER} is unreadable ({e})"]
            problems = [f"{role} is not cachebake's link" for role in marker.roles
                        if readlink(role, self.root_fd) != self.role_link(role)]
            problems += check_tree(vfd, marker)
            return marker, version, problems
        finally:
            os.close(vfd)

    def has_leftovers(self, current: str | None) -> bool:
        """Anything a killed install left (checked without the lock; cleaned under it)."""
        for sub in ("staging", "versions"):
            fd = self._sub(sub)
            if fd is None:
                continue
            try:
                names = os.listdir(fd)
            finally:
                os.close(fd)
            if [n for n in names if not (sub == "versions" and n == current)]:
                return True
        return any(n.startswith("current.tmp-") for n in os.listdir(self.state_fd)) or \
            any(n.startswith(".") and ".cachebake-tmp-" in n for n in os.listdir(self.root_fd))

    # -- writes (lock held) -----------------------------------------------------------------
    @contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        """Create DIR/.cachebake as needed, take the lock, and hold DIR and state as fds."""
        deadline = time.monotonic() + timeout
        while True:
            with self.opened(create=True):
                self._check_lock_path()
                lock_fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                                  | os.O_NONBLOCK, 0o644, dir_fd=self.state_fd)
                try:
                    st = os.fstat(lock_fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_uid != self.uid:
                        raise BadInput(f"{self.state / 'lock'} is not a regular file of the installing uid")
                    self._flock(lock_fd, deadline, timeout)
                    if self._still_linked(lock_fd):
                        self.checkpoint("locked")
                        yield
                        return
                finally:
                    os.close(lock_fd)
            # a refused first install removed DIR/.cachebake while we waited: start over

    def _check_lock_path(self) -> None:
        try:
            st = os.stat("lock", dir_fd=self.state_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{self.state / 'lock'} is a symbolic link or not a regular file; refusing to "
                           "use it")

    def _flock(self, fd: int, deadline: float, timeout: float) -> None:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() > deadline:
                raise Locked(f"another install holds {self.state / 'lock'} for over {timeout:.0f} s")
            self.interrupts.check()  # Ctrl-C while waiting for another install
            time.sleep(0.05)

    def _still_linked(self, lock_fd: int) -> bool:
        try:
            return (os.path.samestat(os.fstat(self.root_fd), os.stat(self.root, follow_symlinks=False))
                    and os.path.samestat(os.fstat(self.state_fd),
                                         os.stat(STATE, dir_fd=self.root_fd, follow_symlinks=False))
                    and os.path.samestat(os.fstat(lock_fd),
                                         os.stat("lock", dir_fd=self.state_fd, follow_symlinks=False)))
        except FileNotFoundError:
            return False

    def clean_leftovers(self, keep_roles: set[str] = frozenset()) -> list[str]:
        """Remove what killed installs left behind; returns what was removed (relative to DIR)."""
        removed = []
        target = readlink("current", self.state_fd)
        current = target.rpartition("/")[2] if target else None
        for sub in ("staging", "versions"):
            fd = self._sub(sub)
            if fd is None:
                continue
            try:
                for name in sorted(os.listdir(fd)):
                    if sub == "versions" and name == current:
                        continue
                    rmtree_at(fd, name)
                    removed.append(f"{STATE}/{sub}/{name}")
                    self.checkpoint("clean")
            finally:
                os.close(fd)
        for name in sorted(os.listdir(self.state_fd)):
            if name.startswith("current.tmp-") and readlink(name, self.state_fd) is not None:
                os.unlink(name, dir_fd=self.state_fd)
                removed.append(f"{STATE}/{name}")
        for name in sorted(os.listdir(self.root_fd)):  # temporary role links of cachebake <= 0.1
            role = name[1:].partition(".cachebake-tmp-")[0]
            if name.startswith(".") and ".cachebake-tmp-" in name and role in ROLE_ENV \
                    and readlink(name, self.root_fd) == self.role_link(role):
                os.unlink(name, dir_fd=self.root_fd)
                removed.append(name)
        backed = set(self._roles_of(current)) | set(keep_roles)
        for role in ROLE_ENV:
            if role not in backed and readlink(role, self.root_fd) == self.role_link(role):
                os.unlink(role, dir_fd=self.root_fd)  # the residual window: see the module doc
                removed.append(role)
        return removed

    def new_staging(self) -> tuple[str, int]:
        """A fresh staging directory: (its name under staging/, an fd of it)."""
        staging_fd = self._sub("staging", create=True)
        name = secrets.token_hex(8)
        try:
            os.mkdir(name, 0o755, dir_fd=staging_fd)
            fd = self._open_dir(staging_fd, name, self.state / "staging" / name)
            try:
                os.fchmod(fd, 0o755)
                self.checkpoint("staged")
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            rmtree_at(staging_fd, name)  # Ctrl-C here: the caller's cleanup is not armed yet
            raise
        finally:
            os.close(staging_fd)
        return name, fd

    def remove_staging(self, name: str) -> None:
        fd = self._sub("staging")
        if fd is not None:
            try:
                rmtree_at(fd, name)
            finally:
                os.close(fd)

    def link_roles(self, roles: list[str]) -> None:
        """DIR/<role> -> .cachebake/current/<role>, made with symlink(2), which never replaces:
        anything else at that name (even one that appeared a moment ago) is refused."""
        for role in roles:
            try:
                os.symlink(self.role_link(role), role, dir_fd=self.root_fd)
                self._links_made.append(role)
                self.checkpoint("role-link")
            except FileExistsError:
                self.check_role_path(role)  # ours already, or BadInput naming it
        self._fsync(self.root_fd)

    def _fsync(self, fd: int) -> None:
        if self.sync:
            os.fsync(fd)

    @contextmanager
    def transaction(self, timeout: float, *, keep_roles: set[str] = frozenset()) -> Iterator["Transaction"]:
        """One install, start to switch: take the lock (Locked after ``timeout`` s), read what
        is installed (``tx.marker``, ``tx.version``, ``tx.damage``: a racing install may have
        done the work while we waited), remove a killed install's leftovers (``tx.cleaned``;
        the links of ``keep_roles`` stay) and make a private staging dir (``tx.staged_fd``).
        ``tx.commit(marker)`` switches to it.  Any exception, or leaving the block without a
        commit, removes the staging dir, the role links this install made and a DIR (or
        ``.cachebake``) it created: DIR holds what it held before.  After a commit, what the
        old version left is cleaned too."""
        with self.locked(timeout):
            tx = Transaction(self)
            try:
                tx.marker, tx.version, tx.damage = self.inspect()
                tx.cleaned = self.clean_leftovers(keep_roles=set(keep_roles))
                tx.staged, tx.staged_fd = self.new_staging()
                yield tx
                if tx.committed:
                    tx.cleaned += self.clean_leftovers()
                else:
                    tx.rollback()
            except BaseException:
                # Refused, disk full, EIO, Ctrl-C: no half-written tree for the next install,
                # and a DIR this install created is removed again.  Where the filesystem
                # refuses even that (it went read-only), the error that stopped the install is
                # the one to report; the next install removes what is left.
                try:
                    tx.rollback()
                except OSError:
                    pass
                raise
            finally:
                tx.close()

    def switched(self) -> bool:
        """Whether ``current`` names the version this install committed (for Ctrl-C's report;
        opens DIR afresh, so it also works after the lock was released)."""
        if self.pending_version is None:
            return False
        try:
            fd = os.open(self.state, DIR_FLAGS)
        except OSError:
            return False
        try:
            return readlink("current", fd) == f"versions/{self.pending_version}"
        finally:
            os.close(fd)

    def current_version(self) -> str | None:
        target = readlink("current", self.state_fd) if self.state_fd is not None else None
        return target.rpartition("/")[2] if target else None

    def undo(self) -> None:
        """After a refusal (lock held): remove the role links this install made and, if it
        created them, DIR/.cachebake and DIR, so a fresh DIR is left as it was."""
        current = self.current_version()
        backed = set(self._roles_of(current))
        for role in self._links_made:
            if role not in backed and readlink(role, self.root_fd) == self.role_link(role):
                os.unlink(role, dir_fd=self.root_fd)
        self._links_made.clear()
        if not self._created_state or current is not None:
            return
        for sub in ("staging", "versions"):
            rmdir_quiet(sub, self.state_fd)
        try:
            os.unlink("lock", dir_fd=self.state_fd)  # waiters see it gone and start over
        except FileNotFoundError:
            pass
        if not rmdir_quiet(STATE, self.root_fd):
            return
        for d in self._created:
            try:
                os.rmdir(d)
            except OSError:
                break

    def _roles_of(self, version: str | None) -> list[str]:
        if version is None:
            return []
        if version in self._roles_by_version:
            return self._roles_by_version[version]
        fd = self._sub("versions")
        try:
            vfd = self._open_dir(fd, version, self.state / "versions" / version) if fd is not None else None
        finally:
            if fd is not None:
                os.close(fd)
        if vfd is None:
            return []
        try:
            return list(_read_marker(vfd).roles)
        except Exception:  # noqa: BLE001 - an unreadable marker backs no role
            return []
        finally:
            os.close(vfd)


class Transaction:
    """One install in progress inside an ``InstallDir`` (``InstallDir.transaction``)."""

    def __init__(self, dest: InstallDir):
        self.dest = dest
        self.checkpoint = dest.checkpoint
        self.marker: InstallMarker | None = None  # what was installed when the lock was taken
        self.version: str | None = None
        self.damage: list[str] = []
        self.cleaned: list[str] = []
        self.staged: str | None = None  # the staging dir's name under staging/
        self.staged_fd: int = -1
        self.committed = False

    def drop(self, role: str) -> None:
        """Remove a role from the staged tree before the commit (one install cannot relocate)."""
        rmtree_at(self.staged_fd, role)

    def commit(self, marker: InstallMarker) -> str:
        """Write the marker (sealed), sync the staged tree, link roles, move it into versions/,
        switch ``current``; returns the new version's name.  From here on the transaction no
        longer undoes anything: the switch is the last step, and what fails after it (the
        old version's cleanup) is what the next install cleans."""
        dest, staged, staged_fd = self.dest, self.staged, self.staged_fd
        roles, digest = list(marker.roles), marker.layer_digest
        fd = os.open(MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=staged_fd)
        try:
            # the seal (install/inventory.py): created after the last file, read before the write
            marker = dataclasses.replace(marker, sealed_ctime_ns=os.fstat(fd).st_ctime_ns)
            os.fchmod(fd, 0o644)
            # written once into the private staging dir, which the rename below makes visible
            # whole: no temp file needed
            data = jsonio.canonical_json(marker.to_json()) + b"\n"
            write_all(fd, data)
        finally:
            os.close(fd)
        if dest.sync:
            sync_tree(staged_fd)
        dest.checkpoint("synced")
        dest.link_roles(roles)
        version = dest.pending_version = f"{digest.split(':')[-1][:12]}-{secrets.token_hex(4)}"
        staging_fd, versions_fd = dest._sub("staging"), dest._sub("versions", create=True)
        try:
            rename_noreplace(staged, version, staging_fd, versions_fd)
            dest._fsync(versions_fd)
        finally:
            os.close(staging_fd)
            os.close(versions_fd)
        dest.checkpoint("renamed")
        current = os.stat("current", dir_fd=dest.state_fd, follow_symlinks=False) \
            if lexists("current", dest.state_fd) else None
        if current is not None and not stat.S_ISLNK(current.st_mode):
            raise BadInput(f"{dest.state / 'current'} is not a symbolic link; refusing to replace it")
        tmp = f"current.tmp-{secrets.token_hex(4)}"
        os.symlink(f"versions/{version}", tmp, dir_fd=dest.state_fd)
        dest.checkpoint("current-tmp")
        os.rename(tmp, "current", src_dir_fd=dest.state_fd, dst_dir_fd=dest.state_fd)  # the switch
        self.committed = True
        dest._links_made.clear()  # they are backed now
        dest._roles_by_version[version] = [r for r in roles if r in ROLE_ENV]
        dest._fsync(dest.state_fd)
        dest.checkpoint("switched")
        return version

    def rollback(self) -> None:
        if self.committed:
            return
        self.close()
        if self.staged is not None:
            self.dest.remove_staging(self.staged)
            self.staged = None
        self.dest.undo()

    def close(self) -> None:
        if self.staged_fd >= 0:
            os.close(self.staged_fd)
            self.staged_fd = -1


def _read_marker(version_fd: int, document: str = MARKER) -> InstallMarker:
    return InstallMarker.from_json(jsonio.parse_json(
        jsonio.read_document(MARKER, document, CAP_MARKER, dir_fd=version_fd), document), document)
