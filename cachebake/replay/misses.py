"""``cachebake misses LOG|DIR...``: merge the miss logs of many replicas.

Each log is the ``misses.jsonl`` of one pod's overlay (collected with ``kubectl cp`` or a
sidecar, see README); a directory is searched for ``*.jsonl`` files.  Lines are grouped by
what missed: kind, kernel and cache key (one key is one specialization: signature,
constexprs, attrs, options, target).  A group says how often it missed, on which replicas,
when first and last, and how much compile time it cost.  A torn last line (a pod killed
mid-write) or a line that is not a miss line is counted, never fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from cachebake.errors import BadInput, from_os_error
from cachebake.serve.misslog import FORMAT


@dataclass
class MissGroup:
    kind: str  # kernel | autotune | helper
    kernel: str
    key: str
    specialization: str  # a short human summary of what differs between groups of one kernel
    count: int = 0
    first_seen: str = ""
    last_seen: str = ""
    seconds: float = 0.0  # compile / benchmark / build time, summed over every miss
    replicas: list[str] = field(default_factory=list)  # pod names (host where no pod was set)
    entry: dict = field(default_factory=dict)  # the first line seen: record, tuning key...

    def to_dict(self) -> dict:
        d = {k: v for k, v in vars(self).items() if k != "entry"}
        d["seconds"] = round(self.seconds, 4)
        d["record"] = self.entry.get("record")
        for k in ("tuning_key", "configs", "timings", "file"):
            if k in self.entry:
                d[k] = self.entry[k]
        return d


@dataclass
class MissReport:
    logs: list[str]
    lines: int = 0
    unreadable: int = 0  # torn or non-JSON lines
    foreign: int = 0  # JSON lines that are not miss lines
    groups: list[MissGroup] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def replicas(self) -> list[str]:
        return sorted({r for g in self.groups for r in g.replicas})

    def to_dict(self) -> dict:
        return {"logs": self.logs, "lines": self.lines, "unreadable_lines": self.unreadable,
                "foreign_lines": self.foreign, "misses": self.misses, "replicas": self.replicas,
                "groups": [g.to_dict() for g in self.groups]}

    def render(self, console) -> None:
        """One entry per group, two lines each: fits any terminal width."""
        console.print(f"{self.misses} misses of {len(self.groups)} kernels/specializations from "
                      f"{len(self.replicas)} replicas in {len(self.logs)} logs"
                      + (f"; {self.unreadable} unreadable lines skipped" if self.unreadable else ""),
                      highlight=False)
        for g in self.groups:
            kind = "" if g.kind == "kernel" else f" ({g.kind})"
            console.print(f"{g.count:>5}x  [bold]{g.kernel}[/]{kind}  on {len(g.replicas)} "
                          f"replica{'s' * (len(g.replicas) != 1)}, {_short_time(g.first_seen)} .. "
                          f"{_short_time(g.last_seen)} UTC, {g.seconds:.2f} s", highlight=False)
            console.print(f"        {g.specialization}", highlight=False, markup=False)


def _short_time(iso: str) -> str:
    """``2026-11-30T20:02:12.920Z`` -> ``11-30 20:02:12`` for the table (JSON keeps it all)."""
    return iso[5:19].replace("T", " ") if len(iso) >= 19 else iso


def log_files(paths: list[str]) -> list[Path]:
    """The log files named or found under the directories named; BadInput if none."""
    if not paths:
        raise BadInput("no miss log given (pass LOG files or directories holding them)")
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.rglob("*.jsonl") if f.is_file())
        elif p.is_file():
            found.append(p)
        else:
            raise BadInput(f"{p}: no such miss log or directory")
    if not found:
        raise BadInput(f"no *.jsonl miss logs under {', '.join(paths)}")
    return found


def read_lines(path: Path, report: MissReport) -> Iterator[dict]:
    try:
        f = open(path, "rb")
    except OSError as e:
        raise from_os_error(e, path) from None
    with f:
        for raw in f:
            if not raw.strip():
                continue
            report.lines += 1
            try:
                entry = json.loads(raw)
            except ValueError:
                report.unreadable += 1
                continue
            if not isinstance(entry, dict) or entry.get("cachebake_miss") != FORMAT:
                report.foreign += 1
                continue
            yield entry


def specialization(entry: dict) -> str:
    """``*fp16,*fp16,i32 BLOCK=512 num_warps=8`` for a kernel; the tuning key for an
    autotune result; the file for a helper."""
    kind = entry.get("kind")
    if kind == "autotune":
        return f"tuning key {entry.get('tuning_key')}, {len(entry.get('configs') or [])} configs"
    if kind == "helper":
        return str(entry.get("file", ""))
    rec = entry.get("record") or {}
    if not rec:
        return "(no record)"
    sig = rec.get("signature") or []
    names = [name for name, _ in sig]
    types = ",".join(str(ty) for _, ty in sig if ty != "constexpr")
    consts = []
    for path, v in rec.get("constexprs") or []:
        name = names[path[0]] if len(path) == 1 and path[0] < len(names) else str(path)
        consts.append(f"{name}={_value(v)}")
    options = rec.get("options") or {}
    opts = [f"{k}={options[k]}" for k in ("num_warps", "num_stages") if k in options]
    divisible = sum(1 for _, v in rec.get("attrs") or [] if v)
    parts = [types] + consts + opts + ([f"{divisible} args %16"] if divisible else [])
    return " ".join(p for p in parts if p)


def _value(v) -> str:
    if isinstance(v, dict) and len(v) == 1:
        kind, inner = next(iter(v.items()))
        return f"{inner}" if kind in ("dtype", "constexpr") else f"{kind}:{inner}"
    return str(v)


def merge(paths: list[str]) -> MissReport:
    files = log_files(paths)
    report = MissReport(logs=[str(f) for f in files])
    groups: dict[tuple[str, str, str], MissGroup] = {}
    for path in files:
        for e in read_lines(path, report):
            ident = (str(e.get("kind", "?")), str(e.get("kernel", "?")), str(e.get("key", "")))
            g = groups.get(ident)
            if g is None:
                g = groups[ident] = MissGroup(*ident, specialization=specialization(e), entry=e)
            elif not g.entry.get("record") and e.get("record"):
                g.entry, g.specialization = e, specialization(e)  # a line that has the record
            g.count += 1
            t = str(e.get("time", ""))
            g.first_seen = min(g.first_seen, t) if g.first_seen else t
            g.last_seen = max(g.last_seen, t)
            g.seconds += float(e.get("seconds") or 0.0)
            replica = e.get("pod") or e.get("host") or "?"
            if replica not in g.replicas:
                g.replicas.append(replica)
    report.groups = sorted(groups.values(), key=lambda g: (-g.count, g.kind, g.kernel, g.key))
    for g in report.groups:
        g.replicas.sort()
    return report


def misses_of(report: MissReport, kind: str) -> list[MissGroup]:
    return [g for g in report.groups if g.kind == kind]
