"""The kernels driver's sweep as specialization classes (cachebake/vllm/kernels/engine_classes.py).

The pure half (no torch, no vllm): Triton's int rule against Triton's own binder, the decode
batches each path can get on any GPU, one step per class.  The proof (slow, needs torch and
vLLM's Mamba2 ops extract): the keys of every reachable engine step, through vLLM's ops' host
code stopped at Triton's real binder, are a subset of the sweep's
(bench/engine_check/reachable_keys.py)."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachebake.vllm.kernels.engine_classes import (PERSISTENT, TABLE, DecodeClass, class_step,
                                              decode_batches, decode_classes, int_class,
                                              plan_steps, reachable_steps, step_decode_class,
                                              warmup_batch_cap)
from cachebake.vllm.kernels.driver import load_plan
from cachebake.vllm.kernels.mamba_metadata import build_metadata
from cachebake.vllm.kernels.plan.store import load_store, stored_plan
from cachebake.recipes import list_recipes, load_recipe

REPO = Path(__file__).resolve().parent.parent
CHECK = REPO / "bench" / "engine_check"
# vLLM 0.33 computed this plan for `vllm serve` without --max-num-seqs on an H200: 1024
# sequences, FULL graphs up to 512, warm-up batch 969 on the estimated KV cache.
DEFAULT_SEQS_PLAN = CHECK / "plans" / "nemotron-h-8b-max-num-seqs-default.json"


def _default(ref: str):
    r = load_recipe(ref)
    return stored_plan(r, r.serve_args)


def _seqs_plan():
    return load_plan("nemotron-h", serve_args={"max_num_seqs": None}, plan=str(DEFAULT_SEQS_PLAN))[1]


@pytest.mark.parametrize("value", [0, 1, 2, 15, 16, 17, 48, 942, -16, -1, 2**31 - 16, 2**31 - 1,
                                   2**31, 2**31 + 16, 2**63 - 1, 2**63, 2**63 + 16, 2**64 - 16])
@pytest.mark.parametrize("specialize,align", [(True, True), (True, False), (False, True)])
def test_int_class_is_tritons_binder_rule(value, specialize, align):
    """The rule the classes rest on, against Triton 3.6's own specialize_impl (the C++ binder
    helper JITFunction's generated binder calls for every int argument)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    kind, key = native_specialize_impl(BaseBackend, value, False, specialize, align)
    want = "1" if kind == "constexpr" else kind + (key or "")
    assert int_class(value, specialize, align) == want


def test_warmup_batch_cap_is_the_kv_free_bound():
    plan = _default("nemotron-h:8b")
    assert plan["warmup"]["num_reqs"] == warmup_batch_cap(plan) == 256  # max_num_seqs
    seqs = _seqs_plan()
    # max_num_batched_tokens 8192 // prompt_len 2 = 4096 > 1024 sequences; the plan's own 969
    # is the KV estimate, the H200 the check ran on made 942
    assert (warmup_batch_cap(seqs), seqs["warmup"]["num_reqs"]) == (1024, 969)


def test_decode_batches_per_path():
    plan = _default("nemotron-h:8b")  # 256 sequences, FULL graphs to 256
    got = decode_batches(plan)
    assert got[PERSISTENT] == tuple(range(1, 257))  # warm-up at any KV size, captures
    assert got[TABLE] == tuple(range(1, 256))  # mixed steps leave a row for the prefill
    seqs = decode_batches(_seqs_plan())  # 1024 sequences, FULL graphs to 512
    assert seqs[PERSISTENT] == tuple(range(1, 513))
    assert seqs[TABLE] == tuple(range(1, 1025))  # eager decode-only above 512, warm-up 942


def test_every_class_has_a_sweep_step_whatever_the_launch_table():
    """With a launch-config table that puts a config on the warm-up batches a real H200 makes
    (942) and on capture size 512 only, the sweep still gets one step per class: the classes
    come from every decode-row count the engine can form, not from a sample list."""
    plan = _seqs_plan()

    def config_of(n: int):
        return "narrow" if 940 <= n <= 945 or n == 512 else ("wide" if n > 448 else "small")

    steps = plan_steps(plan, config_of)
    got = {step_decode_class(plan, s, config_of) for s in steps if not s.profiling} - {None}
    assert got == set(decode_classes(plan, config_of))
    assert DecodeClass(TABLE, "i32", "narrow") in got and DecodeClass(PERSISTENT, "i32D", "narrow") in got
    # the narrow band's table class is met at 940 rows, its persistent one by the 512 capture
    labels = {s.label for s in steps}
    assert "serve/decode-class/mixed/decodes=940" in labels
    assert "startup/capture/full/reqs=512/tokens=512" in labels


@pytest.mark.parametrize("ref", ["nemotron-h:8b", "falcon-h1:7b", "zamba2:7b"])
def test_class_steps_are_engine_steps(ref):
    plan = _default(ref)
    sched, q = plan["scheduler"], plan["spec"]["decode_query_len"]
    for cls, n in decode_classes(plan).items():
        step = class_step(plan, cls, n)
        assert step_decode_class(plan, step) == cls
        assert len(step.rows) <= sched["max_num_seqs"]
        assert step.num_tokens <= sched["max_num_batched_tokens"]
        assert all(1 <= r.scheduled for r in step.rows)
        assert all(r.scheduled <= q for r in step.rows if not r.prefilling)


