"""Writes the compile record while a monitored warmup runs.

The compile monitor (cachebake.capture.monitor) calls ``on_compile`` from its compilation
listener and ``install`` when Triton is imported; everything else about the record lives
here.  Each monitored process appends one JSON line per entry to ``record_log_path(events
log)`` with a single ``write`` on an ``O_APPEND`` descriptor (as the monitor does for events),
and ``load_record_log`` merges the lines into one ``CompileRecord`` after the rounds.

Where the options come from: the listener receives the kernel's metadata *after* the compile
stages ran, and a stage may rewrite ``num_warps`` there (warp specialization does,
triton/backends/nvidia/compiler.py ``make_llir``).  The options that went into the key are a
local of ``triton.compile`` itself, the listener's caller, so we read them from that frame;
where that frame is not found we fall back to the metadata.  Either way the entry is checked:
re-deriving the key from the entry as replay will must give the hash Triton computed
(``verified``).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Callable

from cachebake.capture.record import (AutotuneSpec, CompileRecord, CompileSpec, KernelRef,
                                      TuneConfig, encode_value, launch_options)

_local = threading.local()  # .tunes: the compile hashes of each autotune run open on this thread
_log_path: Callable[[], str | None] = lambda: None


def record_log_path(events_log: os.PathLike | str) -> str:
    """Where a bake's record lines go: beside the monitor's events (events.record.jsonl)."""
    p = Path(events_log)
    return str(p.with_name(p.name.removesuffix(".jsonl") + ".record.jsonl"))


def install(log_path: Callable[[], str | None]) -> None:
    """Called by the monitor once Triton is imported: remember where its log is and wrap
    ``Autotuner.run`` so autotune runs are recorded with their candidates and timings."""
    global _log_path
    _log_path = log_path
    from triton.runtime.autotuner import Autotuner

    if getattr(Autotuner.run, "_cachebake_record", False):
        return
    original = Autotuner.run

    def run(self, *args, **kwargs):
        if len(self.configs) <= 1:
            return original(self, *args, **kwargs)
        n_before = len(self.cache)
        tunes = _local.__dict__.setdefault("tunes", [])
        mine: list[str] = []
        tunes.append(mine)
        try:
            return original(self, *args, **kwargs)
        finally:
            tunes.pop()
            new_keys = list(self.cache)[n_before:]
            if new_keys:
                _guarded(on_autotune, self, new_keys[-1], mine)

    run._cachebake_record = True
    Autotuner.run = run


def on_compile(log_path: str | None, src, metadata: dict, cache_hit: bool) -> None:
    """The monitor's listener hook: one entry per ``triton.compile`` of a @triton.jit source."""
    if not log_path or getattr(src, "fn", None) is None:  # IR sources have no Python kernel
        return
    spec = spec_from_compile(src, metadata, cache_hit)
    for run in getattr(_local, "tunes", ()):
        run.append(spec.hash)
    _append(record_log_path(log_path), {"compile": spec.to_dict()})


def spec_from_compile(src, metadata: dict, cache_hit: bool) -> CompileSpec:
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    options, target, env_vars = _compile_locals()
    if target is None:
        t = metadata["target"]
        target = t if isinstance(t, GPUTarget) else GPUTarget(t["backend"], t["arch"], t["warp_size"])
    backend = make_backend(target)
    if options is None:
        fields = type(backend.parse_options({})).__dataclass_fields__
        options = backend.parse_options({k: metadata[k] for k in fields if k in metadata})
    env_vars = dict(get_cache_invalidating_env_vars() if env_vars is None else env_vars)
    default_libs = type(options)().extern_libs if hasattr(options, "extern_libs") else None
    fn = src.fn
    spec = CompileSpec(
        kernel=KernelRef.of(fn),
        signature=[[k, _listify(v)] for k, v in src.signature.items()],
        constexprs=[[list(k), encode_value(v)] for k, v in src.constants.items()],
        attrs=[[list(k), _listify(v)] for k, v in src.attrs.items()],
        options=launch_options(dict(options.__dict__), default_libs),
        env_vars=dict(sorted(env_vars.items())),
        target=f"{target.backend}:{target.arch}",
        hash=str(metadata.get("hash") or ""),
        seen="cache_hit" if cache_hit else "compile",
    )
    try:
        from cachebake.capture.keys import spec_key

        spec.verified = spec_key(spec, target) == spec.hash
    except Exception:  # not replayable as recorded (replay says why); the entry still counts
        spec.verified = False
    return spec


