#!/usr/bin/env python3
"""The summary bench/gpu_v034_serve.sh prints last, from its results dir.

    python3 bench/gpu_v034_table.py RESULTS_DIR

1. the bake: vLLM version, hash scheme, torch.compile outcome, startup plan;
2. the served start (installed at /srv/cb as uid 65534, its own HOME) with traffic: ready,
   Triton compiles at start-up and under each `vllm bench serve` scenario, the AOT load;
3. the interleaved starts: per start and the median per kind (baked / warm restart), ready
   (launch to /health) and each phase of bench/ready_breakdown.py.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ready_breakdown as rb  # noqa: E402


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rows(path: Path) -> list[dict]:
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    return out


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)


def start_row(label: str, d: dict) -> list[str]:
    b = d.get("breakdown") or {}
    ph = b.get("phases") or {}
    return [label, _f(d.get("ready_s")), _f(d.get("engine_init_s")), _f(d.get("torch_compile_s")),
            "yes" if d.get("aot_loaded") else "no", str(len(d.get("startup_compiles") or [])),
            *(_f(ph.get(p)) for p, _ in rb.PHASES),
            str((b.get("flags") or {}).get("startup_plan_applied", "-"))]


HEAD = ["start", "ready_s", "engine_init", "compile", "aot", "triton", *(p for p, _ in rb.PHASES), "plan"]


def main(results: str) -> int:
    r = Path(results)
    ident = _load(r / "identity.json") or {}
    print("== bake")
    if ident:
        tc = ident.get("torch_compile") or {}
        plan = ident.get("startup_plan") or {}
        print(f"vLLM {ident.get('vllm_version')} ({ident.get('hash_scheme')}); path factors "
              f"{sorted(ident.get('path_factors') or {})}; torch.compile {tc.get('aot')} "
              f"({tc.get('graphs_compiled')} graphs compiled); startup plan "
              f"{'on' if plan.get('enabled') else 'off'}, {len(plan.get('plans') or [])} file(s); "
              f"rounds {ident.get('rounds')}")
    else:
        print("(no bake results)")
    for s in _rows(r / "stages.jsonl"):
        print(f"  {s.get('stage')}/{s.get('name')}: rc={s.get('rc')} {s.get('wall_s')} s")
    moved = _load(r / "serve-moved.json")
    print("\n== served at /srv/cb as uid 65534, own HOME, with traffic")
    if moved:
        print(_grid([HEAD, start_row("moved", moved)]))
        rows = [["scenario", "completed", "failed", "median_ttft_ms", "p99_ttft_ms", "error"]]
        for t in moved.get("traffic") or []:
            rows.append([t.get("scenario", "?"), _f(t.get("completed")), _f(t.get("failed")),
                         _f(t.get("median_ttft_ms")), _f(t.get("p99_ttft_ms")), (t.get("error") or "")[:60]])
        if len(rows) > 1:
            print(_grid(rows))
        tc = moved.get("traffic_compiles")
        print(f"Triton compiles: start-up {len(moved.get('startup_compiles') or [])}, traffic "
              f"{'-' if tc is None else len(tc)}; AOT loaded: {moved.get('aot_loaded')}; "
              f"Inductor graphs compiled: {moved.get('graphs_compiled')}")
        check = _load(r / "check-with-env.out")
        if isinstance(check, dict):
            print(f"verify --check-only: would_hit={check.get('would_hit')} "
                  f"differences={[d.get('factor') for d in check.get('differences') or []]}")
    else:
        print("(not run)")
    starts = _rows(r / "interleave.jsonl")
    print("\n== interleaved starts (baked: uid 65534 at /srv/cb; warm: vLLM's own restart, root, bake root)")
    if starts:
        rows = [HEAD] + [start_row(f"{i + 1}:{d.get('kind')}", d) for i, d in enumerate(starts)]
        for kind in ("baked", "warm"):
            mine = [d for d in starts if d.get("kind") == kind]
            if not mine:
                continue
            med = {"ready_s": _median([d.get("ready_s") for d in mine]),
                   "engine_init_s": _median([d.get("engine_init_s") for d in mine]),
                   "torch_compile_s": _median([d.get("torch_compile_s") for d in mine]),
                   "aot_loaded": all(d.get("aot_loaded") for d in mine),
                   "startup_compiles": [None] * int(_median([len(d.get("startup_compiles") or [])
                                                             for d in mine]) or 0),
                   "breakdown": {"phases": {p: _median([((d.get("breakdown") or {}).get("phases") or {}).get(p)
                                                       for d in mine]) for p, _ in rb.PHASES}}}
            rows.append(start_row(f"median {kind} (n={len(mine)})", med))
        print(_grid(rows))
    else:
        print("(not run)")
    return 0


def _median(values):
    vals = [v for v in values if isinstance(v, (int, float))]
    return float(statistics.median(vals)) if vals else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
