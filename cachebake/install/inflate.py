"""Decompress a layer into one buffer on a helper thread while the tar headers are checked.

`zstd -d | tar -x` overlaps decompression and extraction on two cores; install must check
every entry before it writes anything, so it overlaps decompression with the checking instead:
zstd releases the GIL, so a thread fills a buffer of the manifest's declared tar size while
the main thread parses headers out of what is already there.  The buffer is mapped once at
the declared size (already bounded by the ratio guard and the free-space check), so the whole
tar ends up in one piece without a join, and extraction writes slices of it without copies.
"""

from __future__ import annotations

import mmap
import threading

import zstandard

from cachebake.errors import CorruptArtifact, UnsafeArtifact

CHUNK = 1 << 20


class Inflating:
    """A read-only, forward-seekable file over a buffer a helper thread is filling.

    Exactly what ``tarfile.open(mode="r:")`` needs: read, seek (absolute), tell.  A read waits
    for the bytes it asks for (or the end of the stream); errors from the helper thread are
    raised in the reader.
    """

    def __init__(self, compressed, size: int):
        # Anonymous mmap: pages come zeroed from the kernel on first touch, where a bytearray
        # would memset the whole declared size up front (~0.5 ms per MB).
        self.buf = mmap.mmap(-1, size) if size > 0 else bytearray()
        self.view = memoryview(self.buf)
        self.filled = 0
        self.pos = 0
        self.error: BaseException | None = None
        self.done = False
        self.cancelled = False
        self.cond = threading.Condition()
        self.reader = zstandard.ZstdDecompressor().stream_reader(compressed, read_size=CHUNK,
                                                                 read_across_frames=True)
        self.thread = threading.Thread(target=self._fill, name="cachebake-inflate", daemon=True)
        self.thread.start()

    def _fill(self) -> None:
        try:
            size = len(self.buf)
            while self.filled < size and not self.cancelled:
                n = self.reader.readinto(self.view[self.filled:min(size, self.filled + CHUNK)])
                if not n:
                    break
                with self.cond:
                    self.filled += n
                    self.cond.notify_all()
            if self.filled == size and not self.cancelled and self.reader.read(1):
                raise UnsafeArtifact(f"layer decompresses past the {size} bytes the manifest "
                                     "declares: refusing a size bomb")
        except zstandard.ZstdError as e:
            self.error = CorruptArtifact(f"layer stream is damaged or truncated: {e}")
        except BaseException as e:  # noqa: BLE001 - handed to the reading thread
            self.error = e
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def read(self, n: int = -1) -> bytes:
        end = len(self.buf) if n is None or n < 0 else self.pos + n
        with self.cond:
            while self.filled < end and not self.done:
                self.cond.wait()
            if self.error is not None:
                raise self.error
            end = min(end, self.filled)
        data = bytes(self.view[self.pos:end]) if end > self.pos else b""
        self.pos = max(self.pos, end)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0:
            raise OSError("Inflating only seeks to absolute offsets")
        self.pos = offset
        return offset

    def tell(self) -> int:
        return self.pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def finish(self) -> memoryview:
        """Wait for the helper; raise its error; return the bytes decompressed."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.view[:self.filled]

    def cancel(self) -> None:
        self.cancelled = True
        self.thread.join()
