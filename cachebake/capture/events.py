"""Compile events: one JSON line each, appended by every monitored process, read back here.

Kinds:
  compile       a real Triton compile (the file cache missed): work a bake moves to build time
  cache_hit     ``triton.compile`` found the kernel in the file cache
  autotune      an ``@triton.autotune`` kernel benchmarked its configs (no stored result)
  helper_build  gcc built one of Triton's C helpers (cuda_utils, __triton_launcher)
A round is stable when it saw none of compile, autotune or helper_build.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from cachebake.errors import CachebakeError
from cachebake.jsonio import parse_json

WORK_KINDS = ("compile", "autotune", "helper_build")  # anything a server would have to redo
KINDS = ("compile", "cache_hit", "autotune", "helper_build")


@dataclass
class Event:
    kind: str
    kernel: str
    key: str = ""  # the cache key directory's name (base32 of the key hash)
    seconds: float = 0.0
    pid: int = 0
    step: str | None = None  # the sweep step that caused it (monitor.step / CACHEBAKE_STEP)
    round: int | None = None  # the build round (CACHEBAKE_ROUND)
    time: float = 0.0  # unix time the event was logged
    signature: dict[str, str] | None = None
    constexprs: dict[str, Any] | None = None
    attrs: list | None = None
    options: dict[str, Any] | None = None
    target: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)  # kind-specific extras

    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items() if v not in (None, {}, [])}
        return json.dumps(d, sort_keys=True, default=str, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "Event":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def label(self) -> str:
        """A short human description: kernel[constexprs] options."""
        parts = [self.kernel]
        if self.constexprs:
            parts.append("[" + ", ".join(f"{k}={v}" for k, v in self.constexprs.items()) + "]")
        if self.options:
            opts = {k: self.options[k] for k in ("num_warps", "num_stages") if k in self.options}
            if opts:
                parts.append(" " + " ".join(f"{k}={v}" for k, v in opts.items()))
        if self.kind == "autotune" and "tuning_key" in self.detail:
            parts.append(f" key={self.detail['tuning_key']}")
        return "".join(parts)


def read_events(path: os.PathLike | str) -> list[Event]:
    """Every complete event in a log.  A missing log is an empty one (nothing was monitored);
    a torn last line (a writer killed mid-write) is skipped."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return list(_parse_lines(data.split(b"\n")))


def _parse_lines(lines: Iterable[bytes]) -> Iterable[Event]:
    for line in lines:
        if not line.strip():
            continue
        try:
            yield Event.from_dict(parse_json(line, "event", allow_non_finite=True))
        except (CachebakeError, ValueError, TypeError):
            continue


class EventTail:
    """Reads the events appended to a log since the last call (for live progress)."""

    def __init__(self, path: os.PathLike | str):
        self.path = path
        self.offset = 0

    def new_events(self) -> list[Event]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        return list(_parse_lines(data[:end].split(b"\n")))


@dataclass
class EventSummary:
    compiles: int = 0
    cache_hits: int = 0
    autotunes: int = 0
    helper_builds: int = 0
    compile_seconds: float = 0.0
    autotune_seconds: float = 0.0
    helper_seconds: float = 0.0
    kernels: list[str] = field(default_factory=list)  # distinct kernels compiled or autotuned
    processes: int = 0

    @classmethod
    def of(cls, events: Iterable[Event]) -> "EventSummary":
        s = cls()
        names: Counter[str] = Counter()
        pids = set()
        for e in events:
            pids.add(e.pid)
            if e.kind == "compile":
                s.compiles += 1
                s.compile_seconds += e.seconds
                names[e.kernel] += 1
            elif e.kind == "cache_hit":
                s.cache_hits += 1
            elif e.kind == "autotune":
                s.autotunes += 1
                s.autotune_seconds += e.seconds
                names[e.kernel] += 1
            elif e.kind == "helper_build":
                s.helper_builds += 1
                s.helper_seconds += e.seconds
        s.kernels = sorted(names)
        s.processes = len(pids)
        s.compile_seconds = round(s.compile_seconds, 3)
        s.autotune_seconds = round(s.autotune_seconds, 3)
        s.helper_seconds = round(s.helper_seconds, 3)
        return s

    @property
    def work(self) -> int:
        """Compiles + autotune benchmarks + helper builds: what a server would redo."""
        return self.compiles + self.autotunes + self.helper_builds

    @property
    def seen(self) -> int:
        """Every event: zero means the monitor never saw Triton (not a proof of anything)."""
        return self.work + self.cache_hits

    @property
    def stable(self) -> bool:
        return self.work == 0

    def to_dict(self) -> dict:
        return asdict(self)
