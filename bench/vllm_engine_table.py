#!/usr/bin/env python3
"""The table of bench/vllm_engine_gpu.sh: start-up cold vs baked, first request, compiles by
phase (cachebake's monitor and vLLM's JIT monitor), torch.compile's cache, and every kernel that
still compiled with why.

    python3 bench/vllm_engine_table.py RESULTS_DIR [--artifact ART] [--out DIR]

RESULTS_DIR holds what the stages wrote: build.json, install-<run>.out, probe-<run>.json,
events-<run>.jsonl, probe-<run>.out/.err (vLLM logs to stdout), verify.out, stages.jsonl.  Missing pieces are shown as "-".
Writes table.md and table.json to --out (default RESULTS_DIR) and prints table.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

RUNS = [("cold", "empty caches (cold)"), ("moved", "installed at another path (bake root absent)"),
        ("root", "installed at the serving path (layer root)"),
        ("serveat", "installed with --serve-at, volume moved there")]
PHASES = ("startup", "first", "plan", "unseen")
WORK = ("compile", "autotune", "helper_build")
# vLLM's JIT monitor (vllm/triton_utils/jit_monitor.py), with --jit-monitor-verbose
JIT_LINE = re.compile(r"Triton (?:kernel |autotune/warmup candidate )?(?:kernel )?JIT compilation "
                      r"during inference: (\S+?)[ .(]")
TORCH_LINES = {
    "aot_loaded": "Directly load AOT compilation",
    "graphs_loaded": "Directly load the compiled graph",
    "aot_load_failed": "Compiling model again due to a load failure",
    "graphs_compiled": "Compiling a graph for compile range",
}


def load_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_events(path: Path) -> list[dict]:
    out = []
    try:
        for line in path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a torn last line
    except OSError:
        pass
    return out


def baked_specializations(artifact: str | None) -> tuple[set[str], dict[str, list[dict]]]:
    """Keys and per-kernel compile events of the engine bake (manifest's bake.events)."""
    if not artifact:
        return set(), {}
    path = Path(artifact) / "cachebake.json"
    data = load_json(path) or {}
    keys, by_name = set(), {}
    for bake in (data.get("bakes") or {}).values():
        for e in (bake.get("bake") or {}).get("events") or []:
            if e.get("kind") == "compile":
                keys.add(e.get("key"))
                by_name.setdefault(e.get("kernel"), []).append(e)
        for k in (bake.get("inventory") or {}).get("kernels") or []:
            keys.add(k.get("key_dir", "").split("/")[-1])
    return keys, by_name


def specialization(e: dict) -> str:
    """constexprs (ints Triton made constant, such as a 1, included), the argument positions it
    found divisible by 16 (the event's signature is stored with sorted keys, so positions, not
    names), warps/stages."""
    div = [f"#{idx[0]}%16" for idx, props in e.get("attrs") or []
           for name, _ in props if name == "tt.divisibility"]
    opts = e.get("options") or {}
    parts = [f"{k}={v}" for k, v in sorted((e.get("constexprs") or {}).items())] + div
    parts.append(f"w{opts.get('num_warps')}/s{opts.get('num_stages')}")
    return " ".join(parts)


def why(e: dict, baked_keys: set[str], baked: dict[str, list[dict]]) -> str:
    name = e.get("kernel", "")
    inductor = name.startswith(("triton_poi", "triton_red", "triton_per", "triton_tem"))
    if e.get("key") in baked_keys:
        return "baked with this key, missed on disk (path or environment)"
    if inductor:
        return "Inductor's kernel: torch.compile compiled the graph again (its cache missed)"
    if name not in baked:
        return "never met while baking: traffic the plan does not send"
    seen = {specialization(b) for b in baked[name]}
    if specialization(e) in seen:
        return "the same specialization was baked under another key (source, options or env differ)"
    return f"a specialization the bake did not meet (it baked {len(seen)} of this kernel)"


def phase_of(t: float, phases: dict) -> str:
    for p in PHASES:
        w = phases.get(p)
        if w and t <= w["end"] + 0.5:
            return p
    return "after"


def run_row(r: Path, run: str, baked_keys, baked) -> dict | None:
    probe = load_json(r / f"probe-{run}.json")
    install = load_json(r / f"install-{run}.out")
    if probe is None and install is None:
        return None
    phases = (probe or {}).get("phases") or {}
    work = [e for e in read_events(r / f"events-{run}.jsonl") if e.get("kind") in WORK]
    by_phase = Counter(phase_of(e.get("time", 0), phases) for e in work)
    # vLLM logs (its JIT monitor's warnings, torch.compile's cache lines) go to stdout, tqdm
    # and Python warnings to stderr: read both.
    log = ""
    for name in (f"probe-{run}.out", f"probe-{run}.err"):
        try:
            log += (r / name).read_text(errors="replace")
        except OSError:
            pass
    jit = Counter(m.group(1) for m in JIT_LINE.finditer(log))
    torch_cache = {k: log.count(v) for k, v in TORCH_LINES.items()}
    kernels = [{"kernel": e.get("kernel"), "kind": e.get("kind"),
                "phase": phase_of(e.get("time", 0), phases), "key": e.get("key"),
                "specialization": specialization(e) if e.get("kind") == "compile" else "",
                "why": why(e, baked_keys, baked) if e.get("kind") == "compile" else e.get("kind")}
               for e in work]
    return {
        "run": run,
        "startup_s": phases.get("startup", {}).get("seconds"),
        "first_request_s": (probe or {}).get("first_request_seconds"),
        "plan_s": phases.get("plan", {}).get("seconds"),
        "unseen_s": phases.get("unseen", {}).get("seconds"),
        "compiles": {p: by_phase.get(p, 0) for p in (*PHASES, "after")},
        "work_total": len(work),
        "jit_monitor": sum(jit.values()), "jit_monitor_kernels": dict(jit),
        "torch_compile": torch_cache,
        "model_runner": (probe or {}).get("model_runner"),
        "install": None if install is None else {
            k: install.get(k) for k in ("status", "to", "serve_at", "relocated", "left_out", "seconds")},
        "kernels": kernels,
        "crashed": probe is None,
    }


def build_summary(r: Path) -> dict | None:
    b = load_json(r / "build.json")
    if not b:
        return None
    bake = b.get("bake") or b  # `cachebake build --json`: {"bake": BuildReport, "pack": ...}
    rounds = bake.get("per_round") or []
    return {"rounds": [{k: x.get(k) for k in ("round", "compiles", "autotunes", "helper_builds",
                                                "seconds")} for x in rounds],
            "stable": bake.get("stable"), "plan_digest": bake.get("plan_digest"),
            "seconds": round(sum(x.get("seconds") or 0 for x in rounds), 1)}


def fmt(v) -> str:
    return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))


