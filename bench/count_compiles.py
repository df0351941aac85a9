#!/usr/bin/env python3
"""Run a Python module in this process and report wall seconds and Triton's real compiles.

A bench helper, not the monitor: it counts through ``triton.knobs.compilation.listener``
(``cache_hit=False`` is a real compile, True a file-cache hit) and counts the
``*.autotune.json`` files that appeared in TRITON_CACHE_DIR (each one is an autotune
benchmark that ran).  Prints one JSON line on stdout at the end.

Usage:  python3 bench/count_compiles.py -m cachebake.vllm.kernels.driver --model nemotron-h
"""

from __future__ import annotations

import collections
import json
import os
import runpy
import sys
import time
from pathlib import Path


def autotune_files(cache_dir: str | None) -> set[str]:
    if not cache_dir or not Path(cache_dir).is_dir():
        return set()
    return {str(p) for p in Path(cache_dir).rglob("*.autotune.json")}


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit(__doc__)
    module, args = sys.argv[2], sys.argv[3:]
    import triton

    compiles: collections.Counter[str] = collections.Counter()
    hits: collections.Counter[str] = collections.Counter()
    by_step: collections.Counter[str] = collections.Counter()  # CACHEBAKE_STEP at compile time
    compile_seconds = 0.0

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        nonlocal compile_seconds
        name = metadata.get("name", "?") if isinstance(metadata, dict) else "?"
        if cache_hit:
            hits[name] += 1
        else:
            compiles[name] += 1
            by_step[os.environ.get("CACHEBAKE_STEP", "-")] += 1
            if times is not None:  # CompileTimes, microseconds
                compile_seconds += (times.ir_initialization + times.total_lowering
                                    + times.store_results) / 1e6

    triton.knobs.compilation.listener = listener
    cache_dir = os.environ.get("TRITON_CACHE_DIR")
    before = autotune_files(cache_dir)
    sys.argv = [module, *args]
    t0 = time.perf_counter()
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    wall = time.perf_counter() - t0
    new_autotune = sorted(autotune_files(cache_dir) - before)
    print(json.dumps({
        "module": module, "args": args, "wall_s": round(wall, 3),
        "compiles": sum(compiles.values()), "cache_hits": sum(hits.values()),
        "autotune_files_new": len(new_autotune), "compile_s": round(compile_seconds, 2),
        "compiles_by_kernel": dict(sorted(compiles.items())),
        "hits_by_kernel": dict(sorted(hits.items())),
        "compiles_by_step": dict(by_step),
    }), flush=True)


if __name__ == "__main__":
    main()
