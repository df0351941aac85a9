"""Safe extraction of a bake layer (tar + zstd).

A layer comes from a registry or a shared volume: treat it as hostile.  Two steps:

* ``load_layer`` reads the compressed blob through the digest-verifying reader, decompresses
  it under the bomb guard and checks every entry, writing nothing, so a corrupt or unsafe
  layer is refused before DIR is touched (the issue asks for "nothing written");
* ``extract_layer`` writes those same bytes into a fresh staging directory nobody else uses.

Both apply the same ``LayerGuard``; it ends with tarfile's PEP 706 ``data_filter``
(absolute paths, paths leaving the destination, links leaving it, device and fifo entries; it
strips setuid and group/other-write bits).  Our
own checks run first and are stricter; what they add to the filter, and why:

* every link, symbolic or hard, is refused outright, even one that stays inside the tree: the
  packer never writes links, so a link can only be an attack or a bug, and refusing it makes
  the write side trivially safe (O_CREAT|O_EXCL|O_NOFOLLOW into a fresh directory);
* setuid/setgid/sticky bits are refused, not silently stripped: they mean someone crafted it;
* only regular files and directories; no sparse files; no duplicate names; no path below a
  file; every top-level directory is a role the manifest declares;
* modes are capped to 0644/0755 (0755 for files with any x bit) whatever the umask;
* bomb guard: the manifest's declared entry count, file bytes and tar size are hard ceilings
  while decompressing and checking (before anything is written), the declared tar size must be
  within ``MAX_RATIO`` times the compressed size, the decompressor may not produce a byte past
  the declared size (inflate.py), and no entry's data may run past the end of the tar; at the
  end the counts must match the manifest exactly (a short layer is corrupt);
* the compressed blob is read to EOF through the digest-verifying reader before it is
  decompressed; the decompressed tar is not re-hashed against the manifest's diff_id, since
  the verified compressed digest already pins those bytes (measured: it cost ~15% of install).
"""

from __future__ import annotations

import os
import stat
import tarfile
from dataclasses import dataclass, field
from typing import BinaryIO, Callable

from cachebake.errors import CorruptArtifact, Unsupported, UnsafeArtifact
from cachebake.install.inflate import Inflating

# Real caches compress to 2.6-12% of raw (shared/FACTS.md, a vLLM Mamba2 cache), AOT
# specializations of a few kernels to ~1% with zstd-19 --long (bench/pack.md): 100:1.  1000:1
# leaves room for that and still stops a zero-filled bomb (zstd: ~30000:1).  The ratio only
# bounds what a manifest may declare; the declared sizes are the hard ceilings, and install
# checks the declared bytes fit on DIR's filesystem before writing.
MAX_RATIO = 1000
# A tiny layer is mostly tar headers, which compress very well: no ratio below this size.
RATIO_GRACE = 1 << 20
# The decompressed layer is held in (mapped) memory; refuse to declare more than this.
MAX_TAR_BYTES = 16 << 30
CHUNK = 1 << 20
FILTER_DEST = "/nonexistent/cachebake-filter-dest"

# Called with each file's member name; returns None (copy as is) or a function that maps the
# file's bytes to the bytes to write (relocation of Triton group files and of the vllm role),
# or returns the very object it was given to leave the file as is.
Transform = Callable[[str], "Callable[[bytes], bytes] | None"]