def test_sweep_without_the_ops_goes_by_int_class():
    """`--list` and CPU tests plan without vLLM's tables: one step per (path, int class)."""
    plan = _default("nemotron-h:8b")
    classes = decode_classes(plan)
    assert {(c.path, c.rows) for c in classes} == {(p, r) for p in (PERSISTENT, TABLE)
                                                   for r in ("1", "i32", "i32D")}
    steps = plan_steps(plan)
    assert {step_decode_class(plan, s) for s in steps} - {None} == set(classes)


@pytest.mark.parametrize("ref", [r.ref for r in list_recipes() if r.variant])
def test_the_sweep_launches_only_what_the_engine_can(ref):
    """Every decode-row count the sweep launches is one its path can get (no invented batch)."""
    plan = _default(ref)
    if plan is None:
        pytest.skip(f"{ref}: vLLM refuses its default serve args")
    batches = {path: set(ns) for path, ns in decode_batches(plan).items()}
    for s in plan_steps(plan):
        cls = step_decode_class(plan, s)
        if cls is not None:
            assert build_metadata(plan, s).state_indices_d.shape[0] in batches[cls.path], s.label


def test_reachable_steps_span_every_warmup_batch_and_batch_size():
    plan = _default("nemotron-h:8b")
    sched = plan["scheduler"]
    steps = list(reachable_steps(plan))
    labels = [s.label for s in steps]
    assert all(x.startswith("reach/") for x in labels)
    for n in (1, 2, 17, 255, 256):
        assert f"reach/n={n}/startup/warmup-kernels/prefill/{n}x2" in labels
    decode_only = {len(s.rows) for s in steps if s.label.startswith("reach/decode/")}
    assert decode_only == set(range(1, sched["max_num_seqs"] + 1))
    mixed = {len(s.rows) - 1 for s in steps if s.label.startswith("reach/mixed/")
             and "/fresh=100" in s.label}
    assert mixed == set(range(1, sched["max_num_seqs"]))
    for s in steps:
        if s.kind != "forward":
            continue
        assert 0 < len(s.rows) <= sched["max_num_seqs"] and s.num_tokens <= max(
            sched["max_num_batched_tokens"], plan["cudagraph"]["max_capture_size"])
        assert all(r.seq_len <= sched["max_model_len"] for r in s.rows)


def test_spec_decoding_reaches_every_token_residue():
    r = load_recipe("nemotron-h:8b")
    plan = load_store(r.name)["variants"]["8b"]["tp=1,prefix=default,spec=ngram"]["plan"]
    q = plan["spec"]["decode_query_len"]
    pairs = {(len(s.rows) - 1, sum(x.scheduled for x in s.rows[:-1]) % 16)
             for s in reachable_steps(plan) if s.label.startswith("reach/mixed/") and "/fresh=1" in s.label}
    for nd in range(1, 33):
        reachable = {t % 16 for t in range(nd, nd * q + 1)}
        assert {t for d, t in pairs if d == nd} == reachable


def test_a_plan_with_another_mode_has_no_persistent_path():
    plan = copy.deepcopy(_default("zamba2:7b"))
    plan["cudagraph"]["mode"] = "PIECEWISE"
    plan["cudagraph"]["captures"]["FULL"] = []
    got = decode_batches(plan)
    assert got[PERSISTENT] == () and got[TABLE][-1] == plan["scheduler"]["max_num_seqs"]
    assert all(c.path == TABLE for c in decode_classes(plan))
    plan_steps(plan)


# -- the proof: reachable keys are a subset of the sweep's (real binder, no GPU) ----------------

def _ops_extract() -> Path | None:
    path = os.environ.get("CACHEBAKE_VLLM_OPS")
    if path and (Path(path) / "vllm" / "model_executor" / "layers" / "mamba" / "ops").is_dir():
        return Path(path)
    return None


needs_ops = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or _ops_extract() is None,
    reason="needs torch in this interpreter and CACHEBAKE_VLLM_OPS=an extract made by "
           "bench/vllm_ops/make_vllm_ops.py (vLLM 0.33's Mamba2 ops)")


@pytest.mark.slow
@needs_ops
@pytest.mark.parametrize("model,plan", [("nemotron-h:8b", None), ("nemotron-h:8b", DEFAULT_SEQS_PLAN),
                                        ("zamba2:7b", None)],
                         ids=["nemotron-h-8b", "nemotron-h-8b-1024-seqs", "zamba2-7b"])
def test_reachable_keys_are_in_the_sweep(model, plan, tmp_path):
    """Every (kernel, specialization, launch options) key any warm-up batch, decode-only or
    mixed batch size and token residue reaches, through vLLM's ops stopped at Triton's binder,
    is a key the driver's sweep launches too."""
    env = {**os.environ, "PYTHONPATH": f"{_ops_extract()}:{REPO}"}
    cmd = [sys.executable, str(CHECK / "reachable_keys.py"), "--model", model]
    if plan:
        cmd += ["--plan", str(plan)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["missing"] == 0 and result["reachable_keys"] == result["sweep_keys"]
    assert result["reachable_steps"] > 10 * result["sweep_steps"]
    if plan:  # the two launch configs of 448+ and 897+ decode rows: only this plan has them
        assert result["per_kernel"]["_selective_scan_update_kernel"]["reachable"] == 4
