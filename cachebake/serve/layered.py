"""A Triton cache manager that reads the baked tree read-only and sends misses elsewhere.

Turned on with ``TRITON_CACHE_MANAGER=cachebake.serve.layered:LayeredCacheManager``: Triton
3.6 resolves that knob on every ``get_cache_manager`` call (triton/knobs.py ``env_class``), for
kernels (compiler.py), autotune results (autotuner.py ``check_disk_cache``) and the gcc-built
launcher helpers ``cuda_utils`` / ``__triton_launcher`` (runtime/build.py
``compile_module_from_src``), so one class covers all three.

Layers, read in this order:
1. the baked tree, ``TRITON_CACHE_DIR`` (read-only: an image volume, a read-only PVC, a
   ``readOnlyRootFilesystem``): never written, not even a ``makedirs``;
2. the overlay, ``$CACHEBAKE_OVERLAY_DIR/triton`` (an emptyDir, /tmp): where misses go, used
   only while it is this process's own (cachebake.serve.overlay: made 0700, refused when
   another uid owns it, others can write it, or it is a link);
3. this process's spill, when the overlay is unset, refused, unwritable or full: a private dir
   on /dev/shm (tmpfs, so memory) or else in the temp dir, removed at exit.  Not a memfd:
   ``CompiledKernel`` tells a cubin from text by the path's suffix and ``importlib`` loads a
   helper only from a path ending in the extension suffix, and ``/proc/self/fd/N`` has none.
   A kernel compile needs a writable temp dir anyway (ptxas reads its input from one).

Group files hold absolute child paths (Triton writes them, the bake's were rewritten for the
serving root).  This manager ignores those paths and resolves every child inside the layer's
own key dir, where Triton always puts them: the bake hits at whatever path it is mounted,
without ``cachebake install`` rewriting anything.

An entry is a hit only if Triton can load it without raising, so a corrupt or partial one (a
truncated metadata ``.json``, a group naming a missing file, a FIFO, a link, a file of another
uid in the overlay) is a miss: the next layer is tried, then the kernel compiles into the
overlay, and the miss log's line says why (``reason``).  Triton 3.6 reads, after
``get_group`` returns (compiler.py ``CompiledKernel.__init__``): the first child ending in
``.json`` (json.loads; then ``GPUTarget(**target)``, a namedtuple of every field, the backend's
``pack_metadata``: num_warps, num_ctas, shared) and every other child by its suffix, the
binary (``cubin``/``hsaco``) required.  So before a group is returned each child is checked to
be a regular file of bounded size (an fd-relative lstat, links not followed) and the metadata
is read (bounded) and checked for exactly those fields; an autotune result is checked for what
``Autotuner.check_disk_cache`` does with it (``Config(**config)`` per entry, ``min`` over the
timings).  Not checked (a cost on every hit, bench/layered.md): the IR texts' encoding and the
binary's validity, which the GPU driver checks when it loads it.

Each miss is logged by ``cachebake.serve.misslog`` (one JSON line per miss, with the
compile record when the compilation listener saw it).  Importing this module installs that
listener; on a GPU the first ``get_cache_manager`` call is the ``cuda_utils`` helper at driver
start, before any kernel compiles, so every kernel miss carries its record.
"""

from __future__ import annotations

import atexit
import json
import keyword
import os
import shutil
import tempfile
import threading
import time
import uuid
from typing import Dict, Optional

from triton import knobs
from triton.runtime.cache import CacheManager, FileCacheManager

from cachebake.artifact.groups import GROUP_PREFIX
from cachebake.artifact.schema import CAP_GROUP_FILE
from cachebake.fsops import DIR_FLAGS
from cachebake.roles import MANAGER_CLASS, MANAGER_ENV, OVERLAY_ENV
from cachebake.serve import READS_ENV, misslog
from cachebake.serve import overlay as overlay_mod
from cachebake.serve.overlay import READ_FLAGS, file_problem, open_error, read_bounded, warn_once

