"""The monitor sees compiles in Inductor's compile workers and in any process where torch
probes for Triton (``importlib.util.find_spec("triton")``) before importing it.

Inductor compiles Triton kernels in a worker pool when TORCHINDUCTOR_COMPILE_THREADS > 1
(vLLM forces 1 at import, a plain ``torch.compile`` warmup under ``--driver command`` does not):
``SubprocPool`` starts ``python -m torch._inductor.compile_worker`` with the parent's
environment and ``PYTHONPATH = <torch's site-packages>:<parent's sys.path>``, so the monitor's
sitecustomize runs there; torch then probes for Triton with ``find_spec`` before importing it,
which used to use up the monitor's one-shot import hook: those compiles went unseen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import servekit

from cachebake.capture.env import AUTOLOAD_DIR
from cachebake.capture.events import read_events

REPO = Path(__file__).resolve().parent.parent
TESTS = servekit.kernels_dir()  # where every process of the session imports the test kernels
VLLM_PYTHON = os.environ.get("CACHEBAKE_VLLM_PYTHON", "")

PROBE_THEN_COMPILE = f"""
import importlib.util, sys
sys.path.insert(0, {str(TESTS)!r})
assert importlib.util.find_spec("triton") is not None   # torch's has_triton() does this
assert "triton" not in sys.modules
import aot
aot.aot_compile(None)
"""


def _env(tmp_path: Path, **extra) -> dict:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
            "PYTHONPATH": os.pathsep.join([AUTOLOAD_DIR, str(REPO), str(TESTS)]),
            "CACHEBAKE_MONITOR_LOG": str(tmp_path / "ev.jsonl"),
            "TRITON_CACHE_DIR": str(tmp_path / "triton"), **extra}


def test_a_find_spec_probe_does_not_disarm_the_monitor(tmp_path):
    r = subprocess.run([sys.executable, "-c", PROBE_THEN_COMPILE], env=_env(tmp_path),
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert [e.kind for e in read_events(tmp_path / "ev.jsonl")] == ["compile"]


@pytest.mark.vllm
@pytest.mark.skipif(not os.access(VLLM_PYTHON or "/nonexistent", os.X_OK),
                    reason="set CACHEBAKE_VLLM_PYTHON to an interpreter with torch")
def test_compiles_in_inductors_worker_pool_are_seen(tmp_path):
    """torch's own SubprocPool (TORCHINDUCTOR_COMPILE_THREADS=2) runs triton.compile in its
    workers; every compile is logged with the worker's pid."""
    r = subprocess.run([VLLM_PYTHON, "-c", "from compile_worker_job import main; main()"],
                       env=_env(tmp_path, TORCHINDUCTOR_COMPILE_THREADS="2"),
                       capture_output=True, text=True, cwd="/", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["pool"] == "SubprocPool" and result["parent"] not in result["workers"]
    events = read_events(tmp_path / "ev.jsonl")
    assert sorted((e.kind, e.pid) for e in events) == sorted(("compile", p) for p in result["workers"])
