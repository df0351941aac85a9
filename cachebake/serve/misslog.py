"""The miss log: one JSON line per cache miss, from every process of every replica.

A line (``"cachebake_miss": 1``) holds what missed (``kind``: ``kernel``, ``autotune`` or
``helper``; ``kernel``; ``key``, the cache key dir), what it cost (``seconds``: the compile,
the benchmark, the gcc build), where the result went (``stored``: ``overlay`` or ``spill``),
why an entry that was there could not be used (``reason``, only then: e.g. ``bake:
add_kernel.json metadata unreadable (not valid JSON: ...)``), who saw it (``host``, ``pod``/``namespace``/``node`` from the downward API, ``pid``) and when
(``time``, UTC), plus what ``cachebake replay --misses`` needs to compile it again: a kernel's
``record`` (a ``cachebake.capture.record.CompileSpec`` dict, made by the replay recorder's own
``spec_from_compile``: the entry a bake's compile record holds), an autotune result's
``tuning_key``, ``configs`` and ``timings``.

The ``vllm`` role's misses (``kind: vllm``, ``role: vllm``; cachebake.serve.vllm_misses) are
torch.compile dirs the server wrote that the bake lacked, logged at the API server's exit: the
dir names only (``backend_dir``: ``torch_compile_cache/<10 hex>/rank_<i>_<j>/<prefix>``, or
``aot``: ``torch_compile_cache/torch_aot_compile/<64 hex>``, relative to the cache root; ``kernel``
the rank/prefix or ``torch_aot_compile``, ``key`` the hash), ``files`` and ``bytes``, and the
server's ``serve_args`` and ``model`` as its ``vllm serve`` command line gave them; never a
file's bytes.

Lines go to ``$CACHEBAKE_MISS_LOG`` (``<overlay>/misses.jsonl`` by default) with one ``write``
on an ``O_APPEND`` descriptor, so processes sharing the file never interleave within a line.
The file is opened O_NOFOLLOW|O_NONBLOCK, inside the overlay through the overlay's own checks
(cachebake.serve.overlay), and used only if it is a regular file of this process's uid with one
link: a symlinked or hard-linked log would append the server's lines to someone else's file.
If it is refused or cannot be written, the line goes to stderr (``cachebake: miss: {...}``),
where the pod's log keeps it; logging never raises into the server.

Kernel misses are seen twice: the cache manager knows a kernel missed (its ``put_group``), the
compilation listener knows the source (``src``) that missed, right after.  The manager notes a
pending miss; the listener completes it with the record and writes it.  If the listener never
comes (a program replaced it, or a compile started before this module was imported), the
pending line is written without a record at the next miss on that thread or at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from cachebake import jsonio
from cachebake.roles import MISS_LOG_ENV, MISS_LOG_NAME, OVERLAY_ENV
from cachebake.serve import POD_ENV
from cachebake.serve import overlay as overlay_mod

FORMAT = 1
HELPER_SUFFIXES = (".so",)  # Triton names its helpers <name><EXT_SUFFIX>, .so on Linux
_AUTOTUNE_SUFFIX = ".autotune.json"
NO_LISTENER = ("the compilation listener did not run for this compile (it started before "
               "cachebake.serve was imported, or the program replaced the listener)")


def log_path() -> str | None:
    """Where this process logs misses (None: stderr only)."""
    path = os.environ.get(MISS_LOG_ENV)
    if path:
        return path
    overlay = os.environ.get(OVERLAY_ENV)
    return os.path.join(overlay, MISS_LOG_NAME) if overlay else None


def _inside(path: str, directory: str) -> str | None:
    """``path`` relative to ``directory`` if it lies inside it (lexically), else None."""
    path, directory = os.path.normpath(path), os.path.normpath(directory)
    return path[len(directory) + 1:] if path.startswith(directory.rstrip("/") + "/") else None


def open_log(path: str) -> int:
    """An O_APPEND fd of the miss log.  Inside the overlay it is opened through the overlay's
    own checks (cachebake.serve.overlay: the overlay private, every dir on the way ours, no
    link followed); elsewhere its directory is made if absent and the file itself is opened
    without following a link or blocking.  Either way the file must be a regular file of ours
    with one link.  Raises Refused, or OSError."""
    ovl = overlay_mod.current()
    rel = _inside(path, ovl.path) if ovl is not None else None
    if rel is not None:
        return ovl.open_append(rel)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        fd = os.open(path, overlay_mod.APPEND_FLAGS, overlay_mod.FILE_MODE)
    except OSError as e:
        if e.errno in (6, 20, 40):  # a FIFO, not a directory, a symbolic link
            raise overlay_mod.Refused(f"it {overlay_mod.open_error(e)}") from None
        raise
    st = os.fstat(fd)
    why = overlay_mod.file_problem(st, os.geteuid(), 1 << 62) or (
        f"has {st.st_nlink} hard links" if st.st_nlink != 1 else None)
    if why is not None:
        os.close(fd)
        raise overlay_mod.Refused(f"it {why}")
    os.set_blocking(fd, True)
    return fd


class _Writer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fd: int | None = None
        self.opened: tuple[str, int] | None = None  # (path, pid) the fd belongs to
        self.failed: set[str] = set()

    def write(self, entry: dict) -> None:
        # strict JSON (a failed autotune candidate is timed inf: written "inf"), as every
        # reader of these lines parses them (cachebake.jsonio)
        line = (jsonio.dumps(entry, separators=(",", ":"), default=str) + "\n").encode()
        path = log_path()
        with self.lock:
            if path and path not in self.failed:
                try:
                    self._write(path, line)
                    return
                except overlay_mod.OverlayRefused:  # the overlay's own line has said why
                    self.failed.add(path)
                except overlay_mod.Refused as e:
                    self.failed.add(path)
                    sys.stderr.write(f"cachebake: the miss log {path} is refused: {e}; "
                                     "misses go to stderr\n")
                except OSError as e:
                    self.failed.add(path)
                    sys.stderr.write(f"cachebake: the miss log {path} cannot be written "
                                     f"({e.strerror or e}); misses go to stderr\n")
            sys.stderr.write("cachebake: miss: " + line.decode())
            sys.stderr.flush()

    def _write(self, path: str, line: bytes) -> None:
        if self.opened != (path, os.getpid()):
            # After a fork the child opens its own descriptor (same file, same O_APPEND).
            if self.fd is not None and self.opened and self.opened[1] == os.getpid():
                os.close(self.fd)
            self.fd = None
            self.fd = open_log(path)
            self.opened = (path, os.getpid())
        written = os.write(self.fd, line)  # one write: O_APPEND puts the whole line at the end
        if written != len(line):
            raise OSError(28, f"short write ({written} of {len(line)} bytes)")


_writer = _Writer()


def _identity() -> dict[str, Any]:
    ident: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    for var, field in POD_ENV.items():
        if os.environ.get(var):
            ident[field] = os.environ[var]
    return ident


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def make_entry(kind: str, kernel: str, key: str, seconds: float | None, stored: str, **extra) -> dict:
    return {"cachebake_miss": FORMAT, "kind": kind, "kernel": kernel, "key": key,
            "seconds": seconds, "stored": stored, "time": _now(), **_identity(), **extra}


def write(entry: dict) -> None:
    """Append one line; never raises."""
    try:
        _writer.write(entry)
    except Exception as e:  # logging must never break the server
        print(f"cachebake: could not log a miss: {e!r}", file=sys.stderr)


# -- what the cache manager notes --------------------------------------------------------------

_pending_lock = threading.Lock()
_pending: dict[str, tuple[int, dict]] = {}  # key -> (thread id, entry waiting for its record)


def note_file_miss(key: str, filename: str, data: bytes, seconds: float | None, stored: str,
                   reason: str | None = None) -> None:
    """An autotune result or a launcher helper was missing (or unusable: ``reason``) and has
    just been produced."""
    why = {"reason": reason} if reason else {}
    if filename.endswith(_AUTOTUNE_SUFFIX):
        extra: dict[str, Any] = {}
        try:
            result = json.loads(data)
            extra = {"tuning_key": result.get("key"), "timings": result.get("configs_timings")}
            extra["configs"] = [c for c, _ in extra["timings"] or []]
        except (ValueError, TypeError, AttributeError):
            extra = {"unreadable": True}
        write(make_entry("autotune", filename[: -len(_AUTOTUNE_SUFFIX)], key, seconds, stored, **extra, **why))
    else:
        name = filename.split(".", 1)[0]
        write(make_entry("helper", name, key, seconds, stored, file=filename, **why))


def note_kernel_miss(key: str, metadata_filename: str, seconds: float | None, stored: str,
                     reason: str | None = None) -> None:
    """A kernel missed every layer and was compiled (its group was just stored); ``reason``:
    why an entry found for it was not used.  The listener, called next by
    ``triton.compile``, adds the record and writes the line."""
    kernel = metadata_filename[:-5] if metadata_filename.endswith(".json") else metadata_filename
    me = threading.get_ident()
    with _pending_lock:
        stale = [k for k, (tid, _) in _pending.items() if tid == me]
        lines = [_pending.pop(k)[1] for k in stale]
        why = {"reason": reason} if reason else {}
        _pending[key] = (me, make_entry("kernel", kernel, key, seconds, stored, record=None,
                                        record_error=NO_LISTENER, **why))
    for line in lines:  # the listener did not come for these: log what we know
        write(line)


def flush_pending() -> None:
    with _pending_lock:
        lines = [entry for _, entry in _pending.values()]
        _pending.clear()
    for line in lines:
        write(line)


atexit.register(flush_pending)


# -- the compilation listener ------------------------------------------------------------------

def _base32(hex_key: str) -> str:
    from triton.runtime.cache import _base32 as triton_base32  # the key dir name Triton uses

    return triton_base32(hex_key)


def _on_compile(src, metadata, times) -> None:
    key = _base32(metadata["hash"])
    with _pending_lock:
        pending = _pending.pop(key, None)
    if pending is None:  # not a miss of the layered cache (another manager, a dump...)
        return
    entry = pending[1]
    entry.pop("record_error", None)
    if times is not None and getattr(times, "total", None) is not None:
        entry["seconds"] = round(times.total / 1e6, 4)
    try:
        from cachebake.capture.recorder import spec_from_compile

        entry["record"] = spec_from_compile(src, metadata, cache_hit=False).to_dict()
    except Exception as e:  # log the miss without its record rather than not at all
        entry["record_error"] = f"{type(e).__name__}: {e}"
    write(entry)


def install_listener() -> None:
    """Chain a listener in front of whatever ``knobs.compilation.listener`` holds; once per
    process.  The monitor (cachebake.capture.monitor) chains the same way, in either order."""
    from triton import knobs

    previous = knobs.compilation.listener
    chain, seen = previous, set()
    while chain is not None and id(chain) not in seen:  # already installed somewhere in the chain
        if getattr(chain, "_cachebake_misses", False):
            return
        seen.add(id(chain))
        chain = getattr(chain, "_cachebake_previous", None)

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        if not cache_hit:
            try:
                _on_compile(src, metadata, times)
            except Exception as e:  # never break the compile that is being reported
                print(f"cachebake: could not log a miss: {e!r}", file=sys.stderr)
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)

    listener._cachebake_misses = True
    listener._cachebake_previous = previous
    knobs.compilation.listener = listener