OVERLAY_ROLE = overlay_mod.ROLE
AUTOTUNE_SUFFIX = ".autotune.json"
SPILL_MEMORY_DIR = "/dev/shm"  # tmpfs in every container runtime, writable under readOnlyRootFilesystem
# Bounds on what a lookup reads or hands Triton.  Triton writes metadata of a few KB and
# autotune results of a few KB per candidate config; a kernel's IR or binary of more than
# 1 GiB is not one Triton made.
CAP_METADATA = 1 << 20
CAP_AUTOTUNE = 16 << 20
CAP_ENTRY_FILE = 1 << 30
# backends/nvidia/compiler.py and backends/amd/compiler.py: ``self.binary_ext``; a target of
# any other backend makes ``make_backend`` raise.
BINARY_SUFFIX = {"cuda": ".cubin", "hip": ".hsaco"}
METADATA_INTS = ("num_warps", "num_ctas", "shared")  # what pack_metadata reads, both backends
BAKE, OVERLAY = "bake", "overlay"


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
        self._overlay = overlay_mod.current()
        self._spilled = self._overlay is None  # this key's writes spill from the first failure on
        self._triton_reads = os.environ.get(READS_ENV) == "triton"
        self._missed_at: Optional[float] = None
        self._bad: Optional[list] = None  # why entries found for this key were not used

    # -- reads ------------------------------------------------------------------------------

    def get_file(self, filename) -> Optional[str]:
        if self._plain is not None:
            return self._plain.get_file(filename)
        if self.base_dir is not None:
            fd = self._bake_key_dir()
            if fd is not None:
                try:
                    if self._file_ok(BAKE, fd, filename, None):
                        return f"{self.base_dir}/{filename}"
                finally:
                    os.close(fd)
        overlay = self._usable_overlay()
        if overlay is not None:
            fd = overlay.key_dir(self.key, create=False)
            if fd is not None:
                try:
                    if self._file_ok(OVERLAY, fd, filename, overlay.uid):
                        path = overlay.path_of(self.key, filename)
                        if path is not None:
                            return path
                finally:
                    os.close(fd)
        path = _SPILL.path(self.key, filename)
        if path is None:
            self._missed_at = time.monotonic()
        return path

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        if self._plain is not None:
            return self._plain.get_group(filename)
        if self._triton_reads:  # the baked tree exactly as Triton reads it (verify)
            group = self._bake_group_as_triton(filename) if self.base_dir else None
            if group is not None:
                return group
        elif self.base_dir is not None:
            fd = self._bake_key_dir()
            if fd is not None:
                try:
                    group = self._group(BAKE, fd, self.base_dir + "/", filename, None)
                finally:
                    os.close(fd)
                if group is not None:
                    return group
        overlay = self._usable_overlay()
        if overlay is not None:
            fd = overlay.key_dir(self.key, create=False)
            if fd is not None:
                try:
                    group = self._group(OVERLAY, fd, f"{overlay.path}/{OVERLAY_ROLE}/{self.key}/",
                                        filename, overlay.uid)
                finally:
                    os.close(fd)
                if group is not None and overlay.still_pinned():
                    return group
        overlay_dir = f"{overlay.path}/{OVERLAY_ROLE}/{self.key}/" if overlay is not None else None
        group = _SPILL.group(self.key, filename, overlay_dir)
        if group is None:
            self._missed_at = time.monotonic()
        return group

    def _bake_key_dir(self) -> Optional[int]:
        """An fd of this key's dir in the baked tree (the caller closes it), None if absent."""
        try:
            return os.open(self.base_dir, DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._note_bad(BAKE, "the key dir", open_error(e))
            return None

    def _usable_overlay(self):
        """The overlay to read, if it exists and is this process's own (checked once)."""
        overlay = self._overlay
        if overlay is None or overlay.root(create=False) is None:
            return None
        _check_apart(overlay, knobs.cache.dir)
        return overlay if overlay.refused is None else None

    def _note_bad(self, layer: str, name: str, why: str) -> None:
        if self._bad is None:
            self._bad = []
        self._bad.append(f"{layer}: {name} {why}")

    def _group(self, layer: str, kfd: int, prefix: str, filename: str,
               uid: Optional[int]) -> Optional[Dict[str, str]]:
        """The group ``filename`` of one layer's key dir (``kfd``; ``prefix``: its path), every
        child a checked regular file in that dir and the metadata one Triton can load; None
        otherwise (with the reason noted unless the group is simply absent).  Opening relative
        to the dir's fd costs no more than by path (measured: 33 us a group either way) and
        follows no link in the key dir's name either.  The metadata comes first: Triton reads
        the first child ending in ``.json``."""
        grp_name = GROUP_PREFIX + filename
        data, why = _read_small(kfd, grp_name, uid, CAP_GROUP_FILE)
        if data is None:
            if why is not None:
                self._note_bad(layer, grp_name, why)
            return None
        try:
            children = json.loads(data)["child_paths"]
        except (ValueError, RecursionError, KeyError, TypeError) as e:  # not Triton's JSON
            self._note_bad(layer, grp_name, f"unreadable ({_json_error(e)})")
            return None
        if not isinstance(children, dict) or filename not in children:
            self._note_bad(layer, grp_name, f"does not name {filename}")
            return None
        result = {filename: prefix + filename}
        stat_at = os.stat
        for child in children:
            if child == filename:
                continue
            if "/" in child or child in (".", "..") or "\x00" in child:
                self._note_bad(layer, grp_name, f"names {child!r}, not a file of its key dir")
                return None
            try:
                st = stat_at(child, dir_fd=kfd, follow_symlinks=False)
            except OSError as e:
                self._note_bad(layer, child, "is missing" if e.errno == 2 else open_error(e))
                return None
            why = file_problem(st, uid, CAP_ENTRY_FILE)
            if why is not None:
                self._note_bad(layer, child, why)
                return None
            result[child] = prefix + child
        data, why = _read_small(kfd, filename, uid, CAP_METADATA)
        if data is None:
            self._note_bad(layer, filename, why or "is missing")
            return None
        why = metadata_problem(data, result)
        if why is not None:
            self._note_bad(layer, filename, why)
            return None
        return result

    def _file_ok(self, layer: str, kfd: int, filename: str, uid: Optional[int]) -> bool:
        """Whether ``filename`` (an autotune result, a launcher helper) is in this key dir as
        something Triton can use; a bad one is noted."""
        if filename.endswith(AUTOTUNE_SUFFIX):
            data, why = _read_small(kfd, filename, uid, CAP_AUTOTUNE)
            if data is not None:
                why = autotune_problem(data)
        else:
            try:
                st = os.stat(filename, dir_fd=kfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            except OSError as e:
                self._note_bad(layer, filename, open_error(e))
                return False
            why = file_problem(st, uid, CAP_ENTRY_FILE)
            data = b""
        if why is not None:
            self._note_bad(layer, filename, why)
        return data is not None and why is None

    def _bake_group_as_triton(self, filename: str) -> Optional[Dict[str, str]]:
        """What Triton 3.6's FileCacheManager.get_group returns (runtime/cache.py): the group's
        absolute child paths that exist, a partial group included; and then only if Triton can
        load it (the same checks as above, on the paths it follows), or else None."""
        grp_name = GROUP_PREFIX + filename
        data, why = _read_small(None, f"{self.base_dir}/{grp_name}", None, CAP_GROUP_FILE)
        if data is None:
            if why is not None:
                self._note_bad(BAKE, grp_name, why)
            return None
        try:
            children = json.loads(data).get("child_paths")
        except (ValueError, RecursionError, AttributeError) as e:
            self._note_bad(BAKE, grp_name, f"unreadable ({_json_error(e)})")
            return None
        if not isinstance(children, dict):
            return None
        group = {}
        for child, path in children.items():
            try:
                st = os.stat(path)  # Triton follows links: os.path.exists
            except (OSError, TypeError, ValueError):
                continue
            why = file_problem(st, None, CAP_ENTRY_FILE)
            if why is not None:
                self._note_bad(BAKE, child, why)
                return None
            group[child] = path
        if filename not in group:
            return None  # Triton's own answer (no metadata) is a miss: the overlay is next
        data, why = _read_small(None, group[filename], None, CAP_METADATA)
        why = why or (metadata_problem(data, group) if data is not None else "is missing")
        if why is not None:
            self._note_bad(BAKE, filename, why)
            return None
        return {filename: group[filename], **group}

    # -- writes: only on a miss -------------------------------------------------------------

    def put(self, data, filename, binary=True) -> str:
        if self._plain is not None:
            return self._plain.put(data, filename, binary=binary)
        if not isinstance(data, bytes):
            data = str(data).encode("utf-8")
        path = self._store(data, filename)
        if filename.endswith(AUTOTUNE_SUFFIX) or filename.endswith(misslog.HELPER_SUFFIXES):
            misslog.note_file_miss(self.key, filename, data, self._seconds(), self._where(),
                                   reason=self._reason())
        return path

    def put_group(self, filename: str, group: Dict[str, str]) -> str:
        if self._plain is not None:
            return self._plain.put_group(filename, group)
        data = json.dumps({"child_paths": group}).encode("utf-8")
        path = self._store(data, GROUP_PREFIX + filename)
        misslog.note_kernel_miss(self.key, filename, self._seconds(), self._where(), reason=self._reason())
        return path

    def _store(self, data: bytes, filename: str) -> str:
        if not self._spilled:
            overlay = self._overlay
            _check_apart(overlay, knobs.cache.dir)
            try:
                path = overlay.write(self.key, filename, data)
            except OSError as e:
                warn_once(f"cachebake: the overlay {overlay.path} cannot be written "
                          f"({e.strerror or e}); misses of pid {os.getpid()} go to a private "
                          "temp dir and are recompiled by each process")
                path = None
            if path is not None:
                return path
            self._spilled = True  # refused (the overlay said why) or unwritable
        return _SPILL.write(self.key, filename, data)

    def _where(self) -> str:
        return "spill" if self._spilled else "overlay"

    def _seconds(self) -> Optional[float]:
        return None if self._missed_at is None else round(time.monotonic() - self._missed_at, 4)

    def _reason(self) -> Optional[str]:
        return "; ".join(self._bad) if self._bad else None


def _read_small(dir_fd: Optional[int], name: str, uid: Optional[int], cap: int):
    """(bytes, None) of a regular file of at most ``cap`` bytes, opened without following a
    link or blocking (relative to ``dir_fd`` when given); (None, None) if absent; (None,
    reason) if it is something else."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, open_error(e)
    try:
        st = os.fstat(fd)
        why = file_problem(st, uid, cap)
        if why is not None:
            return None, why
        return read_bounded(fd, st.st_size), None
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)


def _json_error(e: Exception) -> str:
    if isinstance(e, ValueError):
        return f"not valid JSON: {str(e).splitlines()[0][:120]}"
    if isinstance(e, RecursionError):
        return "nested too deep"
    return "not the JSON Triton writes"


_METADATA_FIELDS_OK: set = set()  # field-name tuples already checked (one per Triton version)


def metadata_problem(data: bytes, group: Dict[str, str]) -> Optional[str]:
    """Why Triton 3.6's ``CompiledKernel(src, group, hash)`` would raise on this metadata
    (None: it would not): compiler/compiler.py json-loads it, builds
    ``GPUTarget(target['backend'], target['arch'], target['warp_size'])`` and a namedtuple of
    every field, reads ``name`` and pack_metadata's fields, and the group's binary."""
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError) as e:
        return f"metadata unreadable ({_json_error(e)})"
    if not isinstance(meta, dict):
        return "metadata unreadable (not a JSON object)"
    fields = tuple(meta)
    if fields not in _METADATA_FIELDS_OK:
        bad = next((k for k in fields if not k.isidentifier() or k.startswith("_") or keyword.iskeyword(k)), None)
        if bad is not None:
            return f"metadata unreadable (field {bad[:40]!r} cannot be a namedtuple field)"
        if len(_METADATA_FIELDS_OK) < 64:
            _METADATA_FIELDS_OK.add(fields)
    target = meta.get("target")
    if not isinstance(target, dict) or not {"backend", "arch", "warp_size"} <= target.keys():
        return "metadata unreadable (no target backend, arch and warp_size)"
    suffix = BINARY_SUFFIX.get(target["backend"]) if isinstance(target["backend"], str) else None
    if suffix is None:
        return f"metadata unreadable (target backend {str(target['backend'])[:40]!r} is not one Triton has)"
    if not isinstance(meta.get("name"), str):
        return "metadata unreadable (no kernel name)"
    for name in METADATA_INTS:
        value = meta.get(name)
        if type(value) is not int:
            return f"metadata unreadable ({name} is not an integer)"
    if not any(child.endswith(suffix) for child in group):
        return f"the group holds no {suffix} binary"
    return None


_CONFIG_FIELDS: Optional[frozenset] = None


def autotune_problem(data: bytes) -> Optional[str]:
    """Why Triton 3.6's ``Autotuner.check_disk_cache`` would raise on, or be steered by, this
    result (None: neither): it json-loads it, builds ``Config(**config)`` for each entry of
    ``configs_timings`` (hashed: kwargs values must be scalars) and takes the ``min`` of the
    timings (all of one kind).  A ``pre_hook`` or an ``ir_override`` (a file Triton would read
    as the kernel's IR) is never what Triton wrote for a cached config of a bake."""
    global _CONFIG_FIELDS
    if _CONFIG_FIELDS is None:
        import inspect

        from triton import Config

        _CONFIG_FIELDS = frozenset(inspect.signature(Config.__init__).parameters) - {"self"}
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        return f"autotune result unreadable ({_json_error(e)})"
    timings = doc.get("configs_timings") if isinstance(doc, dict) else None
    if not isinstance(timings, list) or not timings:
        return "autotune result unreadable (no configs_timings)"
    kinds = set()
    scalar = (int, float, str, bool, type(None))
    for item in timings:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], dict)):
            return "autotune result unreadable (an entry is not [config, timing])"
        config, timing = item
        if not config.keys() <= _CONFIG_FIELDS or not isinstance(config.get("kwargs"), dict):
            return "autotune result unreadable (a config Triton's Config does not take)"
        if not all(isinstance(v, scalar) for v in config["kwargs"].values()):
            return "autotune result unreadable (a config value is not a scalar)"
        if config.get("pre_hook") is not None or config.get("ir_override") is not None:
            return "autotune result names a pre_hook or an IR override file"
        if isinstance(timing, list):
            if not timing or not all(isinstance(t, (int, float)) for t in timing):
                return "autotune result unreadable (a timing is not a list of numbers)"
            kinds.add(list)
        elif isinstance(timing, (int, float)):
            kinds.add(float)
        else:
            return "autotune result unreadable (a timing is not a number)"
    if len(kinds) > 1:
        return "autotune result unreadable (timings of two kinds, which min() cannot compare)"
    return None


