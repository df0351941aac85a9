#!/usr/bin/env python3
"""bench/gpu_engine_proof.sh's results as a table: table.md and table.json in OUT.

    python3 bench/engine_proof_table.py results.jsonl LOGS OUT MODEL [MODEL...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path):
    try:
        text = path.read_text().strip()
        return json.loads(text.splitlines()[-1]) if text else None
    except (OSError, ValueError, IndexError):
        return None


def load_json(path: Path):
    """A whole JSON document (the commands' --json output)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(res_path: str, logs: str, out: str, *models: str) -> None:
    logs_dir, out_dir = Path(logs), Path(out)
    runs = {}
    for line in Path(res_path).read_text().splitlines():
        if line.strip().startswith("{"):
            r = json.loads(line)
            runs[r["label"]] = r
    rows = []
    for m in models:
        n = m.replace(":", "-")
        build = (load_json(logs_dir / f"build-{n}.out") or {}).get("bake") or {}
        inspected = ((load_json(logs_dir / f"inspect-{n}.json") or {}).get("bakes") or [{}])[0]
        manifest_bake = (inspected.get("manifest") or {}).get("bake") or {}
        ins = load_json(logs_dir / f"install-{n}.out") or {}
        check = load(logs_dir / f"check-{n}.json") or {}
        ro = load(logs_dir / f"readonly-{n}.json") or {}
        ver = load_json(logs_dir / f"verify-{n}.out") or {}
        rows.append({
            "model": m,
            "build_rc": runs.get(f"build-{n}", {}).get("rc"), "build_s": runs.get(f"build-{n}", {}).get("wall_s"),
            "rounds": build.get("rounds"), "stable": build.get("stable"),
            "baked_compiles": build.get("compiles"), "baked_autotunes": build.get("autotunes"),
            "engine_steps": len(manifest_bake.get("engine_steps") or []),
            "plan_source": manifest_bake.get("plan_source"),
            "layer_mb": round((inspected.get("layer_size") or 0) / 1e6, 2) or None,
            "install_rc": runs.get(f"install-{n}", {}).get("rc"), "install_status": ins.get("status"),
            "check_rc": runs.get(f"check-{n}", {}).get("rc"), "check_steps": check.get("steps"),
            "check_calls": check.get("calls"), "check_compiles": check.get("compiles"),
            "check_autotunes": check.get("autotune_new"), "check_failures": check.get("failures"),
            "readonly_rc": runs.get(f"readonly-{n}", {}).get("rc"), "readonly_uid": ro.get("uid"),
            "readonly_compiles": ro.get("compiles"), "readonly_failures": ro.get("failures"),
            "verify_rc": runs.get(f"verify-{n}", {}).get("rc"), "verify_compiles": ver.get("compiles"),
        })
    cold = load(logs_dir / f"cold-{models[0].replace(':', '-')}.json") or {}
    doc = {"models": rows, "cold": {"model": models[0], "compiles": cold.get("compiles"),
                                    "autotunes": cold.get("autotune_new"),
                                    "helper_builds": cold.get("helper_builds_new"),
                                    "wall_s": cold.get("wall_s"),
                                    "compiles_by_kernel": cold.get("compiles_by_kernel")}}
    (out_dir / "table.json").write_text(json.dumps(doc, indent=1) + "\n")
    head = ("| model | bake (rounds, stable, compiles/autotunes, s) | engine check at installed path "
            "(steps, calls: compiles, autotunes, failures) | read-only, uid 65534 | verify |")
    lines = [head, "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['rounds']} rounds, stable={r['stable']}, {r['baked_compiles']}/"
            f"{r['baked_autotunes']}, {r['build_s']} s (rc {r['build_rc']}) | {r['check_steps']} steps, "
            f"{r['check_calls']} calls: {r['check_compiles']}, {r['check_autotunes']}, {r['check_failures']} "
            f"(rc {r['check_rc']}) | uid {r['readonly_uid']}: {r['readonly_compiles']} compiles, "
            f"{r['readonly_failures']} failures (rc {r['readonly_rc']}) | {r['verify_compiles']} compiles "
            f"(rc {r['verify_rc']}) |")
    lines.append("")
    lines.append(f"Cold engine check ({models[0]}, empty cache): {cold.get('compiles')} compiles, "
                 f"{cold.get('autotune_new')} autotune results, {cold.get('helper_builds_new')} launcher "
                 f"builds, {cold.get('wall_s')} s.")
    (out_dir / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
