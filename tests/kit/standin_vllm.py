#!/usr/bin/env python3
"""Stands in for vLLM's CLI in the serving image of the container tests (the CI machine has no
GPU and no vLLM): `vllm serve MODEL FLAGS...` checks what a real server needs before it can
start, as the Pod `cachebake k8s` wrote gives it, then stays up as a server does:

- MODEL is a directory with a config.json (the model volume is mounted there, read-only);
- the cache TRITON_CACHE_DIR names is installed: `cachebake verify` on its root, with the
  warmup the bake ran (the AOT kernels), sees 0 compiles.

It prints one JSON line (what it was given and the verify report) and sleeps."""

import json
import os
import subprocess
import sys
import time

argv = sys.argv[1:]
if argv[:1] != ["serve"] or len(argv) < 2:
    sys.exit(f"stand-in vllm: expected `vllm serve MODEL ...`, got {argv}")
model = argv[1]
report = {"argv": argv, "model_config": None, "model_writable": None}
try:
    with open(os.path.join(model, "config.json")) as f:
        report["model_config"] = json.load(f)
except OSError as e:
    sys.exit(f"stand-in vllm: no model at {model}: {e}")
report["model_writable"] = os.access(model, os.W_OK)
root = os.path.dirname(os.environ["TRITON_CACHE_DIR"])
done = subprocess.run(["cachebake", "verify", "--cache", root, "--json", "--",
                       "python3", "/opt/cachebake-ci/aot_kernels.py"], capture_output=True, text=True)
report["verify_rc"] = done.returncode
report["verify"] = json.loads(done.stdout[done.stdout.index("{"):]) if "{" in done.stdout else done.stderr
print("STAND-IN-SERVER " + json.dumps(report), flush=True)
while True:
    time.sleep(3600)
