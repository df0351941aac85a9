"""Writing a checked layer into its private staging directory, on a thread of its own.

The extractor's main thread parses and checks each entry (extract.py) and hands what passed
to ``StagingThread``, which creates it, in order: directories with mkdir, files with
O_CREAT|O_EXCL|O_NOFOLLOW, always relative to directory fds it opened itself below the
staging directory, so no path is resolved twice and nothing outside it can be reached.
open/write/close release the GIL, so file creation overlaps with the parsing of the next
headers (on a disk, creating files is most of `tar -x`'s time too).  A file's data arrives as
views into the decompressed chunks (no copy); entries go over in batches (one lock round trip
per batch), and the queue bounds how many batches, so how many chunks, are in flight.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable

MAX_OPEN_DIRS = 64
QUEUE_DEPTH = 8  # batches in flight
BATCH_ENTRIES = 64  # entries per hand-over: one lock round trip per batch, not per entry
BATCH_BYTES = 1 << 20
_STOP = None


class StagingWriter:
    """Creates entries below ``root_fd`` (a fresh directory only we write to) through
    directory fds: O_NOFOLLOW and O_EXCL everywhere."""

    def __init__(self, root_fd: int):
        self.root_fd = root_fd
        self._fds: dict[str, int] = {}
        self.umask = os.umask(0o022)
        os.umask(self.umask)

    def _dir_fd(self, path: str) -> int:
        if not path:
            return self.root_fd
        fd = self._fds.get(path)
        if fd is None:
            parent, _, leaf = path.rpartition("/")
            fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=self._dir_fd(parent))
            if len(self._fds) >= MAX_OPEN_DIRS:  # entries come sorted: old dirs are done
                os.close(self._fds.pop(next(iter(self._fds))))
            self._fds[path] = fd
        return fd

    def mkdir(self, path: str, made: list[str]) -> None:
        self.ensure_parents(path, made)
        parent, _, leaf = path.rpartition("/")
        try:
            os.mkdir(leaf, 0o755, dir_fd=self._dir_fd(parent))
        except FileExistsError:
            return  # implied by an earlier entry (the checker made sure it is a directory)
        if 0o755 & self.umask:
            os.fchmod(self._dir_fd(path), 0o755)
        made.append(path)

    def ensure_parents(self, path: str, made: list[str]) -> None:
        """Create the directories a layer implies without listing them."""
        parent = path.rpartition("/")[0]
        if not parent or parent in self._fds:
            return
        missing = []
        while parent:
            try:
                self._dir_fd(parent)
                break
            except FileNotFoundError:
                missing.append(parent)
                parent = parent.rpartition("/")[0]
        for d in reversed(missing):
            self.mkdir(d, made)

    def write_file(self, path: str, mode: int, data: list[memoryview]) -> os.stat_result:
        parent, _, leaf = path.rpartition("/")
        fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=self._dir_fd(parent))
        try:
            if mode & self.umask:  # the umask dropped bits the server needs
                os.fchmod(fd, mode)
            for view in data:
                while view:
                    view = view[os.write(fd, view):]
            return os.fstat(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class StagingThread:
    """``mkdir``/``write`` queue work for the writer thread; ``finish`` waits for it and raises
    its error (disk full, EIO); ``cancel`` stops it after the current entry."""

    def __init__(self, root_fd: int, stats, checkpoint: Callable[[str], None]):
        self.stats = stats
        self.checkpoint = checkpoint
        self.error: BaseException | None = None
        self._out = StagingWriter(root_fd)
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_DEPTH)
        self._cancelled = False
        self._batch: list = []
        self._batch_bytes = 0
        self._thread = threading.Thread(target=self._run, name="cachebake-staging", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stats, out = self.stats, self._out
        while True:
            batch = self._queue.get()
            if batch is _STOP or self._cancelled:
                break
            if self.error is not None:
                continue
            try:
                for name, mode, data in batch:
                    if self._cancelled:
                        break
                    if data is None:
                        out.mkdir(name, stats.dirs)
                    else:
                        out.ensure_parents(name, stats.dirs)
                        st = out.write_file(name, mode, data)
                        stats.inventory[name] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
                    self.checkpoint("entry")
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                self.error = e
        out.close()

    def _add(self, item, nbytes: int) -> None:
        self._batch.append(item)
        self._batch_bytes += nbytes
        if len(self._batch) >= BATCH_ENTRIES or self._batch_bytes >= BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.error is not None:
            raise self.error
        if self._batch:
            self._queue.put(self._batch)
            self._batch, self._batch_bytes = [], 0

    def mkdir(self, name: str) -> None:
        self._add((name, 0o755, None), 0)

    def write(self, name: str, mode: int, data: list[memoryview]) -> None:
        self._add((name, mode, data), sum(v.nbytes for v in data))

    def finish(self) -> None:
        self._flush()
        self._queue.put(_STOP)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self._cancelled = True
        while True:  # make room for the stop mark; the thread exits at its next item
            try:
                self._queue.put_nowait(_STOP)
                break
            except queue.Full:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    pass
        self._thread.join()