def render(table: dict) -> str:
    lines = ["| run | engine start-up s | first request s | compiles: start-up / first / plan / unseen | "
             "vLLM JIT monitor | torch.compile (AOT loaded / graphs loaded / compiled / load failed) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in table["runs"]:
        c = row["compiles"]
        tc = row["torch_compile"]
        label = dict(RUNS)[row["run"]] + (" **no result (crash?)**" if row["crashed"] else "")
        lines.append(f"| {label} | {fmt(row['startup_s'])} | {fmt(row['first_request_s'])} | "
                     f"{c['startup']} / {c['first']} / {c['plan']} / {c['unseen']} | "
                     f"{row['jit_monitor']} | {tc['aot_loaded']} / {tc['graphs_loaded']} / "
                     f"{tc['graphs_compiled']} / {tc['aot_load_failed']} |")
    if table.get("build"):
        b = table["build"]
        lines += ["", "Bake rounds (compiles, autotunes, helper builds, s): " + "; ".join(
            f"{x['round']}: {x['compiles']}/{x['autotunes']}/{x['helper_builds']}/{fmt(x['seconds'])}"
            for x in b["rounds"]) + f" (stable: {b['stable']})"]
    for row in table["runs"]:
        if row["install"]:
            i = row["install"]
            lines.append(f"- install for `{row['run']}`: {i.get('status')}, relocated {i.get('relocated')}, "
                         f"left out {i.get('left_out') or 'nothing'}, {fmt(i.get('seconds'))} s")
    if table.get("verify") is not None:
        v = table["verify"]
        lines.append(f"- verify at the moved install: ok={v.get('ok')}, work={len(v.get('work') or [])}")
    still = [(row["run"], k) for row in table["runs"] if row["run"] != "cold" for k in row["kernels"]]
    lines += ["", f"Kernels that still compiled in a baked run ({len(still)}):", "",
              "| run | phase | kernel | specialization | why |", "| --- | --- | --- | --- | --- |"]
    for run, k in still:
        lines.append(f"| {run} | {k['phase']} | {k['kernel']} | {k['specialization']} | {k['why']} |")
    if table.get("device_seconds") is not None:
        lines += ["", f"Device time of the stages: {table['device_seconds']:.0f} s"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--artifact")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    r = Path(a.results)
    keys, baked = baked_specializations(a.artifact)
    rows = [x for x in (run_row(r, run, keys, baked) for run, _ in RUNS) if x]
    stages = [json.loads(ln) for ln in (r / "stages.jsonl").read_text().splitlines()] \
        if (r / "stages.jsonl").exists() else []
    table = {"runs": rows, "build": build_summary(r), "verify": load_json(r / "verify.out"),
             "stages": stages, "device_seconds": sum(s.get("wall_s", 0) for s in stages) or None}
    out = Path(a.out or r)
    (out / "table.json").write_text(json.dumps(table, indent=1))
    md = render(table)
    (out / "table.md").write_text(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