_apart_checked: set = set()


def _check_apart(overlay, base: Optional[str]) -> None:
    """Refuse an overlay whose ``triton`` dir is, contains or lies in the baked tree (after
    resolving links): writing there would write the bake.  Once per overlay and bake."""
    if not base or (overlay.path, base) in _apart_checked:
        return
    _apart_checked.add((overlay.path, base))
    mine = os.path.realpath(f"{overlay.path}/{OVERLAY_ROLE}")
    bake = os.path.realpath(base)
    if mine == bake or mine.startswith(bake + "/") or bake.startswith(mine + "/"):
        overlay.refuse(f"its {OVERLAY_ROLE}/ dir resolves into the baked tree {bake}")


def _write_atomic(key_dir: str, filename: str, data: bytes) -> str:
    """Write as Triton's FileCacheManager does (a ``tmp.pid_*`` dir, then ``os.replace``):
    here only into the spill, a private dir this process made (mkdtemp: 0700)."""
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

    def group(self, key: str, filename: str, overlay_dir: Optional[str]) -> Optional[Dict[str, str]]:
        """A spilled group, read with its absolute child paths: in the spill, or in
        ``overlay_dir`` (the key's dir in the overlay, while it is usable) for children written
        there before it filled up; a group with a child anywhere else (an overlay refused since)
        is a miss."""
        path = self.path(key, GROUP_PREFIX + filename)
        if path is None:
            return None
        try:
            with open(path) as f:
                children = json.load(f)["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        mine = tuple(f"{root}/{key}/" for root in self._roots.values())
        if overlay_dir is not None:
            mine += (overlay_dir,)
        if filename not in children or not all(
                isinstance(p, str) and p.startswith(mine) and os.path.exists(p) for p in children.values()):
            return None
        return {filename: children[filename], **children}

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
def activate() -> bool:
    """Serve this process through the layered manager even where TRITON_CACHE_MANAGER is
    not set (the vLLM plugin calls this when $CACHEBAKE_OVERLAY_DIR is).  Another manager
    configured on purpose is left alone (a warning says so).  True if ours is in use."""
    current = knobs.cache.manager_class
    if current is None or current is FileCacheManager:
        knobs.cache.manager_class = LayeredCacheManager
    elif not issubclass(current, LayeredCacheManager):
        warn_once(f"cachebake: {OVERLAY_ENV} is set but Triton's cache manager is "
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
