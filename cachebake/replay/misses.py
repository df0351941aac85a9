"""``cachebake misses LOG|DIR...``: merge the miss logs of many replicas.

Each log is the ``misses.jsonl`` of one pod's overlay (collected with ``kubectl cp`` or a
sidecar, see README); a directory is searched for ``*.jsonl`` files (regular files only: a
link, FIFO or device found there is skipped and listed, never opened).  Lines are grouped by
what missed: kind, kernel and cache key (one key is one specialization: signature, constexprs,
attrs, options, target).  A group says how often it missed, on which replicas, when first and
last, and how much compile time it cost.

A log is written by a serving pod, which may be compromised, so no line is trusted: each is
read with a bound on its length, parsed by cachebake.jsonio's strict parser (nesting bounded:
no RecursionError) and checked field by field.  A torn line (a pod killed mid-write), one that
is not JSON or is too long or too deep is *unreadable*; JSON that is not a miss line of this
format is *foreign*; a miss line whose fields have the wrong type (a string ``seconds``, a
``record`` that is not an object, a list ``key``...) is *malformed*.  All three are counted and
reported, never fatal.  Names (keys, kernels, files) are kept as text here; fold-back checks
them before it uses one (cachebake.replay.foldback).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from cachebake.capture.record import CompileSpec
from cachebake.errors import BadInput, InvalidDocument, from_os_error, shorten
from cachebake.fsops import write_all
from cachebake.jsonio import open_regular, parse_json
from cachebake.serve.misslog import FORMAT

MISS_KINDS = ("kernel", "autotune", "helper", "vllm")
VLLM_UNITS = ("backend", "aot")
MAX_SERVE_ARGS = 64  # flags in a vllm line's serve_args (a recipe has 6)
MAX_LINE_BYTES = 1 << 20  # a line with its record and an autotune's timings is a few kB
MAX_FIELD = 1024  # characters of a name, key, time or replica field
LINE_DOCUMENT = "miss line"
MAX_LOG_DEPTH = 16  # directories below a LOG|DIR argument (kubectl cp: DIR/<pod>/misses.jsonl)


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
        for k in ("tuning_key", "configs", "timings", "file", "role", "unit", "backend_dir", "aot",
                  "files", "bytes", "serve_args", "model"):
            if k in self.entry:
                d[k] = self.entry[k]
        return d


@dataclass
class MissReport:
    logs: list[str]
    lines: int = 0
    unreadable: int = 0  # torn, non-JSON, too long or too deep
    foreign: int = 0  # JSON lines that are not miss lines of this format
    malformed: int = 0  # miss lines whose fields have the wrong type
    skipped: list[str] = field(default_factory=list)  # files under a directory that are not regular
    groups: list[MissGroup] = field(default_factory=list)
    recorded: dict | None = None  # misses --vllm-cache: what the scan added (VllmRecordReport)

    @property
    def misses(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def replicas(self) -> list[str]:
        return sorted({r for g in self.groups for r in g.replicas})

    def to_dict(self) -> dict:
        return {"logs": self.logs, "lines": self.lines, "unreadable_lines": self.unreadable,
                "foreign_lines": self.foreign, "malformed_lines": self.malformed,
                "skipped_files": self.skipped, "misses": self.misses, "replicas": self.replicas,
                "groups": [g.to_dict() for g in self.groups],
                **({"vllm_cache": self.recorded} if self.recorded is not None else {})}


def log_files(paths: list[str], skipped: list[str] | None = None) -> list[Path]:
    """The log files named or found under the directories named; BadInput if none.  A file
    named on the command line is the user's choice (links resolved); under a directory, only
    regular files count, and what else is there goes to ``skipped``."""
    if not paths:
        raise BadInput("no miss log given (pass LOG files or directories holding them)")
    found: list[Path] = []
    skipped = [] if skipped is None else skipped
    for p in map(Path, paths):
        if p.is_dir():
            found += _logs_under(p, skipped)
        elif p.is_file():
            found.append(Path(os.path.realpath(p)))
        elif os.path.lexists(p) and not p.exists():
            raise BadInput(f"{p}: a link to nothing, not a miss log")
        elif os.path.lexists(p):
            raise BadInput(f"{p}: not a regular file or a directory")
        else:
            raise BadInput(f"{p}: no such miss log or directory")
    if not found:
        why = f" (skipped {len(skipped)}: {shorten(skipped[0], 200)}...)" if skipped else ""
        raise BadInput(f"no *.jsonl miss logs under {', '.join(paths)}{why}")
    return found


def _logs_under(root: Path, skipped: list[str]) -> list[Path]:
    """The ``*.jsonl`` regular files under ``root``, top-down, names sorted (os.walk's order),
    without following a link and without recursion: a tree nested deeper than Python's
    recursion limit (os.walk recurses once per level) is a pod's to make.  Directories past
    MAX_LOG_DEPTH levels are skipped and listed, as is what is not a regular file."""
    found: list[Path] = []
    stack = [(root, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            skipped.append(f"{d} (cannot be listed: {e.strerror or e})")
            continue
        subdirs = []
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:  # gone since it was listed
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth >= MAX_LOG_DEPTH:
                    skipped.append(f"{e.path} (over {MAX_LOG_DEPTH} directories deep)")
                else:
                    subdirs.append(Path(e.path))
            elif not e.name.endswith(".jsonl"):
                continue
            elif stat.S_ISREG(st.st_mode):
                found.append(Path(e.path))
            else:
                skipped.append(f"{e.path} (not a regular file)")
        stack += [(s, depth + 1) for s in reversed(subdirs)]
    return found


def _open_log(path: Path) -> int:
    try:
        return open_regular(path, "miss log", missing=None)
    except FileNotFoundError:
        raise BadInput(f"{path}: no such miss log (removed while reading?)") from None
    except InvalidDocument as e:  # swapped for a link, FIFO or device since it was listed
        raise BadInput(f"{path}: {e.reason}") from None
    except OSError as e:
        raise from_os_error(e, path) from None


def _lines(fd: int) -> Iterator[bytes | None]:
    """Each line of ``fd``, at most MAX_LINE_BYTES read at a time; None for a longer one (its
    rest is read and dropped, never held)."""
    with os.fdopen(fd, "rb") as f:
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                while raw and not raw.endswith(b"\n"):
                    raw = f.readline(MAX_LINE_BYTES)
                yield None
                continue
            yield raw


def read_lines(path: Path, report: MissReport) -> Iterator[dict]:
    """The well-formed miss lines of one log; the rest counted in ``report``."""
    for raw in _lines(_open_log(path)):
        if raw is not None and not raw.strip():
            continue
        report.lines += 1
        if raw is None:
            report.unreadable += 1
            continue
        try:
            entry = parse_json(raw, LINE_DOCUMENT)
        except InvalidDocument:
            report.unreadable += 1
            continue
        version = entry.get("cachebake_miss") if isinstance(entry, dict) else None
        if type(version) is not int or version != FORMAT:
            report.foreign += 1
            continue
        if line_problem(entry):
            report.malformed += 1
            continue
        yield entry


def line_problem(e: dict) -> str | None:
    """Why a miss line's fields do not have the types the miss log writes, or None."""
    if e.get("kind") not in MISS_KINDS:
        return "kind"
    for key in ("kernel", "key"):
        if not (isinstance(e.get(key), str) and 0 < len(e[key]) <= MAX_FIELD):
            return key
    for key in ("time", "pod", "host", "stored", "namespace", "node", "file", "record_error"):
        if key in e and not (isinstance(e[key], str) and len(e[key]) <= MAX_FIELD):
            return key
    seconds = e.get("seconds")
    if seconds is not None and not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                                    and math.isfinite(seconds) and seconds >= 0):
        return "seconds"
    if e.get("record") is not None and not isinstance(e["record"], dict):
        return "record"
    for key in ("configs", "timings"):
        if e.get(key) is not None and not isinstance(e[key], list):
            return key
    if e["kind"] == "vllm":
        return _vllm_problem(e)
    return None


