"""The layer: a deterministic tar of a snapshot, compressed with zstd, hashed while written.

Same snapshot in, same bytes out: entries sorted, every header normalized (mtime, uid/gid,
names, modes), PAX format (long key-dir paths need it; its headers carry nothing variable).
tarfile writes the archive; zstandard compresses it.  We only add the normalization and the
two hashes an OCI layer needs (digest of the blob, diff_id of the tar) computed in one pass.

Compression settings (bench/pack.md has the table they come from): level 19 with long-distance
matching over a 128 MiB window.  Kernel caches are highly repetitive across key dirs (the same
kernel at several specializations shares most of its PTX and IR), which the long window finds:
on a real vLLM Mamba2 cache -19 --long is 5.5% of raw vs 7.8% at -9 and 14% for gzip.  Packing
is done once per bake, at build time, so its seconds are cheap; decompression speed barely
depends on the level.  A 128 MiB window is zstd's default decoding limit (window log 27), so
the stock zstd CLI and containerd/umoci's decoders read it without extra flags.

zstd's multithreaded mode gives the same bytes for any thread count >= 1 (but not for 0), so
we always use it: reproducible across 2-core CI and 16-core builders.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

from cachebake.artifact.snapshot import Snapshot

ZSTD_LEVEL = 19
ZSTD_WINDOW_LOG = 27
COMPRESSION = f"zstd-{ZSTD_LEVEL}-long{ZSTD_WINDOW_LOG}"
# Fixed header time: SOURCE_DATE_EPOCH where the build sets one, else the epoch.
_MTIME = int(os.environ.get("SOURCE_DATE_EPOCH", "0") or 0)


class _HashingWriter(io.RawIOBase):
    """Counts and hashes the bytes passing through to ``sink``."""

    def __init__(self, sink: BinaryIO):
        self.sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.sha.update(b)
        self.size += len(b)
        self.sink.write(b)
        return len(b)

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


@dataclass
class LayerStats:
    digest: str
    size: int
    diff_id: str
    tar_size: int
    uncompressed_size: int
    entries: int
    files: int


def zstd_compressor(level: int = ZSTD_LEVEL) -> zstandard.ZstdCompressor:
    params = zstandard.ZstdCompressionParameters.from_level(
        level, enable_ldm=True, window_log=ZSTD_WINDOW_LOG, threads=max(1, os.cpu_count() or 1),
        write_checksum=1)
    return zstandard.ZstdCompressor(compression_params=params)


def _tarinfo(name: str, *, size: int = 0, mode: int, is_dir: bool = False) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    ti.size = 0 if is_dir else size
    ti.mode = mode
    ti.mtime = _MTIME
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


class LayerWriter:
    """Writes one snapshot as a tar+zstd layer to ``out`` (a binary file)."""

    def __init__(self, out: BinaryIO, level: int = ZSTD_LEVEL):
        self.out = out
        self.level = level

    def write(self, snap: Snapshot, progress: Callable[[int], None] | None = None) -> LayerStats:
        """``progress(n)`` is called after each file with its size in bytes."""
        blob = _HashingWriter(self.out)
        zw = zstd_compressor(self.level).stream_writer(blob, closefd=False)
        tar_stream = _HashingWriter(zw)
        entries = []
        for d in snap.dirs:
            entries.append((d + "/", None))
        for f in snap.files:
            entries.append((f.arcname, f))
        # Sorted by name so a directory comes before what it holds, and the order is stable.
        entries.sort(key=lambda e: e[0])
        with tarfile.open(fileobj=tar_stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name, f in entries:
                if f is None:
                    tar.addfile(_tarinfo(name.rstrip("/"), mode=0o755, is_dir=True))
                    continue
                data = f.read()
                if len(data) != f.size:
                    raise OSError(f"{f.source}: changed while packing ({f.size} -> {len(data)} bytes)")
                tar.addfile(_tarinfo(name, size=len(data), mode=f.mode), io.BytesIO(data))
                if progress is not None:
                    progress(len(data))
        zw.flush(zstandard.FLUSH_FRAME)
        zw.close()
        return LayerStats(
            digest=blob.digest, size=blob.size, diff_id=tar_stream.digest, tar_size=tar_stream.size,
            uncompressed_size=snap.data_size, entries=len(entries), files=len(snap.files))