@dataclass
class LayerLimits:
    """What the (digest-verified) manifest declares about the layer: hard ceilings."""

    roles: frozenset[str]
    entries: int
    file_bytes: int
    tar_size: int
    compressed_size: int
    diff_id: str

    @classmethod
    def from_manifest(cls, manifest: dict, compressed_size: int) -> "LayerLimits":
        layer = manifest.get("layer")
        if not isinstance(layer, dict):
            raise CorruptArtifact("manifest has no 'layer' section")
        try:
            limits = cls(
                roles=frozenset(manifest["roles"]),
                entries=int(layer["entries"]),
                file_bytes=int(layer["uncompressed_size"]),
                tar_size=int(layer["tar_size"]),
                compressed_size=int(compressed_size),
                diff_id=str(layer.get("diff_id", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptArtifact(f"manifest 'layer' section is incomplete: {e}") from None
        media = layer.get("media_type", "application/vnd.oci.image.layer.v1.tar+zstd")
        if not media.endswith("tar+zstd"):
            raise Unsupported(f"layer media type {media!r} is not tar+zstd")
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
    names: set[str] = field(default_factory=set, repr=False)
    file_names: set[str] = field(default_factory=set, repr=False)


class LayerGuard:
    """The per-entry checks and running totals against the manifest's declared numbers."""

    def __init__(self, limits: LayerLimits):
        self.limits = limits
        self.stats = LayerStats()

    def finish(self) -> None:
        """After the last entry: the totals must be exactly what the manifest declares."""
        lim, st = self.limits, self.stats
        if st.entries != lim.entries or st.file_bytes != lim.file_bytes:
            raise CorruptArtifact(
                f"layer holds {st.entries} entries / {st.file_bytes} file bytes, the manifest "
                f"declares {lim.entries} / {lim.file_bytes}")
        if st.tar_bytes != lim.tar_size:
            raise CorruptArtifact(
                f"layer tar is {st.tar_bytes} bytes, the manifest declares {lim.tar_size}")

    # -- entry level -----------------------------------------------------------------------
    def check(self, m: tarfile.TarInfo) -> int:
        """Refuse ``m`` or return the (capped) mode to write it with; updates the totals."""
        name = m.name
        # Order matters only for the message: the most specific reason first.
        if "\x00" in name or not name:
            raise UnsafeArtifact(f"entry with an empty or NUL-bearing name: {name!r}")
        if name.startswith("/"):
            raise UnsafeArtifact(f"entry {name!r} has an absolute path")
        parts = name.split("/")
        if ".." in parts:
            raise UnsafeArtifact(f"entry {name!r} climbs out of the tree with '..'")
        if any(p in ("", ".") for p in parts):
            raise UnsafeArtifact(f"entry {name!r} is not a normalized relative path")
        if m.issym():
            raise UnsafeArtifact(f"entry {name!r} is a symlink to {m.linkname!r}: layers never hold links")
        if m.islnk():
            raise UnsafeArtifact(f"entry {name!r} is a hard link to {m.linkname!r}: layers never hold links")
        if m.ischr() or m.isblk():
            raise UnsafeArtifact(f"entry {name!r} is a device node")
        if m.isfifo():
            raise UnsafeArtifact(f"entry {name!r} is a fifo")
        if not (m.isreg() or m.isdir()) or m.issparse():
            raise UnsafeArtifact(f"entry {name!r} has unsupported tar type {m.type!r}")
        if m.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
            raise UnsafeArtifact(f"entry {name!r} has setuid/setgid/sticky bits (mode {m.mode:o})")
        if parts[0] not in self.limits.roles:
            raise UnsafeArtifact(f"entry {name!r} is outside the roles the manifest declares "
                                 f"({', '.join(sorted(self.limits.roles))})")
        st = self.stats
        if name in st.names:
            raise UnsafeArtifact(f"entry {name!r} appears twice")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in st.file_names:
                raise UnsafeArtifact(f"entry {name!r} sits below a regular file")
        st.entries += 1
        if st.entries > self.limits.entries:
            raise UnsafeArtifact(f"layer has more entries than the {self.limits.entries} the "
                                 "manifest declares")
        if m.isreg():
            st.files += 1
            st.file_bytes += m.size
            if st.file_bytes > self.limits.file_bytes:
                raise UnsafeArtifact(f"layer holds more file data than the {self.limits.file_bytes} "
                                     f"bytes the manifest declares (at {name!r})")
            st.file_names.add(name)
        st.names.add(name)
        try:
            # PEP 706, the standard gate, kept as a backstop behind the stricter checks above.
            # Run before anything is written, against a destination that does not exist: the
            # staging dir is fresh and the layer holds no links, so there is nothing for the
            # filter's realpath() to resolve (and it halves the filter's cost).
            tarfile.data_filter(m, FILTER_DEST)
        except tarfile.FilterError as e:
            raise UnsafeArtifact(f"entry {name!r} refused by tarfile's data filter: {e}") from None
        # Our own mode cap supersedes the filter's (which keeps e.g. 0o600 as is).
        return 0o755 if (m.isdir() or m.mode & 0o111) else 0o644


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@dataclass
class Layer:
    """A verified, decompressed layer held in memory, with its entries already checked."""

    tar: memoryview  # the whole decompressed tar
    members: list[tuple[tarfile.TarInfo, int]]  # each checked entry and the mode to write
    stats: LayerStats
    rewritten: dict[str, bytes] = field(default_factory=dict)  # member name -> bytes to write


def load_layer(compressed: BinaryIO, limits: LayerLimits, transform: Transform | None = None) -> Layer:
    """Read, verify, decompress and check the whole layer; writes nothing.

    The compressed blob is read to EOF through the artifact's digest-verifying reader first,
    so a flipped byte gets its own clear error and the bytes checked here are exactly the
    bytes extracted later (no second read that could differ).  Decompression runs under the
    bomb guard.  The layer is held in memory: bakes are tens to hundreds of MB, and the guard
    bounds it by the manifest's declared size before anything is allocated for it.
    ``transform`` (group-file relocation) runs here too, so a group file it refuses also
    leaves DIR untouched.
    """
    if limits.tar_size > MAX_TAR_BYTES:
        raise UnsafeArtifact(f"layer declares {limits.tar_size} bytes, over the "
                             f"{MAX_TAR_BYTES} this installer holds")
    blob = bytearray()
    while chunk := compressed.read(CHUNK):  # the reader raises CorruptArtifact at EOF
        blob += chunk
        if len(blob) > limits.compressed_size:
            raise CorruptArtifact(f"layer is longer than the {limits.compressed_size} bytes declared")
    guard = LayerGuard(limits)
    inflating = Inflating(blob, limits.tar_size)
    members = []
    try:
        with tarfile.open(fileobj=inflating, mode="r:") as tar:
            for m in tar:
                mode = guard.check(m)
                members.append((m, mode))
        tar_bytes = inflating.finish()
    except (tarfile.TarError, EOFError) as e:
        inflating.cancel()
        if inflating.error is not None:
            raise inflating.error from None
        raise CorruptArtifact(f"layer stream is damaged or truncated: {e}") from None
    except BaseException:
        inflating.cancel()
        raise
    guard.stats.tar_bytes = len(tar_bytes)
    for m, _ in members:
        if m.isreg() and m.offset_data + m.size > len(tar_bytes):
            raise CorruptArtifact(f"entry {m.name!r} runs past the end of the layer")
    if len(tar_bytes) < limits.tar_size:
        raise CorruptArtifact(f"layer stream is damaged or truncated: it decompresses to "
                              f"{len(tar_bytes)} of the {limits.tar_size} bytes the manifest declares")
    guard.finish()
    rewritten = {}
    for m, _ in members:
        rewrite = transform(m.name) if transform is not None and m.isreg() else None
        if rewrite is not None:
            original = bytes(tar_bytes[m.offset_data:m.offset_data + m.size])
            new = rewrite(original)
            if new is not original:  # a rewrite returns its input itself to leave it as is
                rewritten[m.name] = new
    guard.stats.transformed = len(rewritten)
    return Layer(tar_bytes, members, guard.stats, rewritten)


def extract_layer(layer: Layer, dest: str,
                  checkpoint: Callable[[str], None] = lambda _: None) -> LayerStats:
    """Write a loaded layer into ``dest``, a fresh empty directory we own.

    Every entry was checked by ``load_layer`` (the only maker of a ``Layer``).
    O_CREAT|O_EXCL|O_NOFOLLOW into a fresh directory of a link-free layer cannot write anywhere
    but below ``dest``.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    data = layer.tar
    made = {dest}
    umask = os.umask(0o022)
    os.umask(umask)
    for m, mode in layer.members:
        path = os.path.join(dest, m.name)
        parent = os.path.dirname(path)
        if parent not in made:  # a layer may omit directory entries
            os.makedirs(parent, mode=0o755, exist_ok=True)
            if 0o755 & umask:
                os.chmod(parent, 0o755)
            made.add(parent)
        if m.isdir():
            os.mkdir(path, 0o755)
            if 0o755 & umask:
                os.chmod(path, 0o755)
            made.add(path)
        else:
            content = layer.rewritten.get(m.name)
            if content is None:
                content = data[m.offset_data:m.offset_data + m.size]
            fd = os.open(path, flags, mode)
            try:
                if mode & umask:  # the umask dropped bits the server needs
                    os.fchmod(fd, mode)
                _write_all(fd, content)
            finally:
                os.close(fd)
        checkpoint("entry")
    return layer.stats
