#!/usr/bin/env python3
"""The table for bench/RESULTS.md from bench/gpu_replay.sh's OUT directory.

    python3 bench/replay_table.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(out: Path) -> None:
    rows = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["label"]] = r
    logs = out / "logs"
    print("| run | rc | wall s | rounds | compiles in rounds | autotune benchmarks | seeded compiles (s summed) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    serial = rows.get("serial", {}).get("wall_s")
    for label in ("serial", "seeded", "seeded-retune"):
        r, doc = rows.get(label), load(logs / f"{label}.json")
        if not r:
            continue
        bake = (doc or {}).get("bake", {})
        seed = ((doc or {}).get("pack", {}).get("manifest", {}).get("bake", {}) or {}).get("seed") or {}
        ratio = f" ({r['wall_s'] / serial:.2f}x)" if serial and label != "serial" else ""
        seeded = f"{seed.get('compiled', '-')} ({seed.get('compile_seconds', '-')})" if seed else "-"
        print(f"| {label} | {r['rc']} | {r['wall_s']}{ratio} | {bake.get('rounds', '-')} | "
              f"{bake.get('compiles', '-')} | {bake.get('autotunes', '-')} | {seeded} |")
    print()
    print("| replayed artifact | replay rc | replay wall s | compiled | candidates added | helpers | "
          "autotune carried | problems | verify rc | verify compiles | autotunes | helper builds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label in ("dev", "cpu"):
        rep, ver = load(logs / f"replay-{label}.json"), load(logs / f"verify-{label}.json")
        if rep is None and ver is None:
            continue
        rep, ver = rep or {}, ver or {}
        r, v = rows.get(f"replay-{label}", {}), rows.get(f"verify-{label}", {})
        print(f"| {label} | {r.get('rc', '-')} | {r.get('wall_s', '-')} | {rep.get('compiled', '-')} | "
              f"{rep.get('derived', '-')} | {rep.get('helpers_built', '-')} | {rep.get('autotune_carried', '-')} | "
              f"{len(rep.get('problems') or [])} | {v.get('rc', '-')} | {ver.get('compiles', '-')} | "
              f"{ver.get('autotunes', '-')} | {ver.get('helper_builds', '-')} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
