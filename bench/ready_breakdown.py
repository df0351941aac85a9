"""Where a ``vllm serve`` start spends its time, per phase, from the server's own log.

    python3 bench/ready_breakdown.py SERVER.log [--start EPOCH] [--json]

vLLM stamps each record with ``%m-%d %H:%M:%S`` (whole seconds, no year: vllm/logger.py
``_DATE_FORMAT``, 0.24 and 0.34), and the process that wrote it as ``(APIServer pid=N)`` /
``(EngineCore pid=N)`` / ``(EngineCore_DP0 pid=N)`` before the level: in 0.34 the format itself
(logger.py:28-32), in 0.24 ``decorate_logs`` writing it onto the stream.  Each phase runs from
one marker line to the next (the markers below, first occurrence each), so a phase is exact to
about a second; where vLLM reports a duration itself (model load, torch.compile, graph capture,
engine init) that number is kept beside it (``reported``).

Phases, in start-up order (a marker that is absent merges its phase into the next one):

    api_import       process start (``--start``; else the first stamped line) -> the API
                     server's "non-default args" line (its imports done, args parsed)
    engine_start     -> "Initializing a V1 LLM engine" (the EngineCore process started, imported)
    model_load       -> "Model loading took"
    torch_compile    -> "torch.compile took ... in total" (an AOT load runs inside it too)
    profiling        -> "Available KV cache memory" (profiling ran) or, with a startup plan or
                        --kv-cache-memory-bytes, "... skipped memory profiling" (0.34
                        gpu_worker.py:696-707)
    kv_cache         -> "KV cache size" (0.24: "GPU KV cache size: N tokens"; 0.34: one line
                        "GPU KV cache size: N tokens, Maximum concurrency ...")
    cuda_graphs      -> "Graph capturing finished in"
    engine_ready     -> "init engine (profile, create kv cache, warmup model) took"
    api_ready        -> vLLM's "Starting vLLM server on" / "Available routes are:" (uvicorn's
                        own "Application startup complete." carries no stamp: the run script's
                        first answered /health is the exact time, ``--start`` + its own clock)

The 0.24 markers are checked against real H200 logs (bench/results/gpu-2026-12-01-identity/);
the 0.34 ones are vLLM 0.34.0's format strings (file:line in /work/notes/vllm034.md §7), not yet
seen in a real 0.34 log.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from typing import Any, Iterable

# (phase, the marker line that ends it: a regex on the message)
PHASES: tuple[tuple[str, str], ...] = (
    ("api_import", r"^non-default args: |^vLLM server version |version \d+\.\d+"),
    ("engine_start", r"^Initializing a V1 LLM engine \(v"),
    ("model_load", r"^Model loading took "),
    ("torch_compile", r"torch\.compile took [\d.]+ s in total"),
    ("profiling", r"^Available KV cache memory: |skipped memory profiling"),
    ("kv_cache", r"KV cache size: [\d,]+ tokens"),
    ("cuda_graphs", r"^Graph capturing finished in "),
    ("engine_ready", r"^init engine \(profile, create kv cache, warmup model\) took "),
    ("api_ready", r"^Application startup complete\.|^Starting vLLM server on |^Available routes are:"),
)

# Durations vLLM reports itself (seconds), first occurrence each.
REPORTED: tuple[tuple[str, str], ...] = (
    ("model_load", r"^Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    ("weights_load", r"^Loading weights took ([\d.]+) seconds"),
    ("dynamo", r"Dynamo bytecode transform time: ([\d.]+) s"),
    ("torch_compile", r"torch\.compile took ([\d.]+) s in total"),
    ("warmup_run", r"Initial profiling/warmup run took ([\d.]+) s"),
    ("cuda_graphs", r"^Graph capturing finished in ([\d.]+) secs"),
    ("engine_init", r"^init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
)

# What the start did, besides its times.
FLAGS: tuple[tuple[str, str], ...] = (
    ("aot_loaded", r"Directly load AOT compilation from path "),
    ("aot_load_failed", r"Compiling model again due to a load failure from "),
    ("graphs_compiled", r"Compiling a graph for compile range "),
    ("graphs_loaded_from_cache", r"Directly load the compiled graph\(s\) for compile range "),
    ("mega_artifact", r"reconstructed serializable fn from standalone compile artifacts"),
    ("startup_plan_applied", r"^Applying persisted startup plan "),
    ("startup_plan_refused", r"^Startup plan not applied: "),
    ("startup_plan_saved", r"^Saved startup plan to "),
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# [prefix](Proc pid=N) LEVEL MM-DD HH:MM:SS[.fff] [file:line] message
_LINE = re.compile(r"(?:\((?P<proc>[A-Za-z0-9_]+) pid=(?P<pid>\d+)\) )?"
                   r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                   r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)? \[(?P<src>[^\]]*)\] ?(?P<msg>.*)")


def records(lines: Iterable[str], year: int = 2026) -> list[dict[str, Any]]:
    """The stamped log records: {"t": datetime, "proc", "level", "src", "msg"}.  The year is
    not in vLLM's stamp: ``year``, and the next one after a stamp goes back past New Year."""
    out: list[dict[str, Any]] = []
    last: dt.datetime | None = None
    for raw in lines:
        m = _LINE.search(_ANSI.sub("", raw.rstrip("\n")))
        if not m:
            continue
        try:
            t = dt.datetime.strptime(f"{year}-{m['ts']}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            continue
        if last is not None and t < last - dt.timedelta(days=180):
            year += 1
            t = t.replace(year=year)
        last = t
        out.append({"t": t, "proc": m["proc"], "level": m["level"], "src": m["src"], "msg": m["msg"]})
    return out


def breakdown(lines: Iterable[str], start: float | None = None, year: int = 2026) -> dict[str, Any]:
    """Per-phase seconds of one start (see the module doc).  ``start``: the epoch second the
    process was launched (the run script's clock), for the first phase; the log's stamps are
    the server's local time, taken as UTC here, as the scripts run it (TZ unset)."""
    recs = records(lines, year)
    out: dict[str, Any] = {"phases": {}, "reported": {}, "flags": {}, "markers": {}, "missing": []}
    if not recs:
        out["error"] = "no vLLM log record in the input"
        return out
    t0 = (dt.datetime.fromtimestamp(start, dt.timezone.utc).replace(tzinfo=None)
          if start is not None else recs[0]["t"])
    out["start"] = t0.isoformat()
    prev, prev_name = t0, "start"
    for phase, pattern in PHASES:
        rx = re.compile(pattern)
        hit = next((r for r in recs if r["t"] >= prev and rx.search(r["msg"])), None)
        if hit is None:
            out["missing"].append(phase)
            continue
        out["phases"][phase] = (hit["t"] - prev).total_seconds()
        out["markers"][phase] = f"{hit['t'].strftime('%H:%M:%S')} ({hit['proc'] or '-'}) {hit['msg'][:100]}"
        prev, prev_name = hit["t"], phase
    out["ready_seconds"] = (prev - t0).total_seconds()
    out["ready_marker"] = prev_name
    for name, pattern in REPORTED:
        rx = re.compile(pattern)
        for r in recs:
            m = rx.search(r["msg"])
            if m:
                out["reported"][name] = float(m.group(1))
                break
    for name, pattern in FLAGS:
        rx = re.compile(pattern)
        out["flags"][name] = sum(1 for r in recs if rx.search(r["msg"]))
    return out


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """One column per start, one row per phase (seconds), then vLLM's own numbers."""
    names = [p for p, _ in PHASES]
    rep = [n for n, _ in REPORTED]
    head = ["phase"] + [label for label, _ in rows]
    body = [[p] + [_fmt(b["phases"].get(p)) for _, b in rows] for p in names]
    body.append(["= ready"] + [_fmt(b.get("ready_seconds")) for _, b in rows])
    body += [[f"vLLM: {n}"] + [_fmt(b["reported"].get(n)) for _, b in rows] for n in rep]
    body += [[f"# {n}"] + [str(b["flags"].get(n, 0)) for _, b in rows]
             for n in ("aot_loaded", "aot_load_failed", "graphs_compiled", "startup_plan_applied")]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head, *body])


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", help="vllm serve logs (LABEL=PATH or PATH)")
    ap.add_argument("--start", type=float, action="append",
                    help="launch epoch second of each log, in order (else its first line)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for i, spec in enumerate(a.logs):
        label, _, path = spec.rpartition("=") if "=" in spec else (spec, "", spec)
        start = a.start[i] if a.start and i < len(a.start) else None
        with open(path, errors="replace") as f:
            rows.append((label or path, breakdown(f, start)))
    if a.json:
        print(json.dumps({label: b for label, b in rows}, indent=2, default=str))
    else:
        print(table(rows))
    return 0 if all("error" not in b for _, b in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
