"""A Triton cache manager that reads the baked tree read-only and sends misses elsewhere.

Turned on with ``TRITON_CACHE_MANAGER=cachebake.serve.layered:LayeredCacheManager``: Triton
3.6 resolves that knob on every ``get_cache_manager`` call (triton/knobs.py ``env_class``), for
kernels (compiler.py), autotune results (autotuner.py ``check_disk_cache``) and the gcc-built
launcher helpers ``cuda_utils`` / ``__triton_launcher`` (runtime/build.py
``compile_module_from_src``), so one class covers all three.

Layers, read in this order:
1. the baked tree, ``TRITON_CACHE_DIR`` (read-only: an image volume, a read-only PVC, a
   ``readOnlyRootFilesystem``): never written, not even a ``makedirs``;
2. the overlay, ``$CACHEBAKE_OVERLAY_DIR/triton`` (an emptyDir, /tmp): where misses go;
3. this process's spill, when the overlay is unset, unwritable or full: a private dir on
   /dev/shm (tmpfs, so memory) or else in the temp dir, removed at exit.  Not a memfd:
   ``CompiledKernel`` tells a cubin from text by the path's suffix and ``importlib`` loads a
   helper only from a path ending in the extension suffix, and ``/proc/self/fd/N`` has none.
   A kernel compile needs a writable temp dir anyway (ptxas reads its input from one).

Group files hold absolute child paths (Triton writes them, the bake's were rewritten for the
serving root).  This manager ignores those paths and resolves every child inside the layer's
own key dir, where Triton always puts them: the bake hits at whatever path it is mounted,
without ``cachebake install`` rewriting anything.  A layer whose group names a missing file
does not count as a hit (Triton 3.6 crashes on a group without its binary); the next layer is
tried, then the kernel compiles.

Each miss is logged by ``cachebake.serve.misslog`` (one JSON line per miss, with the
compile record when the compilation listener saw it).  Importing this module installs that
listener; on a GPU the first ``get_cache_manager`` call is the ``cuda_utils`` helper at driver
start, before any kernel compiles, so every kernel miss carries its record.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import Dict, Optional

from triton import knobs
from triton.runtime.cache import CacheManager, FileCacheManager

from cachebake.artifact.groups import GROUP_PREFIX
from cachebake.roles import MANAGER_CLASS, MANAGER_ENV, OVERLAY_ENV
from cachebake.serve import READS_ENV, misslog

OVERLAY_ROLE = "triton"  # the overlay mirrors an installed tree: <overlay>/triton/<KEY>/...
AUTOTUNE_SUFFIX = ".autotune.json"
SPILL_MEMORY_DIR = "/dev/shm"  # tmpfs in every container runtime, writable under readOnlyRootFilesystem


class LayeredCacheManager(CacheManager):
    """Reads the baked tree, then the overlay, then this process's spill; writes only to the
    overlay, or to the spill when the overlay refuses: a miss costs a compile, never the
    server.  (Only a machine with no writable temp dir at all fails the write, and there ptxas
    could not have compiled the kernel either.)"""

    def __init__(self, key, override=False, dump=False):
        self.key = key
        if override or dump:
            # TRITON_KERNEL_OVERRIDE / TRITON_KERNEL_DUMP are developer tools with their own
            # directories: Triton's own behaviour, unchanged.
            self._plain: Optional[FileCacheManager] = FileCacheManager(key, override=override, dump=dump)
            return
        self._plain = None
        base = knobs.cache.dir
        # Plain concatenation, not os.path.join: this runs on every hit (bench/layered.md).
        self.base_dir = f"{base}/{key}" if base else None
        overlay = os.environ.get(OVERLAY_ENV)
        self.overlay_dir = f"{overlay}/{OVERLAY_ROLE}/{key}" if overlay else None
        self._spilled = self.overlay_dir is None  # this key's writes spill from the first failure on
        self._triton_reads = os.environ.get(READS_ENV) == "triton"
        self._missed_at: Optional[float] = None

    # -- reads ------------------------------------------------------------------------------

    def get_file(self, filename) -> Optional[str]:
        if self._plain is not None:
            return self._plain.get_file(filename)
        for layer in (self.base_dir, self.overlay_dir):
            if layer is not None:
                path = f"{layer}/{filename}"
                if os.path.exists(path):
                    return path
        path = _SPILL.path(self.key, filename)
        if path is None:
            self._missed_at = time.monotonic()
        return path

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        if self._plain is not None:
            return self._plain.get_group(filename)
        layers = (self.base_dir, self.overlay_dir)
        if self._triton_reads:  # the baked tree exactly as Triton reads it (verify)
            group = _read_group_as_triton(self.base_dir, filename) if self.base_dir else None
            if group is not None and filename in group:
                return group
            layers = (self.overlay_dir,)
        for layer in layers:
            if layer is not None:
                group = _read_group(layer, filename)
                if group is not None:
                    return group
        group = _SPILL.group(self.key, filename)
        if group is None:
            self._missed_at = time.monotonic()
        return group

    # -- writes: only on a miss -------------------------------------------------------------

    def put(self, data, filename, binary=True) -> str:
        if self._plain is not None:
            return self._plain.put(data, filename, binary=binary)
        if not isinstance(data, bytes):
            data = str(data).encode("utf-8")
        path = self._store(data, filename)
        if filename.endswith(AUTOTUNE_SUFFIX) or filename.endswith(misslog.HELPER_SUFFIXES):
            misslog.note_file_miss(self.key, filename, data, self._seconds(), self._where())
        return path

    def put_group(self, filename: str, group: Dict[str, str]) -> str:
        if self._plain is not None:
            return self._plain.put_group(filename, group)
        data = json.dumps({"child_paths": group}).encode("utf-8")
        path = self._store(data, GROUP_PREFIX + filename)
        misslog.note_kernel_miss(self.key, filename, self._seconds(), self._where())
        return path

    def _store(self, data: bytes, filename: str) -> str:
        if not self._spilled:
            try:
                return _write_atomic(self.overlay_dir, filename, data)
            except OSError as e:
                _warn_once(f"cachebake: the overlay {os.environ.get(OVERLAY_ENV)} cannot be "
                           f"written ({e.strerror or e}); misses of pid {os.getpid()} go to a "
                           "private temp dir and are recompiled by each process")
                self._spilled = True
        return _SPILL.write(self.key, filename, data)

    def _where(self) -> str:
        return "spill" if self._spilled else "overlay"

    def _seconds(self) -> Optional[float]:
        return None if self._missed_at is None else round(time.monotonic() - self._missed_at, 4)


def _read_group(layer_dir: str, filename: str) -> Optional[Dict[str, str]]:
    """The group ``filename`` of one layer's key dir, every child resolved in that key dir;
    None unless it names ``filename`` and all its children exist there."""
    try:
        with open(f"{layer_dir}/{GROUP_PREFIX}{filename}") as f:
            children = json.load(f).get("child_paths")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):  # unreadable or not Triton's JSON: a miss
        return None
    if not isinstance(children, dict) or filename not in children:
        return None
    result = {}
    prefix = layer_dir + "/"
    exists = os.path.exists
    for child in children:
        if not isinstance(child, str) or "/" in child:
            return None
        path = prefix + child
        if not exists(path):
            return None
        result[child] = path
    return result


def _read_group_as_triton(layer_dir: str, filename: str) -> Optional[Dict[str, str]]:
    """What Triton 3.6's FileCacheManager.get_group returns: the group's absolute child paths
    that exist (runtime/cache.py), a partial group included."""
    try:
        with open(f"{layer_dir}/{GROUP_PREFIX}{filename}") as f:
            children = json.load(f).get("child_paths")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(children, dict):
        return None
    return {c: p for c, p in children.items() if os.path.exists(p)}


def _write_atomic(key_dir: str, filename: str, data: bytes) -> str:
    """Write as Triton's FileCacheManager does (a ``tmp.pid_*`` dir, then ``os.replace``), so
    processes sharing the overlay never read a partial file; nothing is left on failure."""
    os.makedirs(key_dir, exist_ok=True)
    final = os.path.join(key_dir, filename)
    tmp_dir = os.path.join(key_dir, f"tmp.pid_{os.getpid()}_{uuid.uuid4()}")
    os.mkdir(tmp_dir)
    tmp = os.path.join(tmp_dir, filename)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)
    finally:
        try:
            if os.path.exists(tmp):
                os.unlink(tmp)
            os.rmdir(tmp_dir)
        except OSError:
            pass
    return final


class _Spill:
    """This process's own copies of entries the overlay would not take: a private dir on
    tmpfs (/dev/shm: memory) or else in the temp dir (a kernel compile needs one anyway:
    ptxas writes its input there).  Indexed in memory, removed at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], str] = {}  # (key, filename) -> path
        self._roots: dict[str, str] = {}  # candidate -> private dir made in it
        self._full: set[str] = set()
        self._pid = os.getpid()

    def path(self, key: str, filename: str) -> Optional[str]:
        if not self._files:
            return None
        path = self._files.get((key, filename))
        return path if path is not None and os.path.exists(path) else None

    def group(self, key: str, filename: str) -> Optional[Dict[str, str]]:
        """A spilled group, read with its absolute child paths (some children may be in the
        overlay, written before it failed)."""
        path = self.path(key, GROUP_PREFIX + filename)
        if path is None:
            return None
        try:
            with open(path) as f:
                children = json.load(f)["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if filename not in children or not all(os.path.exists(p) for p in children.values()):
            return None
        return dict(children)

    def write(self, key: str, filename: str, data: bytes) -> str:
        with self._lock:
            for candidate in (SPILL_MEMORY_DIR, tempfile.gettempdir()):
                if candidate in self._full:
                    continue
                try:
                    root = self._roots.get(candidate)
                    if root is None:
                        root = self._roots[candidate] = tempfile.mkdtemp(
                            prefix=f"cachebake-spill-{os.getpid()}-", dir=candidate)
                    path = _write_atomic(os.path.join(root, key), filename, data)
                except OSError:
                    self._full.add(candidate)
                    continue
                self._files[(key, filename)] = path
                return path
        raise OSError(28, "no writable place for a Triton cache entry: the overlay, "
                          f"{SPILL_MEMORY_DIR} and the temp dir all refused it")

    def remove(self) -> None:
        if os.getpid() == self._pid:
            for root in self._roots.values():
                shutil.rmtree(root, ignore_errors=True)


_SPILL = _Spill()
atexit.register(_SPILL.remove)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    key = message.split(";")[0]
    if key not in _warned:
        _warned.add(key)
        print(message, file=sys.stderr, flush=True)


def activate() -> bool:
    """Serve this process through the layered manager even where TRITON_CACHE_MANAGER is
    not set (the vLLM plugin calls this when $CACHEBAKE_OVERLAY_DIR is).  Another manager
    configured on purpose is left alone (a warning says so).  True if ours is in use."""
    current = knobs.cache.manager_class
    if current is None or current is FileCacheManager:
        knobs.cache.manager_class = LayeredCacheManager
    elif not issubclass(current, LayeredCacheManager):
        _warn_once(f"cachebake: {OVERLAY_ENV} is set but Triton's cache manager is "
                   f"{current.__module__}.{current.__qualname__}; the layered cache stays off")
        return False
    misslog.install_listener()
    return True


def _pin_knob() -> None:
    """When TRITON_CACHE_MANAGER names this class, store it in the knob itself: Triton then
    skips its per-call resolution (getenv, import_module, an MRO scan: ~4 us of every hit,
    bench/layered.md).  The monitor still wraps it (it reads the knob, then assigns)."""
    if os.environ.get(MANAGER_ENV) == MANAGER_CLASS and "manager_class" not in knobs.cache.__dict__:
        knobs.cache.manager_class = LayeredCacheManager


_pin_knob()
misslog.install_listener()
