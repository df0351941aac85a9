"""Writing a checked layer into its private staging directory.

The extractor's thread parses and checks each entry (extract.py) and hands what passed to
``Staging``, which creates it: directories with mkdir, files with O_CREAT|O_EXCL|O_NOFOLLOW,
always relative to directory fds opened below the staging directory, so no path is resolved
twice and nothing outside it can be reached.

Where the files are written is a measured choice (bench/install.md, ``--lanes``), made again
by each install from what its filesystem does:

* directories are always made on the extractor's thread, before any file in them is handed
  on, so a file's directory exists whoever writes the file;
* on tmpfs the copy into memory is the cost and does not overlap: more threads only add
  hand-overs, so ``lanes=0`` writes on the extractor's thread itself;
* on a disk, it depends on how long creating a file takes.  The same ext4 here took ~40 us one
  run and ~140 us another (bench/install.md).  When it is slow, creation is most of the cost,
  and threads creating files in different directories overlap in the kernel (open/write/close
  release the GIL); when it is fast, threads only add hand-overs, as on tmpfs.  So the
  extractor's thread writes files itself, timing each creation, and as soon as the median of
  the last ``PROBE_FILES`` is over ``SLOW_CREATE_S`` the rest go to ``DISK_LANES`` writer
  threads, each file to the lane of its directory (assigned round-robin as directories first
  appear), so each thread reuses its directory fds.  The decision is not made once at the
  start: the first creations on a disk are often fast and later ones slow (on the ext4 here,
  ~15 us for the first 32 of a layer, ~200 us after some 40 MB were written).

A file's data arrives as views into the decompressed chunks (no copy); entries go to a lane in
batches (one lock round trip per batch), and each lane's queue bounds how many batches, so how
many chunks, are in flight.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Callable

from cachebake.fsops import DIR_FLAGS, in_memory, write_all

# bench/install.md, ext4 with slow file creation: 3 lanes 314 ms, 2 lanes 396, 0 lanes 652 on
# 16 CPUs; 2 and 3 about equal on 2 CPUs.  0 was best on tmpfs, and on ext4 when creation is fast.
DISK_LANES = 3
PROBE_FILES = 32  # creations in each timed window
SLOW_CREATE_S = 80e-6  # ext4 here: ~40 us a creation when fast, ~140 us when slow; tmpfs ~3 us
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_OPEN_DIRS = 64  # per writer
QUEUE_DEPTH = 8  # batches in flight per lane
BATCH_ENTRIES = 64  # entries per hand-over: one lock round trip per batch, not per entry
BATCH_BYTES = 1 << 20
_STOP = None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class StagingWriter:
    """Creates entries below ``root_fd`` (a fresh directory only we write to) through
    directory fds: O_NOFOLLOW and O_EXCL everywhere.  One per thread (its fd cache is its own)."""

    def __init__(self, root_fd: int):
        self.root_fd = root_fd
        self.creations: list[float] | None = None  # a list: time each file's creation into it
        self._fds: dict[str, int] = {}
        self.umask = os.umask(0o022)
        os.umask(self.umask)

    def _dir_fd(self, path: str) -> int:
        if not path:
            return self.root_fd
        fd = self._fds.get(path)
        if fd is None:
            parent, _, leaf = path.rpartition("/")
            fd = os.open(leaf, DIR_FLAGS, dir_fd=self._dir_fd(parent))
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

    def write_file(self, path: str, mode: int, data: list[memoryview]) -> None:
        """Create ``path`` with ``data``."""
        parent, _, leaf = path.rpartition("/")
        dir_fd = self._dir_fd(parent)
        if self.creations is None:
            fd = os.open(leaf, _FILE_FLAGS, mode, dir_fd=dir_fd)
        else:
            started = time.perf_counter()
            fd = os.open(leaf, _FILE_FLAGS, mode, dir_fd=dir_fd)
            self.creations.append(time.perf_counter() - started)
        try:
            if mode & self.umask:  # the umask dropped bits the server needs
                os.fchmod(fd, mode)
            for view in data:
                write_all(fd, view)
        finally:
            os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class _Lane:
    """One writer thread: writes the files handed to it, in order."""

    def __init__(self, root_fd: int, index: int):
        self.error: BaseException | None = None
        self._out = StagingWriter(root_fd)
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_DEPTH)
        self._cancelled = False
        self._batch: list = []
        self._batch_bytes = 0
        self._thread = threading.Thread(target=self._run, name=f"cachebake-staging-{index}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        out = self._out
        try:
            while True:
                batch = self._queue.get()
                if batch is _STOP or self._cancelled:
                    break
                if self.error is not None:
                    continue  # keep draining so the extractor never blocks on a full queue
                try:
                    for name, mode, data in batch:
                        if self._cancelled:
                            break
                        out.write_file(name, mode, data)
                except BaseException as e:  # noqa: BLE001 - handed to the extractor's thread
                    self.error = e
        finally:
            out.close()

    def add(self, name: str, mode: int, data: list[memoryview]) -> None:
        if self.error is not None:
            raise self.error
        self._batch.append((name, mode, data))
        self._batch_bytes += sum(v.nbytes for v in data)
        if len(self._batch) >= BATCH_ENTRIES or self._batch_bytes >= BATCH_BYTES:
            self._queue.put(self._batch)
            self._batch, self._batch_bytes = [], 0

    def finish(self) -> None:
        if self._batch and self.error is None:
            self._queue.put(self._batch)
        self._batch = []
        self._queue.put(_STOP)
        self._thread.join()

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


class Staging:
    """``mkdir``/``write`` create a checked entry (see the module doc for which thread writes);
    ``finish`` waits for the lanes and raises their first error (disk full, EIO); ``cancel``
    stops them after their current entry."""

    def __init__(self, root_fd: int, stats, checkpoint: Callable[[str], None], lanes: int | None = None):
        """``lanes``: writer threads; None lets the filesystem decide (module doc).
        ``stats.dirs`` gets each directory made, in order."""
        self.root_fd = root_fd
        self.stats = stats
        self.checkpoint = checkpoint
        self._out = StagingWriter(root_fd)  # directories, and files until lanes take them
        self._lanes: list[_Lane] = []
        self._lane_of: dict[str, _Lane] = {}  # directory -> the lane writing its files
        if lanes is None and not in_memory(root_fd):
            self._out.creations = []  # write here, timing creations in windows of PROBE_FILES
        elif lanes:
            self._start_lanes(lanes)

    @property
    def lanes(self) -> int:
        """Writer threads now (0: the extractor's thread writes)."""
        return len(self._lanes)

    def _start_lanes(self, count: int) -> None:
        self._lanes = [_Lane(self.root_fd, i) for i in range(count)]

    def _choose(self) -> None:
        """After each PROBE_FILES timed creations: lanes from now on if creating a file has
        become slow here; otherwise time the next window."""
        times = sorted(self._out.creations)  # the median, without importing statistics (~2 ms)
        if times[len(times) // 2] > SLOW_CREATE_S:
            self._out.creations = None
            self._start_lanes(min(DISK_LANES, usable_cpus()))
        else:
            self._out.creations = []

    def mkdir(self, name: str) -> None:
        self._out.mkdir(name, self.stats.dirs)
        self.checkpoint("entry")

    def write(self, name: str, mode: int, data: list[memoryview]) -> None:
        self._out.ensure_parents(name, self.stats.dirs)
        if not self._lanes:
            self._out.write_file(name, mode, data)
            self.checkpoint("entry")
            if self._out.creations is not None and len(self._out.creations) >= PROBE_FILES:
                self._choose()
            return
        parent = name.rpartition("/")[0]
        lane = self._lane_of.get(parent)
        if lane is None:
            lane = self._lane_of[parent] = self._lanes[len(self._lane_of) % len(self._lanes)]
        lane.add(name, mode, data)
        # on this thread, where the checkpoint may raise (a deferred Ctrl-C: the install's
        # DeferredInterrupt), one per file as in the lane-less path
        self.checkpoint("entry")

    def finish(self) -> None:
        try:
            for lane in self._lanes:
                lane.finish()
        finally:
            self._out.close()
        for lane in self._lanes:
            if lane.error is not None:
                raise lane.error

    def cancel(self) -> None:
        try:
            for lane in self._lanes:
                lane.cancel()
        finally:
            self._out.close()
