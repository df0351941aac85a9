"""Safe extraction of a bake layer (tar + zstd), in one pass, into a private staging directory.

A layer comes from a registry or a shared volume: treat it as hostile.  ``extract_layer``
reads the compressed stream once: a helper thread decompresses it (inflate.py), the strict tar
reader (tarstream.py) yields one header at a time, ``EntryChecker`` refuses the entry or says
how to write it, and only then is that entry written, below a staging directory nobody else
writes to.  What can only be known at the end (the counts match the manifest exactly, every
declared role is there, nothing follows the end-of-archive marker, the blob's digest) is
checked at the end; the caller switches the new tree in only after that, and removes the
staging directory on any refusal.  Nothing is visible in DIR before the digest matched.

The checks, and why each is stricter than tarfile's PEP 706 ``data`` filter (not used: it
would cost ~23 us a member for realpath(), and every case it refuses is refused here first;
Python builds without it, like Debian 12's 3.11.2, therefore lose nothing):

* links of any kind, devices, fifos, sparse files and every other entry type are refused, not
  filtered: the packer writes regular files and directories only, so the write side is
  O_CREAT|O_EXCL|O_NOFOLLOW relative to directory fds we created;
* setuid/setgid/sticky bits are refused, not stripped: they mean someone crafted the layer;
* names: relative, no "." / ".." / empty components, no control characters, valid UTF-8,
  components <= NAME_MAX, the installed path <= PATH_MAX, at most ``MAX_DEPTH`` levels, no two
  names equal under case folding and NFC (a case-insensitive volume would merge them);
* the tree: every top-level entry is a directory named by a role the manifest declares, no
  duplicates, nothing below a file, no file where a directory was implied;
* modes are 0644/0755 (0755 for files with any x bit) whatever the umask;
* totals: the manifest's entry count, file bytes and tar size are hard ceilings while reading
  and must match exactly at the end; the declared tar size must be within ``MAX_RATIO`` of the
  compressed size, and the decompressor stops at the first byte past it.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass, field
from typing import BinaryIO, Callable

from cachebake.artifact.manifest import BakeManifest
from cachebake.errors import CorruptArtifact, InvalidDocument, UnsafeArtifact
from cachebake.errors import shorten
from cachebake.install import refusals
from cachebake.install.inflate import Inflater
from cachebake.install.staging import Staging
from cachebake.install.tarstream import ChunkReader, Header, members

# Real caches compress to 2.6-12% of raw, AOT specializations of a few kernels to ~1% with
# zstd-19 --long (bench/pack.md): 100:1.  1000:1 leaves room for that and still stops a
# zero-filled bomb (zstd: ~30000:1).  The declared sizes are the hard ceilings; install checks
# they fit on DIR's filesystem (bytes and inodes) before writing.
MAX_RATIO = 1000
RATIO_GRACE = 1 << 20  # a tiny layer is mostly tar headers, which compress very well
NAME_MAX = 255
PATH_MAX = 4096
MAX_DEPTH = 32  # Triton's cache is 3 deep, vLLM's and Inductor's under 10
MAX_ENTRIES = 4_000_000
_CONTROL = frozenset(chr(c) for c in range(32)) | {"\x7f"}
_BAD_PARTS = frozenset({"", ".", ".."})  # empty, "." and ".." path components

# Called with each file's member name; returns None (copy as is) or a function that maps the
# file's bytes to the bytes to write (relocation of Triton group files), or returns the very
# object it was given to leave the file as is.  Such a file is held in memory: at most
# MAX_TRANSFORMED bytes (a group file's own cap, 1 MiB, is relocate.py's; the bound is for
# whole-file rewrites like vLLM's torch.compile artifacts, which can run to hundreds of MB).
MAX_TRANSFORMED = 1 << 30
Transform = Callable[[str], "Callable[[bytes], bytes] | None"]


@dataclass
class LayerLimits:
    """What the (digest-verified, schema-checked) manifest declares about the layer."""

    roles: frozenset[str]
    entries: int
    files: int
    file_bytes: int
    tar_size: int
    compressed_size: int
    path_budget: int = PATH_MAX - 1  # bytes left for a member name under the longest root
    diff_id: str | None = None  # sha256 of the uncompressed tar (the image config's rootfs.diff_ids)

    @classmethod
    def from_manifest(cls, manifest: BakeManifest, compressed_size: int,
                      roots: tuple[str, ...] = ()) -> "LayerLimits":
        """``roots``: where entries will land (for PATH_MAX)."""
        layer = manifest.layer
        longest = max((len(os.fsencode(r.rstrip("/"))) for r in roots), default=0)
        limits = cls(roles=frozenset(manifest.roles), entries=layer.entries, files=layer.files,
                     file_bytes=layer.uncompressed_size, tar_size=layer.tar_size,
                     compressed_size=int(compressed_size), path_budget=PATH_MAX - 2 - longest,
                     diff_id=layer.diff_id)
        if limits.entries > MAX_ENTRIES:
            raise UnsafeArtifact(f"layer declares {limits.entries} entries, over the {MAX_ENTRIES} "
                                 "this installer accepts")
        if limits.tar_size > MAX_RATIO * max(limits.compressed_size, RATIO_GRACE // MAX_RATIO):
            raise UnsafeArtifact(
                f"layer declares {limits.tar_size} bytes from {limits.compressed_size} compressed "
                f"(ratio over {MAX_RATIO}:1): refusing a decompression bomb")
        return limits


@dataclass
class LayerStats:
    entries: int = 0
    files: int = 0
    file_bytes: int = 0
    tar_bytes: int = 0
    transformed: int = 0
    # what was written, for the installed-tree check (install.json, install/inventory.py):
    # the directories made, and each file's size as written, in layer order
    dirs: list[str] = field(default_factory=list, repr=False)
    inventory: dict[str, int] = field(default_factory=dict, repr=False)


_IMPLIED, _DIR, _FILE = 0, 1, 2  # what EntryChecker knows a name to be


class EntryChecker:
    """The per-entry checks and running totals against the manifest's declared numbers.

    Runs once per entry on the extractor's thread, which is what bounds an install on tmpfs
    (bench/install.md): one dict says what each name is, and ASCII names, all the packer
    writes for Triton and vLLM caches, skip the Unicode work."""

    def __init__(self, limits: LayerLimits):
        self.limits = limits
        self.stats = LayerStats()
        self.kinds: dict[str, int] = {}  # every name seen: _IMPLIED / _DIR (explicit) / _FILE
        self.folded: dict[str, str] = {}
        self.role_entries = dict.fromkeys(limits.roles, 0)

    def check(self, h: Header) -> int:
        """Refuse ``h`` or return the mode to write it with; updates the totals."""
        name = h.name
        if name.isascii():  # isprintable() is exactly "no control character" for ASCII
            if not name or not name.isprintable():
                raise refusals.BadNameError(name, "is empty or holds control characters")
            size = len(name)
        else:
            if "\x00" in name or not _CONTROL.isdisjoint(name):
                raise refusals.BadNameError(name, "is empty or holds control characters")
            size = len(name.encode("utf-8"))
        if name[0] == "/":
            raise refusals.AbsolutePathError(name)
        parts = name.split("/")
        if not _BAD_PARTS.isdisjoint(parts):
            if ".." in parts:
                raise refusals.TraversalError(name)
            raise refusals.BadNameError(name)
        if len(parts) > MAX_DEPTH:
            raise refusals.TooDeepError(name, f"nests {len(parts)} levels deep, over {MAX_DEPTH}")
        if size > self.limits.path_budget:
            raise refusals.PathTooLongError(shorten(name, 80, keep=80), f"makes an installed path over PATH_MAX "
                                            f"({PATH_MAX} bytes)")
        if size > NAME_MAX and any(len(p.encode("utf-8")) > NAME_MAX for p in parts):
            raise refusals.NameTooLongError(shorten(name, 80, keep=80), f"has a path component over NAME_MAX "
                                            f"({NAME_MAX} bytes)")
        mode = h.mode
        if mode & 0o7000:
            raise refusals.SpecialModeError(name, f"has setuid/setgid/sticky bits (mode {mode:o})")
        if mode & ~0o7777:
            raise refusals.EntryTypeError(name, f"has mode bits {mode:o} beyond the permissions")
        role = parts[0]
        if role not in self.limits.roles:
            raise refusals.OutsideRolesError(name, f"is outside the roles the manifest declares "
                                                   f"({', '.join(sorted(self.limits.roles))})")
        isdir = h.isdir
        if len(parts) == 1 and not isdir:
            raise refusals.RoleNotDirectoryError(name, "is a cache role but a regular file, not a directory")
        kinds = self.kinds
        known = kinds.get(name)
        if known is not None and known != _IMPLIED:
            raise refusals.DuplicateError(name)
        nested = len(parts) > 1
        if nested:
            parent = kinds.get(name.rpartition("/")[0])
            if parent is None or parent == _FILE:
                self._imply_dirs(name, parts)
        if known is None:
            self._fold(name)
        elif not isdir:
            raise refusals.FileOverDirectoryError(name)
        st = self.stats
        st.entries += 1
        if st.entries > self.limits.entries:
            raise refusals.OverDeclaredError(name, f"gives the layer more entries than the "
                                                   f"{self.limits.entries} the manifest declares")
        if nested:
            self.role_entries[role] += 1
        if isdir:
            kinds[name] = _DIR
            return 0o755
        st.files += 1
        st.file_bytes += h.size
        if st.files > self.limits.files or st.file_bytes > self.limits.file_bytes:
            raise refusals.OverDeclaredError(name, f"gives the layer more files or more file data than the "
                                                   f"{self.limits.files} files / {self.limits.file_bytes} "
                                                   "bytes the manifest declares")
        kinds[name] = _FILE
        return 0o755 if mode & 0o111 else 0o644

    def _imply_dirs(self, name: str, parts: list[str]) -> None:
        kinds = self.kinds
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            kind = kinds.get(d)
            if kind == _FILE:
                raise refusals.BelowFileError(name)
            if kind is None:
                kinds[d] = _IMPLIED
                self._fold(d)

    def _fold(self, name: str) -> None:
        key = name.lower() if name.isascii() else unicodedata.normalize("NFC", name).casefold()
        other = self.folded.setdefault(key, name)
        if other != name:
            raise refusals.NameCollisionError(name, f"collides with {other!r} under case folding or "
                                                    "Unicode normalization")

    def finish(self, tar_bytes: int) -> None:
        """After the last entry: the totals must be exactly what the manifest declares."""
        lim, st = self.limits, self.stats
        st.tar_bytes = tar_bytes
        if st.entries != lim.entries or st.files != lim.files or st.file_bytes != lim.file_bytes:
            raise CorruptArtifact(
                f"layer holds {st.entries} entries / {st.files} files / {st.file_bytes} file bytes, the "
                f"manifest declares {lim.entries} / {lim.files} / {lim.file_bytes}")
        if tar_bytes != lim.tar_size:
            raise CorruptArtifact(f"layer stream is damaged or truncated: it decompresses to {tar_bytes} "
                                  f"of the {lim.tar_size} bytes the manifest declares")
        for role, n in sorted(self.role_entries.items()):
            if self.kinds.get(role) != _DIR or not n:
                raise CorruptArtifact(f"the manifest declares role {role!r} but the layer holds "
                                      f"{'nothing' if role not in self.kinds else 'an empty directory'} for it")


def extract_layer(compressed: BinaryIO, limits: LayerLimits, staging_fd: int | None,
                  transform: Transform | None = None,
                  checkpoint: Callable[[str], None] = lambda _: None, lanes: int | None = None) -> LayerStats:
    """Read, check and (``staging_fd`` given) write the whole layer in one pass.

    ``compressed``: the layer blob as a stream (artifact/reader.py's ``open_layer``): read once,
    front to back; it must raise CorruptArtifact at its end if the bytes were not the declared
    blob.  ``staging_fd``: an empty directory we own; None checks the layer without writing
    (``install --check-only``).  On any refusal the caller removes the staging directory.
    ``lanes``: file-writer threads, None to let the filesystem decide (install/staging.py).

    A helper thread decompresses while this one parses, checks and makes directories;
    files are written by this thread too on tmpfs, by writer threads on a disk
    (install/staging.py); zstd and the system calls release the GIL, so these overlap much as
    `zstd -d | tar -x`'s two processes do.
    """
    checker = EntryChecker(limits)
    stats = checker.stats
    inflater = Inflater(compressed, limits.tar_size)
    writer = Staging(staging_fd, stats, checkpoint, lanes) if staging_fd is not None else None
    try:
        reader = ChunkReader(inflater.next_chunk)
        for h in members(reader):
            mode = checker.check(h)
            if h.isdir:
                if writer is not None:
                    writer.mkdir(h.name)
                continue
            rewrite = transform(h.name) if transform is not None else None
            if rewrite is not None:
                if h.size > MAX_TRANSFORMED:
                    raise InvalidDocument(h.name, "", f"is {h.size} bytes, over the {MAX_TRANSFORMED} "
                                          "install reads into memory to rewrite")
                original = reader.read_exact(h.size)
                new = rewrite(original)
                if new is not original:  # a rewrite returns its input itself to leave it as is
                    stats.transformed += 1
                data = [memoryview(new)]
                stats.inventory[h.name] = len(new)
            else:
                stats.inventory[h.name] = h.size
                if writer is None:
                    reader.skip(h.size)
                    continue
                data = reader.take_views(h.size)
            if writer is not None:
                writer.write(h.name, mode, data)
        checker.finish(inflater.total)
        check_diff_id(limits, inflater.diff_id())
        if writer is not None:
            writer.finish()
    except (UnsafeArtifact, CorruptArtifact) as e:
        if writer is not None:
            writer.cancel()
        _prefer_digest_error(inflater, compressed)
        raise e from None
    except BaseException:
        if writer is not None:
            writer.cancel()
        inflater.cancel()
        raise
    return stats


def check_diff_id(limits: LayerLimits, seen: str) -> None:
    """The tar the blob decompressed to must be the one its manifest and image config name
    (``diff_id``): the blob's own digest matched (the source checked it at its end), so a
    different tar means the documents were crafted to describe another layer than the one
    shipped (a reader that trusts the diff_id, a runtime's layer store, would see another
    tree).  UnsafeArtifact, before anything is made visible."""
    if limits.diff_id is not None and seen != limits.diff_id:
        raise UnsafeArtifact(f"layer decompresses to a tar with digest {seen[:19]}..., not the "
                             f"diff_id {limits.diff_id[:19]}... its manifest declares (the layer was swapped)")


def extract_to(compressed: BinaryIO, limits: LayerLimits, path: str | os.PathLike,
               transform: Transform | None = None) -> LayerStats:
    """``extract_layer`` into a new directory ``path`` (created; removed again on any refusal),
    for callers that unpack a layer outside an install (fold-back's base)."""
    from cachebake.fsops import DIR_FLAGS, rmtree_at

    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    os.mkdir(path, 0o755)
    fd = os.open(path, DIR_FLAGS)
    try:
        return extract_layer(compressed, limits, fd, transform)
    except BaseException:
        parent_fd = os.open(parent, DIR_FLAGS)
        try:
            rmtree_at(parent_fd, name)
        finally:
            os.close(parent_fd)
        raise
    finally:
        os.close(fd)


DRAIN_LIMIT = 256 << 20


def _prefer_digest_error(inflater: Inflater, compressed: BinaryIO) -> None:
    """A refusal of a blob that does not match its digest is reported as that: a damaged or
    tampered download, not a crafted layer.  Reads the rest of the blob to find out, when that
    rest is at most DRAIN_LIMIT (a stream that says, like VerifyingReader's ``remaining``)."""
    inflater.cancel()
    remaining = getattr(compressed, "remaining", None)
    if remaining is None or remaining > DRAIN_LIMIT:
        return
    while compressed.read(1 << 20):  # raises CorruptArtifact at the end if the digest differs
        pass
