#!/usr/bin/env python3
"""Turn bench/gpu_bake.sh's results into the table for bench/RESULTS.md.

    python3 bench/gpu_table.py results.jsonl inspect.json build.json verify.json
"""

from __future__ import annotations

import json
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(res_path, inspect_path, build_path, verify_path):
    rows = {}
    for line in open(res_path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["label"]] = r
    med = lambda prefix: statistics.median(r["sweep_s"] for k, r in rows.items() if k.startswith(prefix) and "sweep_s" in r)
    total = lambda prefix, key: sum(r.get(key, 0) for k, r in rows.items() if k.startswith(prefix) and "sweep_s" in r)
    cold, restored, warm = rows.get("cold", {}), med("restored"), med("warm")
    ins = load(inspect_path) or {}
    bake = (ins.get("bakes") or [{}])[0]
    layer = (bake.get("manifest") or {}).get("layer") or {}
    b = (load(build_path) or {}).get("bake") or {}
    v = load(verify_path) or {}
    ro = rows.get("readonly_nobody", {})
    print("| measure | value |\n| --- | --- |")
    print(f"| start-up before the first kernel (torch, CUDA context, buffers; median) | {statistics.median(r['startup_s'] for r in rows.values() if 'startup_s' in r):.2f} s, not in the sweep times |")
    print(f"| cold sweep (empty cache) | {cold.get('sweep_s')} s, {cold.get('compiles')} compiles, {cold.get('autotunes')} autotune benchmarks |")
    print(f"| restored sweep at another path (median of 3) | {restored:.3f} s, {total('restored', 'compiles')} compiles, {total('restored', 'autotunes')} autotune benchmarks |")
    print(f"| same-path warm sweep (median of 3) | {warm:.3f} s, {total('warm', 'compiles')} compiles |")
    if cold.get("sweep_s"):
        print(f"| cold / restored | {cold['sweep_s'] / restored:.1f}x |")
    print(f"| restored / same-path warm | {restored / warm:.3f}x |")
    print(f"| build | {rows.get('build', {}).get('wall_s')} s, {b.get('rounds')} rounds (stable: {b.get('stable')}), "
          f"{b.get('compiles')} compiles, {b.get('autotunes')} autotunes |")
    if layer:
        print(f"| artifact layer | {layer.get('size', 0) / 1e6:.2f} MB zstd of {layer.get('uncompressed_size', 0) / 1e6:.1f} MB raw "
              f"({100 * layer.get('size', 0) / max(layer.get('uncompressed_size', 1), 1):.1f}%), {layer.get('files')} files |")
    print(f"| install (another path) | {rows.get('install', {}).get('wall_s')} s (process wall, rc {rows.get('install', {}).get('rc')}); "
          f"again: rc {rows.get('install_again', {}).get('rc')} |")
    print(f"| verify at the installed path | rc {rows.get('verify', {}).get('rc')}, "
          f"{v.get('compiles')} compiles, {v.get('autotunes')} autotune benchmarks, {v.get('cache_hits')} hits |")
    print(f"| read-only cache, uid {ro.get('uid')} | {ro.get('sweep_s')} s, {ro.get('compiles')} compiles, "
          f"{ro.get('autotunes')} autotune benchmarks |")


if __name__ == "__main__":
    main(*sys.argv[1:5])
