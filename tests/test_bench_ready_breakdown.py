"""bench/ready_breakdown.py: per-phase start-up seconds from a ``vllm serve`` log.

vLLM 0.24: real H200 server logs kept in bench/results (a baked start after install at another
path).  vLLM 0.34: an excerpt written from 0.34.0's format strings (logger.py:28-32 and the
file:line of each message in /work/notes/vllm034.md §7) -- NOT a log a real 0.34 server wrote;
the GPU run (bench/gpu_v034_serve.sh) keeps the first real one."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import ready_breakdown as rb  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def test_a_real_024_baked_start_per_phase():
    log = (RESULTS / "gpu-2026-12-01-identity" / "server-warm.log").read_text()
    b = rb.breakdown(log.splitlines())
    assert b["missing"] == []
    # the stamps of the marker lines in that log, 22:10:05 (first line) .. 22:11:13
    assert b["phases"] == {"api_import": 23.0, "engine_start": 25.0, "model_load": 5.0,
                           "torch_compile": 3.0, "profiling": 4.0, "kv_cache": 0.0,
                           "cuda_graphs": 7.0, "engine_ready": 0.0, "api_ready": 1.0}
    assert b["ready_seconds"] == 68.0 and b["ready_marker"] == "api_ready"
    assert b["reported"]["engine_init"] == 14.19 and b["reported"]["torch_compile"] == 3.06
    assert b["reported"]["model_load"] == 0.548899 and b["reported"]["cuda_graphs"] == 7.0
    assert b["flags"]["aot_loaded"] == 1 and b["flags"]["graphs_compiled"] == 0
    assert b["flags"]["graphs_loaded_from_cache"] == 1
    assert "(EngineCore)" in b["markers"]["engine_start"]


def test_the_launch_time_starts_the_first_phase():
    log = (RESULTS / "gpu-2026-12-02-recheck" / "server-moved.log").read_text().splitlines()
    plain = rb.breakdown(log)
    first = dt.datetime.fromisoformat(plain["start"]).replace(tzinfo=dt.timezone.utc).timestamp()
    launched = rb.breakdown(log, start=first - 4)  # the process ran 4 s before its first line
    assert launched["phases"]["api_import"] == plain["phases"]["api_import"] + 4
    assert launched["ready_seconds"] == plain["ready_seconds"] + 4


# vLLM 0.34.0's lines, from its format strings (not yet seen in a real log).
V034 = """\
(APIServer pid=101) INFO 12-31 23:59:50 [startup.py:30] vLLM server version 0.34.0, serving model /models/nemotron-h-8b
(APIServer pid=101) INFO 12-31 23:59:50 [startup.py:96] non-default args: {'model': '/models/nemotron-h-8b'}
(EngineCore pid=202) INFO 12-31 23:59:58 [core.py:154] Initializing a V1 LLM engine (v0.34.0) with config: model='/models/nemotron-h-8b'
(EngineCore pid=202) INFO 01-01 00:00:01 [default_loader.py:544] Loading weights took 0.40 seconds
(EngineCore pid=202) INFO 01-01 00:00:02 [model_runner.py:442] Model loading took 15.11 GiB memory and 0.612345 seconds
(EngineCore pid=202) INFO 01-01 00:00:03 [caching.py:368] reconstructed serializable fn from standalone compile artifacts. num_artifacts=3 num_submods=52
(EngineCore pid=202) INFO 01-01 00:00:03 [decorators.py:326] Directly load AOT compilation from path /srv/cb/vllm/torch_compile_cache/torch_aot_compile/ab/rank_0_0/model
(EngineCore pid=202) INFO 01-01 00:00:03 [monitor.py:20] torch.compile took 1.20 s in total
(EngineCore pid=202) INFO 01-01 00:00:04 [startup_plan.py:154] Applying persisted startup plan (fingerprint 0123456789abcdef): kv_cache_memory_bytes=120000000000 (111.76 GiB), recorded free-memory baseline 139.00 GiB, current 139.10 GiB. Memory profiling will be skipped.
(EngineCore pid=202) INFO 01-01 00:00:05 [gpu_worker.py:696] Initial free memory 139.10 GiB, reserved 111.76 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. This does not respect the gpu_memory_utilization config.
(EngineCore pid=202) INFO 01-01 00:00:05 [kv_cache_utils.py:1157] GPU KV cache size: 4,122,916 tokens, Maximum concurrency for 8,192 tokens per request: 503.29x
(EngineCore pid=202) INFO 01-01 00:00:11 [model_runner.py:1216] Graph capturing finished in 6 secs, took 0.49 GiB
(EngineCore pid=202) INFO 01-01 00:00:11 [core.py:440] init engine (profile, create kv cache, warmup model) took 9.80 s (compilation: 1.20 s)
(APIServer pid=101) INFO 01-01 00:00:12 [entry.py:139] Starting vLLM server on http://127.0.0.1:8000
(APIServer pid=101) INFO:     Application startup complete.
"""


def test_vllm_034_lines_from_its_format_strings_across_new_year():
    b = rb.breakdown(V034.splitlines(), year=2026)
    assert b["missing"] == []
    assert b["phases"] == {"api_import": 0.0, "engine_start": 8.0, "model_load": 4.0,
                           "torch_compile": 1.0, "profiling": 2.0, "kv_cache": 0.0,
                           "cuda_graphs": 6.0, "engine_ready": 0.0, "api_ready": 1.0}
    assert b["ready_seconds"] == 22.0  # 23:59:50 -> 00:00:12 the next year
    assert b["flags"]["startup_plan_applied"] == 1 and b["flags"]["mega_artifact"] == 1
    assert b["reported"]["weights_load"] == 0.4 and b["reported"]["engine_init"] == 9.8


def test_a_log_without_vllm_records_says_so():
    assert rb.breakdown(["hello", "Traceback (most recent call last):"])["error"]
    assert rb.main([str(ROOT / "README.md")]) == 1


@pytest.mark.parametrize("line", [
    "\x1b[32mINFO\x1b[0m 12-01 22:11:12 [core.py:337] init engine (profile, create kv cache, warmup model) took 14.19 s",
    "(EngineCore_DP0 pid=7) INFO 12-01 22:11:12 [core.py:337] init engine (profile, create kv cache, warmup model) took 14.19 s",
    "myprefix (EngineCore pid=7) INFO 12-01 22:11:12.123 [core.py:337] init engine (profile, create kv cache, warmup model) took 14.19 s"])
def test_the_record_forms_of_both_versions(line):
    (r,) = rb.records([line])
    assert r["msg"].startswith("init engine") and r["t"].second == 12