def _vllm_problem(e: dict) -> str | None:
    """A vllm line's own fields: the role, the unit's kind and dir (the shapes vLLM writes,
    cachebake.serve.vllm_misses), counts, flags and model as the server logs them."""
    from cachebake.serve.vllm_misses import AOT, Unit, unit_of

    if e.get("role") != "vllm":
        return "role"
    if e.get("unit") not in VLLM_UNITS:
        return "unit"
    where = "aot" if e["unit"] == AOT else "backend_dir"
    unit = unit_of(e[where]) if isinstance(e.get(where), str) and len(e[where]) <= MAX_FIELD else None
    if not isinstance(unit, Unit) or unit.kind != e["unit"] or unit.rel != e[where] \
            or unit.hash != e["key"] or unit.label != e["kernel"]:
        return where
    for key in ("files", "bytes"):
        if e.get(key) is not None and not (type(e[key]) is int and e[key] >= 0):
            return key
    args = e.get("serve_args")
    if args is not None and not (isinstance(args, dict) and len(args) <= MAX_SERVE_ARGS
                                 and all(isinstance(k, str) and len(k) <= 64 for k in args)):
        return "serve_args"
    if e.get("model") is not None and not (isinstance(e["model"], str) and len(e["model"]) <= MAX_FIELD):
        return "model"
    return None


