"""The engine-faithful checker (bench/engine_check/), its parts that run without a GPU.

* record_trace.py mirrors two pieces of Model Runner V2 (dummy batches for capture, the batch
  order); so does the kernels driver (engine_steps).  Both must equal vLLM's own functions.
* replay.py re-creates every recorded argument: on CPU, each committed trace's tensors come
  back with the recorded dtype, shape, strides, storage offset, 16-byte alignment and values.
* the committed traces belong to the stored plans they name.

Needs torch and the real vllm (the vllm venv), like tests/test_vllm_kernels_plan_vllm.py.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
vllm = pytest.importorskip("vllm", reason="the real vllm package is not installed")
torch = pytest.importorskip("torch")

CHECK = Path(__file__).resolve().parent.parent / "bench" / "engine_check"
sys.path.insert(0, str(CHECK))
import reference  # noqa: E402
import replay  # noqa: E402
import record_trace as trace_mod  # noqa: E402

from cachebake.vllm.kernels.engine_steps import Row, _dummy_rows, batch_order  # noqa: E402
from cachebake.vllm.kernels.plan.store import load_store  # noqa: E402
from cachebake.recipes import load_recipe  # noqa: E402

pytestmark = pytest.mark.vllm
TRACES = sorted((CHECK / "traces").glob("*.json.gz"))


@pytest.mark.parametrize("num_reqs,num_tokens", [(1, 1), (8, 8), (256, 264), (256, 512), (3, 1000)])
def test_dummy_batches_are_vllms(num_reqs, num_tokens):
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    batch = InputBatch.make_dummy(num_reqs, num_tokens, InputBuffers(512, 8192, torch.device("cpu")))
    want = [(0, int(n), bool(p)) for n, p in zip(batch.num_scheduled_tokens, batch.is_prefilling_np)]
    assert [int(x) for x in batch.seq_lens] == [n for _, n, _ in want]  # nothing computed
    assert trace_mod.dummy_rows(num_reqs, num_tokens) == want
    assert [(r.computed, r.scheduled, r.prefilling) for r in _dummy_rows(num_reqs, num_tokens)] == want


@pytest.mark.parametrize("q", [1, 4])
def test_batch_order_is_vllms(q):
    from vllm.v1.worker.gpu.model_runner import sort_batch_req_ids

    # (tokens, drafts) per request, in scheduler order
    reqs = [(300, 0), (1, 0), (q, q - 1), (57, 0), (2, 1 if q > 1 else 0), (1, 0), (q, 0)]
    tokens = {f"r{i}": n for i, (n, _) in enumerate(reqs)}
    drafts = {f"r{i}": [7] * d for i, (_, d) in enumerate(reqs) if d}
    want = [tokens[r] for r in sort_batch_req_ids(tokens, drafts, q)]
    # a request scheduled n > 1 tokens without drafts is prefilling; the driver reads drafts
    # off a decoding row of n > 1 tokens
    rows = [Row(10 if d else 0, n, not d and n > 1) for n, d in reqs]
    assert [r.scheduled for r in batch_order(rows, q)] == want
    items = [(f"r{i}", n, 0, bool(d), False) for i, (n, d) in enumerate(reqs)]
    items.sort(key=lambda it: (not it[3], it[1] != q, it[1]))  # record_trace.py's key
    assert [n for _, n, *_ in items] == want


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_replay_recreates_every_recorded_argument(path):
    trace = json.load(gzip.open(path, "rt"))
    mat = replay.Materializer(torch, torch.device("cpu"), fill=False)
    checked = 0

    def same(rec, value):
        nonlocal checked
        if isinstance(rec, dict) and "tensor" in rec:
            back = reference.encode(value)
            for key in ("tensor", "shape", "stride", "offset", "align16"):
                assert back[key] == rec[key], key
            if rec.get("values") is not None:
                assert back["values"] == rec["values"]
            checked += 1
        elif isinstance(rec, dict) and "object" in rec:
            for k, v in rec["object"].items():
                same(v, getattr(value, k))
        elif isinstance(rec, dict) and "dict" in rec:
            for (k, v), got in zip(rec["dict"].items(), value.values()):
                same(v, got)

    for step in trace["steps"][:60] + trace["steps"][-20:]:
        for call in step["calls"]:
            for name, rec in call["args"].items():
                same(rec, mat.value(rec))
    assert checked > 100


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_committed_traces_belong_to_the_stored_plans(path):
    trace = json.load(gzip.open(path, "rt"))
    recipe = load_recipe(trace["recipe"])
    plan = load_store(recipe.name)["variants"][recipe.variant][trace["plan_key"]]["plan"]
    assert trace["ops"] == plan["ops"] and trace["vllm_version"] == plan["vllm_version"]
    conv = plan["kv_cache"]["views"][0]
    seen_conv = False
    labels = [s["label"] for s in trace["steps"]]
    assert labels[0] == "startup/profile-run/ssd-warmup"
    assert any(x.startswith("startup/capture/FULL/") for x in labels)
    assert sum(x.startswith("serve/") for x in labels) >= 50  # traffic, not only start-up
    for step in trace["steps"]:
        for call in step["calls"]:
            if call["op"] == "causal_conv1d_update":
                stride = call["args"]["conv_state"]["stride"]
                # the paged view, handed over transposed in the "SD" layout
                assert stride[0] == conv["stride"][0] and sorted(stride[1:]) == sorted(conv["stride"][1:])
                seen_conv = True
    assert seen_conv


@pytest.fixture(scope="module")
def ops_extract(tmp_path_factory):
    """vLLM's Mamba2 ops as the GPU builder gets them (make_vllm_ops.py), from the installed
    vllm, every file checked against its RECORD."""
    import importlib.util
    import subprocess

    site = Path(importlib.util.find_spec("vllm").submodule_search_locations[0]).parent
    out = tmp_path_factory.mktemp("ops") / "vllm_ops"
    subprocess.run([sys.executable, str(CHECK.parent / "vllm_ops" / "make_vllm_ops.py"),
                    "--from-site", str(site), "--version", vllm.__version__, "--out", str(out)],
                   check=True, capture_output=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_driver_launches_every_specialization_the_engine_trace_needs(path, ops_extract):
    """Both through vLLM's ops' own host code, stopped at Triton's binder (no GPU): every
    (kernel, specialization, options) key the recorded server launches, start-up and traffic,
    is one the kernels driver's sweep launches too."""
    import subprocess

    trace = json.load(gzip.open(path, "rt"))
    env = {**os.environ, "PYTHONPATH": f"{ops_extract}:{CHECK.parent.parent}"}
    out = subprocess.run([sys.executable, str(CHECK / "offline_keys.py"), "--trace", str(path),
                          "--model", trace["recipe"]], capture_output=True, text=True, env=env,
                         cwd="/tmp")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["missing"] == 0, result
    assert result["trace_keys"] > 50 and out.returncode == 0
