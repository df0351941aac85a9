#!/usr/bin/env python3
"""One kernels-driver sweep in this (fresh) process, timed and counted by cachebake's monitor.

Prints one JSON line: sweep seconds (first case start to last case end, synchronized per case:
the kernels' own time, compiles and loads included), start-up seconds (torch import, CUDA
context, buffers: the same in every run, cache or not), process seconds (interpreter start to
end), and the monitor's counts
of real compiles, file-cache hits, autotune benchmarks and helper builds.  TRITON_CACHE_DIR and
TRITON_CACHE_AUTOTUNING come from the environment, as they would for a server.

    python3 bench/timed_sweep.py --label restored --log /tmp/ev.jsonl [--model nemotron-h]
"""

from __future__ import annotations

import argparse
import json
import os
import time

T_START = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--model", default="nemotron-h")
    a = ap.parse_args()
    from cachebake.capture import monitor

    open(a.log, "w").close()  # this run's events only: the monitor appends
    monitor.activate(a.log)  # arms the taps; they go in when triton is imported
    from cachebake.vllm.kernels.driver import run_sweep

    t = time.perf_counter()
    first: list[float] = []
    run_sweep(a.model, verbose=False, on_step=lambda step: first or first.append(time.perf_counter()))
    end = time.perf_counter()
    sweep, startup = end - first[0], first[0] - t
    s = monitor.summary(a.log)
    print(json.dumps({"label": a.label, "cache": os.environ.get("TRITON_CACHE_DIR"),
                      "sweep_s": round(sweep, 3), "startup_s": round(startup, 3), "process_s": round(time.perf_counter() - T_START, 3),
                      "compiles": s.compiles, "cache_hits": s.cache_hits, "autotunes": s.autotunes,
                      "helper_builds": s.helper_builds, "uid": os.getuid()}), flush=True)


if __name__ == "__main__":
    main()