def serve_flags_text(args: dict | None) -> str:
    """A vllm line's serve args as the flags a person reads (``--x 1 --y``), one line."""
    if args is None:
        return "(no serve flags logged)"
    from cachebake.vllm.serveargs import serve_args_to_flags

    try:
        return " ".join(serve_args_to_flags(args)) or "(no flags)"
    except (TypeError, ValueError):
        return "(serve flags not readable)"


def specialization(entry: dict) -> str:
    """``*fp16,*fp16,i32 BLOCK=512 num_warps=8`` for a kernel; the tuning key for an
    autotune result; the file for a helper."""
    kind = entry["kind"]
    if kind == "vllm":
        where = entry.get("aot") or entry.get("backend_dir")
        return f"{where}, {entry.get('files')} files, flags {serve_flags_text(entry.get('serve_args'))}"
    if kind == "autotune":
        return f"tuning key {entry.get('tuning_key')}, {len(entry.get('configs') or [])} configs"
    if kind == "helper":
        return str(entry.get("file", ""))
    if not entry.get("record"):
        return "(no record)"
    try:
        rec = CompileSpec.from_dict(entry["record"], "record")
    except InvalidDocument:
        return "(malformed record)"
    names = [name for name, _ in rec.signature]
    types = ",".join(str(ty) for _, ty in rec.signature if ty != "constexpr")
    consts = []
    for path, v in rec.constexprs:
        name = names[path[0]] if len(path) == 1 and path[0] < len(names) else str(path)
        consts.append(f"{name}={_value(v)}")
    opts = [f"{k}={rec.options[k]}" for k in ("num_warps", "num_stages") if k in rec.options]
    divisible = sum(1 for _, v in rec.attrs if v)
    parts = [types] + consts + opts + ([f"{divisible} args %16"] if divisible else [])
    return " ".join(p for p in parts if p)


def _value(v) -> str:
    if isinstance(v, dict) and len(v) == 1:
        kind, inner = next(iter(v.items()))
        return f"{inner}" if kind in ("dtype", "constexpr") else f"{kind}:{inner}"
    return str(v)