def on_autotune(tuner, tuning_key: tuple, compiles: list[str]) -> None:
    log = _log_path()
    if not log:
        return
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.driver import driver

    from cachebake.capture.keys import autotune_result_hash

    timings = getattr(tuner, "configs_timings", None) or {}
    configs = list(timings) or list(tuner.configs)
    best = tuner.cache.get(tuning_key)
    target = driver.active.get_current_target()
    spec = AutotuneSpec(
        kernel=KernelRef.of(tuner),
        tuning_key=str(tuning_key),
        configs=[TuneConfig(kwargs=[[k, encode_value(v)] for k, v in c.kwargs.items()],
                            num_warps=c.num_warps, num_stages=c.num_stages, num_ctas=c.num_ctas,
                            maxnreg=c.maxnreg, text=str(c)) for c in configs],
        target=f"{target.backend}:{target.arch}",
        env_vars=dict(sorted(get_cache_invalidating_env_vars().items())),
        result_hash="",
        timings=[_timing(timings[c]) for c in configs] if timings else None,
        best=configs.index(best) if best in configs else None,
        compiles=sorted(set(compiles)),
    )
    if not any(c.pre_hook for c in configs):  # Triton never stores results of pre_hook configs
        spec.result_hash = autotune_result_hash(spec, target)
    _append(record_log_path(log), {"autotune": spec.to_dict()})


# A record log holds one line per compile of every monitored process of every round: a vLLM
# bake's is a few MB.  Bounded like every document cachebake reads (cachebake.jsonio).
MAX_RECORD_LOG_BYTES = 256 << 20


def load_record_log(path: os.PathLike | str) -> CompileRecord:
    """Every entry of a record log, merged (one per key and target).  Each line is strict JSON
    (cachebake.jsonio: bounded nesting) checked field by field; a torn line (a writer killed
    mid-line) or a malformed one is skipped."""
    from cachebake.errors import InvalidDocument
    from cachebake.jsonio import parse_json, read_document

    record = CompileRecord()
    try:
        data = read_document(path, "compile record log", MAX_RECORD_LOG_BYTES, missing=None)
    except FileNotFoundError:
        return record
    part = CompileRecord()
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = parse_json(line, "compile record log")
            if not isinstance(obj, dict):
                continue
            if "compile" in obj:
                part.compiles.append(CompileSpec.from_dict(obj["compile"]))
            elif "autotune" in obj:
                part.autotune.append(AutotuneSpec.from_dict(obj["autotune"]))
        except InvalidDocument:
            continue
        for key in ("triton_version", "triton_key"):
            if isinstance(obj.get(key), str) and not getattr(part, key):
                setattr(part, key, obj[key])
    return record.add(part)


def _compile_locals():
    """(options, target, env_vars) of the ``triton.compile`` call this listener runs in."""
    frame = sys._getframe(1)
    for _ in range(12):
        frame = frame.f_back
        if frame is None:
            break
        if frame.f_code.co_name == "compile" and frame.f_globals.get("__name__") == "triton.compiler.compiler":
            loc = frame.f_locals
            return loc.get("options"), loc.get("target"), loc.get("env_vars")
    return None, None, None


def _append(path: str, obj: dict) -> None:
    from cachebake.jsonio import dumps

    obj.update(triton_build())
    # Strict JSON (a failed autotune candidate's inf timing as "inf"): load_record_log reads
    # lines with the strict parser, which refuses Infinity like jq and Go do.
    line = (dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def triton_build() -> dict:
    """Which Triton this process runs: its version and a hash of ``triton_key()`` (the wheel's
    sources and libtriton.so, so the Python tag too)."""
    import hashlib

    import triton
    from triton.runtime.cache import triton_key

    return {"triton_version": triton.__version__,
            "triton_key": hashlib.sha256(triton_key().encode()).hexdigest()}


def _guarded(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as e:  # the record must never break the kernel it watches
        print(f"cachebake record: could not record an autotune run: {e!r}", file=sys.stderr)


def _listify(v):
    if isinstance(v, (tuple, list)):
        return [_listify(x) for x in v]
    return v


def _timing(t):
    return [float(x) for x in t] if isinstance(t, (list, tuple)) else [float(t)]
