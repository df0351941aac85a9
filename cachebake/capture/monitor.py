"""The compile monitor: what Triton really compiled, benchmarked and built, in every process.

Three taps, because no single Triton hook sees everything (FACTS.md, "Observing compiles"):
- ``knobs.compilation.listener``: called once per ``triton.compile``; ``cache_hit=False`` is a
  real compile.  It carries the source (signature, constexprs, attrs), options and timings.
- a ``FileCacheManager`` subclass installed as ``knobs.cache.manager_class``: sees every
  ``put()``, so it sees the gcc helper builds (``.so``) and where autotune results land.
- a wrapper around ``Autotuner.run``: benchmarking happens inside it, with or without
  ``TRITON_CACHE_AUTOTUNING``; ``bench_time`` is set only when configs were benchmarked.

Activation is by environment so it reaches vLLM's engine and worker processes:
``CACHEBAKE_MONITOR_LOG=/path/events.jsonl`` plus one of ``import cachebake.capture.activate``,
the ``autoload/sitecustomize.py`` on PYTHONPATH (``capture.env`` puts it there), or the vLLM
plugin.  Every process appends one JSON line per event with a single ``write`` on an
``O_APPEND`` descriptor, so many writers never interleave within a line.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from typing import Any, Iterator

from cachebake.capture.env import MONITOR_LOG_ENV, ROUND_ENV, STEP_ENV
from cachebake.capture.events import Event, EventSummary, read_events  # noqa: F401 (re-export)

# Options worth recording (all in the kernel key); the rest of the metadata is noise here.
_OPTION_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                "launch_cooperative_grid", "debug", "arch", "ptx_version")


class _State:
    def __init__(self) -> None:
        self.log_path: str | None = None
        self.fd: int | None = None
        self.fd_pid: int | None = None
        self.round: int | None = None
        self.installed = False
        self.lock = threading.Lock()
        self.local = threading.local()  # last autotune put on this thread: (key dir, file)


_state = _State()


def is_active() -> bool:
    """Whether this process is monitored (the taps go in when Triton is imported)."""
    return _state.installed


def activate(log_path: os.PathLike | str | None = None) -> bool:
    """Start monitoring this process, logging to ``log_path`` (default: $CACHEBAKE_MONITOR_LOG).
    Returns False, doing nothing, when there is no log to write.  Idempotent."""
    path = os.fspath(log_path) if log_path is not None else os.environ.get(MONITOR_LOG_ENV)
    if not path:
        return False
    with _state.lock:
        if _state.fd is not None and _state.log_path != os.path.abspath(path):
            if _state.fd_pid == os.getpid():
                os.close(_state.fd)
            _state.fd = None
        _state.log_path = os.path.abspath(path)
        rnd = os.environ.get(ROUND_ENV)
        _state.round = int(rnd) if rnd and rnd.isdigit() else None
        if _state.installed:
            return True
        _state.installed = True
    if "triton" in sys.modules:
        _install_hooks()
    else:
        # Most processes of a bake never touch Triton (shells, pip, tokenizers): arm a one-shot
        # import hook instead of importing Triton into every one of them.
        sys.meta_path.insert(0, _TritonImportHook())
    return True


class _TritonImportHook:
    """Installs the taps right after ``import triton`` finishes, then removes itself.

    It stays in place until triton is really executed: ``importlib.util.find_spec("triton")``
    alone (torch probes for Triton that way before importing it, e.g. in Inductor's compile
    workers) must not use it up."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "triton":
            return None
        import importlib.util

        at = sys.meta_path.index(self) if self in sys.meta_path else None
        if at is not None:
            sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec("triton")  # the finders after us, as if we were absent
        finally:
            if at is not None and "triton" not in sys.modules:
                sys.meta_path.insert(at, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        hook = self

        def exec_then_install(module):
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
            exec_module(module)
            _install_hooks()

        spec.loader.exec_module = exec_then_install  # this loader instance serves triton only
        return spec


def deactivate() -> None:
    """Stop logging (the hooks stay installed but record nothing)."""
    with _state.lock:
        _state.log_path = None
        if _state.fd is not None and _state.fd_pid == os.getpid():
            os.close(_state.fd)
        _state.fd = None


@contextlib.contextmanager
def step(label: str) -> Iterator[None]:
    """Label the events inside (and in children started inside) with a sweep step."""
    prev = os.environ.get(STEP_ENV)
    os.environ[STEP_ENV] = label
    try:
        yield
    finally:
        if prev is None:
            os.environ.pop(STEP_ENV, None)
        else:
            os.environ[STEP_ENV] = prev


def emit(event: Event) -> None:
    """Append one event as one line; one ``write`` on an O_APPEND fd keeps lines whole."""
    if _state.log_path is None:
        return
    event.pid = os.getpid()
    # The step lives in the environment only, so a driver may also set CACHEBAKE_STEP itself
    # and child processes started inside a step inherit it.
    event.step = event.step if event.step is not None else (os.environ.get(STEP_ENV) or None)
    event.round = event.round if event.round is not None else _state.round
    event.time = round(time.time(), 3)
    line = (event.to_json() + "\n").encode()
    with _state.lock:
        if _state.fd is None or _state.fd_pid != os.getpid():  # reopen after fork: own fd
            _state.fd = os.open(_state.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            _state.fd_pid = os.getpid()
        os.write(_state.fd, line)


# -- the three taps ----------------------------------------------------------------------------

def _install_hooks() -> None:
    """Install the three taps; one that this Triton does not support is reported, not fatal
    (the others still count)."""
    for name, install in (("listener", _install_listener), ("cache manager", _install_manager),
                          ("autotuner", _wrap_autotuner), ("compile record", _install_record)):
        try:
            install()
        except Exception as e:
            print(f"cachebake monitor: the {name} tap is off in pid {os.getpid()}: {e!r}",
                  file=sys.stderr)


# Where a program's own listener goes when it assigns ``knobs.compilation.listener``: kept in
# the knobs instance's __dict__, so Triton's ``scope()``/``copy()`` save and restore it.
_CHAINED = "_cachebake_chained_listener"


def _install_listener() -> None:
    """Our listener, which no assignment replaces.  Programs watch compiles by assigning
    ``triton.knobs.compilation.listener`` themselves; a plain attribute would let them
    silently switch the monitor off.  So the knobs object's class gets a ``listener``
    property: reading it gives ours (that is what Triton's compiler calls), assigning it
    stores the program's listener, which ours then calls after recording the event."""
    from triton import knobs

    from cachebake.capture.recorder import on_compile as record_compile

    comp = knobs.compilation
    if getattr(type(comp), "_cachebake", False):
        return
    previous = comp.listener
    local = threading.local()

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        if getattr(local, "busy", False):
            return  # a chained listener that calls "the previous one" (us) back: once is enough
        local.busy = True
        try:
            try:
                emit(_compile_event(src, metadata, metadata_group, times, cache_hit))
                record_compile(_state.log_path, src, metadata, cache_hit)  # replay's compile record
            except Exception as e:  # the monitor must never break the program it watches
                print(f"cachebake monitor: could not record a compile: {e!r}", file=sys.stderr)
            chained = knobs.compilation.__dict__.get(_CHAINED)
            if chained is not None:
                chained(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                        cache_hit=cache_hit)
        finally:
            local.busy = False

    listener._cachebake = True

    class ChainingListener:
        """Data descriptor: survives ``knobs.compilation.listener = theirs``."""

        def __get__(self, obj, objtype=None):
            return self if obj is None else listener

        def __set__(self, obj, value):
            if value is None or getattr(value, "_cachebake", False):
                obj.__dict__.pop(_CHAINED, None)
            else:
                obj.__dict__[_CHAINED] = value

        def __delete__(self, obj):
            obj.__dict__.pop(_CHAINED, None)

    base = type(comp)
    # Triton lists a knobs class's env knobs from type(self).__dict__ (base_knobs.
    # knob_descriptors), so the subclass carries the base's attributes, not just inherits them.
    namespace = {k: v for k, v in vars(base).items() if k not in ("__dict__", "__weakref__")}
    namespace.update(listener=ChainingListener(), _cachebake=True)
    comp.__dict__.pop("listener", None)
    comp.__class__ = type(f"Monitored{base.__name__}", (base,), namespace)
    if previous is not None and not getattr(previous, "_cachebake", False):
        comp.__dict__[_CHAINED] = previous


def _install_record() -> None:
    """The compile record (cachebake.capture.recorder) and, when a cross-target bake asked for
    it, Triton compiling for that target (cachebake.capture.cross)."""
    from cachebake.capture import cross, recorder

    recorder.install(lambda: _state.log_path)
    cross.activate_from_env()


def _install_manager() -> None:
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    # Wrap whichever manager is configured (TRITON_CACHE_MANAGER, e.g. a layered runtime one)
    # rather than replace it: the monitor must not change where the cache lives.
    base = knobs.cache.manager_class or FileCacheManager
    if not getattr(base, "_cachebake", False):
        knobs.cache.manager_class = _monitored_manager(base)


def _compile_event(src, metadata, metadata_group, times, cache_hit) -> Event:
    fn = getattr(src, "fn", None)
    arg_names = list(getattr(fn, "arg_names", []) or [])
    signature = getattr(src, "signature", None)
    constexprs = None
    if getattr(src, "constants", None):
        constexprs = {}
        for k, v in src.constants.items():
            name = arg_names[k[0]] if len(k) == 1 and k[0] < len(arg_names) else str(k)
            if isinstance(v, float) and not math.isfinite(v):
                v = repr(v)  # "inf" (vLLM's dt_max): events end up in the manifest, strict JSON
            constexprs[name] = v if isinstance(v, (int, float, bool, str, type(None))) else str(v)
    attrs = None
    if getattr(src, "attrs", None):
        attrs = [[list(k), [list(a) for a in v]] for k, v in src.attrs.items()]
    key = ""
    for p in metadata_group.values():
        key = os.path.basename(os.path.dirname(p))
        break
    target = metadata.get("target")
    if target is not None and not isinstance(target, str):
        target = (f"{target.backend}:{target.arch}" if hasattr(target, "arch")
                  else f"{target['backend']}:{target['arch']}" if isinstance(target, dict)
                  else str(target))
    options = {k: metadata[k] for k in _OPTION_KEYS if k in metadata}
    return Event(
        kind="cache_hit" if cache_hit else "compile",
        kernel=metadata.get("name") or getattr(src, "name", "?"),
        key=key,
        seconds=round(times.total / 1e6, 4) if times is not None else 0.0,
        signature=dict(signature) if isinstance(signature, dict) else None,
        constexprs=constexprs,
        attrs=attrs,
        options=options,
        target=target,
    )


def _monitored_manager(base):
    """A subclass of ``base`` (a CacheManager) whose ``put`` reports helper builds and notes
    where autotune results go.  Built lazily: subclassing needs triton, which importing this
    module must not (the vLLM plugin imports it in every process)."""
    import sysconfig

    so_suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"

    class MonitoredCacheManager(base):
        _cachebake = True

        def __init__(self, key, override=False, dump=False):
            super().__init__(key, override=override, dump=dump)
            self._watched = not (override or dump)
            self._created = time.monotonic()  # helper builds start right after this

        def put(self, data, filename, binary=True) -> str:
            path = super().put(data, filename, binary=binary)
            if self._watched:
                try:
                    self._note_put(filename)
                except Exception as e:  # never fail the write itself
                    print(f"cachebake monitor: could not record a put: {e!r}", file=sys.stderr)
            return path

        def _note_put(self, filename: str) -> None:
            key = getattr(self, "key", "")
            if filename.endswith(".autotune.json"):
                _state.local.autotune_put = (key, filename)
            elif filename.endswith(so_suffix) or filename.endswith(".so"):
                name = filename[: -len(so_suffix)] if filename.endswith(so_suffix) else filename
                emit(Event(kind="helper_build", kernel=name, key=key,
                           seconds=round(time.monotonic() - self._created, 4),
                           detail={"file": filename}))

    MonitoredCacheManager.__name__ = f"Monitored{base.__name__}"
    return MonitoredCacheManager


def _wrap_autotuner() -> None:
    from triton.runtime.autotuner import Autotuner

    if getattr(Autotuner.run, "_cachebake", False):
        return
    original = Autotuner.run
    marker = object()

    def run(self, *args, **kwargs):
        if len(self.configs) <= 1:  # nothing to tune: no benchmark can happen
            return original(self, *args, **kwargs)
        n_before = len(self.cache)
        prev = self.__dict__.get("bench_time", marker)
        self.bench_time = marker
        _state.local.autotune_put = None
        try:
            return original(self, *args, **kwargs)
        finally:
            bench = self.__dict__.get("bench_time", marker)
            if bench is marker:  # no benchmark ran (memory or disk hit): leave it as it was
                if prev is marker:
                    self.__dict__.pop("bench_time", None)
                else:
                    self.bench_time = prev
            else:
                _emit_autotune(self, list(self.cache)[n_before:], bench)

    run._cachebake = True
    Autotuner.run = run


def _emit_autotune(tuner, new_keys: list, seconds: float) -> None:
    try:
        from triton.runtime.jit import JITFunction

        fn = getattr(tuner, "base_fn", None) or tuner.fn
        while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):
            fn = fn.fn
        name = getattr(fn, "__name__", "?")
        put = getattr(_state.local, "autotune_put", None)
        timings = getattr(tuner, "configs_timings", None) or {}
        detail: dict[str, Any] = {
            "tuning_key": [str(k) for k in (new_keys[-1] if new_keys else ())],
            "configs": len(timings),
            "stored": put is not None,
        }
        if new_keys and new_keys[-1] in tuner.cache:
            detail["best"] = str(tuner.cache[new_keys[-1]])
        emit(Event(kind="autotune", kernel=name, key=put[0] if put else "",
                   seconds=round(float(seconds), 4), detail=detail))
    except Exception as e:  # never break the tuned kernel's launch
        print(f"cachebake monitor: could not record an autotune: {e!r}", file=sys.stderr)


def summary(path: os.PathLike | str) -> EventSummary:
    return EventSummary.of(read_events(path))