def merge(paths: list[str]) -> MissReport:
    skipped: list[str] = []
    files = log_files(paths, skipped)
    report = MissReport(logs=[str(f) for f in files], skipped=skipped)
    groups: dict[tuple[str, str, str], MissGroup] = {}
    for path in files:
        for e in read_lines(path, report):
            ident = (e["kind"], e["kernel"], e["key"])
            g = groups.get(ident)
            if g is None:
                g = groups[ident] = MissGroup(*ident, specialization=specialization(e), entry=e)
            elif not g.entry.get("record") and e.get("record"):
                g.entry, g.specialization = e, specialization(e)  # a line that has the record
            g.count += 1
            t = e.get("time", "")
            g.first_seen = min(g.first_seen, t) if g.first_seen else t
            g.last_seen = max(g.last_seen, t)
            g.seconds += e.get("seconds") or 0.0
            replica = e.get("pod") or e.get("host") or "?"
            if replica not in g.replicas:
                g.replicas.append(replica)
    report.groups = sorted(groups.values(), key=lambda g: (-g.count, g.kind, g.kernel, g.key))
    for g in report.groups:
        g.replicas.sort()
    return report


def misses_of(report: MissReport, kind: str) -> list[MissGroup]:
    return [g for g in report.groups if g.kind == kind]


@dataclass
class VllmRecordReport:
    """``misses --vllm-cache``: what a scan of a server's vLLM cache added to its miss log."""

    cache: str
    log: str
    inventory: str  # where the bake's list of dirs came from
    baked: int = 0  # baked torch.compile dirs found there
    logged: list[dict] = field(default_factory=list)  # new dirs, one line each
    already: int = 0  # new dirs the log already had

    def to_dict(self) -> dict:
        return dict(vars(self))


def record_vllm_cache(cache: str, log: str, *, bake: str | None = None, target: str | None = None,
                      serve_args: str | None = None, model: str | None = None) -> VllmRecordReport:
    """Scan ``cache`` (a server's VLLM_CACHE_ROOT, or a copy of it) for torch.compile dirs the
    bake lacks and append one miss line per new dir to ``log`` (a dir the log already names is
    not added again).  The bake's inventory: ``bake`` (an artifact: its layer's entries) or
    else the install ``cache`` is the vllm role of.  ``serve_args``: the server's flags (as
    ``--serve-args`` takes them), ``model`` its model reference: recorded for fold-back.
    VllmCacheRefused (exit 6) for a tree vLLM did not write; BadInput (exit 3) otherwise."""
    from cachebake.serve import misslog, overlay
    from cachebake.serve import vllm_misses as vm
    from cachebake.vllm.serveargs import parse_serve_args

    if not os.path.isdir(cache):
        raise BadInput(f"--vllm-cache {cache}: no such directory")
    if bake is not None:
        from cachebake.artifact.reader import open_source
        from cachebake.replay.vllm_fold import layer_units

        source = open_source(bake)
        baked, where = layer_units(source, source.select(target)), f"the layer of {bake}"
    else:
        baked = vm.installed_inventory(cache)
        if baked is None:
            raise BadInput(f"--vllm-cache {cache}: not the vllm role of an install (no install.json "
                           "lists it): give the bake with --bake ART")
        where = "install.json"
    args = parse_serve_args(serve_args) if serve_args is not None else None
    try:
        result = vm.scan(cache, baked)
    except OSError as e:
        raise from_os_error(e, cache) from None
    report = VllmRecordReport(cache=cache, log=log, inventory=where, baked=result.baked)
    seen: set[tuple[str, str]] = set()
    if os.path.lexists(log):
        prior = MissReport(logs=[log])
        for e in read_lines(Path(log), prior):
            if e["kind"] == vm.KIND:
                seen.add((e["kernel"], e["key"]))
    lines = vm.miss_lines(result, args, model, "vllm cache")
    new = [e for e in lines if (e["kernel"], e["key"]) not in seen]
    report.already = len(lines) - len(new)
    if new:
        try:
            fd = misslog.open_log(log)
        except overlay.Refused as e:
            raise BadInput(f"{log}: the miss log {e}") from None
        except OSError as e:
            raise from_os_error(e, log) from None
        try:
            write_all(fd, "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in new).encode())
        finally:
            os.close(fd)
    report.logged = [{k: e.get(k) for k in ("unit", "backend_dir", "aot", "files", "bytes")
                      if e.get(k) is not None} for e in new]
    return report
