"""Decompress a layer stream on a helper thread, handing bounded chunks to the extractor.

`zstd -d | tar -x` overlaps decompression and extraction on two cores; so does install:
zstd (and the digest's sha256, and file reads) release the GIL, so a helper thread
decompresses while the main thread checks headers and writes files.  Memory is bounded by
the queue (``DEPTH`` chunks of ``CHUNK`` bytes), whatever the blob or the manifest declares:
bytes past the tar's end, skippable zstd frames and padding cannot grow it.

The decompressed total may not pass the manifest's declared tar size (refused at the first
byte over, UNSAFE); zstd frames needing a window over 128 MiB are refused by the decoder
(``MAX_WINDOW``: the packer writes window log 27, zstd's own default decoding limit).  When
the zstd stream ends, the compressed source is read to its end, which is where the source
checks the blob's size and digest (``VerifyingReader`` in artifact/oci.py, which every
source's ``open_layer`` returns: artifact/reader.py).
"""

from __future__ import annotations

import hashlib
import queue
import threading

import zstandard

from cachebake.errors import CorruptArtifact, UnsafeArtifact

CHUNK = 1 << 20  # bigger chunks cost more CPU (fresh pages per read), smaller more hand-overs
DEPTH = 8  # DEPTH * CHUNK bounds the memory in flight
MAX_WINDOW = 1 << 27
_END = object()


class Inflater:
    """``next_chunk()`` returns the next decompressed bytes, b"" once at the end (after the
    source's digest was checked); errors of the helper thread are raised there."""

    def __init__(self, compressed, limit: int):
        self.compressed = compressed
        self.limit = limit
        self.total = 0
        # the uncompressed tar's sha256: the layer's diff_id (OCI image spec, config.rootfs),
        # hashed here on the helper thread (hashlib releases the GIL on big updates)
        self.tar_hash = hashlib.sha256()
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=DEPTH)
        self._cancelled = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._run, name="cachebake-inflate", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
                self.compressed, read_size=CHUNK, read_across_frames=True, closefd=False)
            while not self._cancelled.is_set():
                chunk = reader.read(CHUNK)
                if not chunk:
                    break
                self.total += len(chunk)
                if self.total > self.limit:
                    raise UnsafeArtifact(f"layer decompresses past the {self.limit} bytes the manifest "
                                         "declares: refusing a size bomb")
                self.tar_hash.update(chunk)
                self._put(chunk)
            if not self._cancelled.is_set() and self.compressed.read(1):
                # read_across_frames decodes everything up to the source's end, so this is
                # only reached if zstd stopped early; the source checks the digest at EOF.
                raise CorruptArtifact("layer blob holds data after its last zstd frame")
        except zstandard.ZstdError as e:
            self.error = CorruptArtifact(f"layer stream is damaged or truncated: {e}")
        except BaseException as e:  # noqa: BLE001 - handed to the reading thread
            self.error = e
        finally:
            self._put(_END)

    def _put(self, item) -> None:
        while not self._cancelled.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def next_chunk(self) -> bytes:
        if self._ended:
            return b""
        item = self._queue.get()
        if item is _END:
            self._ended = True
            self._thread.join()
            if self.error is not None:
                raise self.error
            return b""
        return item

    def diff_id(self) -> str:
        """``sha256:<hex>`` of every byte decompressed; the whole tar once ``next_chunk`` gave b""."""
        return "sha256:" + self.tar_hash.hexdigest()

    def cancel(self) -> None:
        """Stop the helper (a refusal, Ctrl-C); safe to call twice."""
        self._cancelled.set()
        self._thread.join()
