"""The kernels driver on CPU: engine steps and their metadata from every stored engine plan.

The GPU half (mamba2_ops) is exercised against vLLM's own layer in tests/test_vllm_kernels_plan_vllm.py
and on a GPU by bench/gpu_engine_proof.sh; these need neither torch nor vllm."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cachebake.capture.env import STEP_ENV
from cachebake.vllm.kernels.engine_classes import plan_steps
from cachebake.vllm.kernels.engine_steps import Row, Step, alignment_periods, decode_shapes
from cachebake.vllm.kernels.driver import check_plan_matches
from cachebake.vllm.kernels.mamba_metadata import build_metadata, chunk_metadata
from cachebake.errors import BadInput, ExitCode, UsageError
from cachebake.vllm.kernels.plan.store import load_store, stored_plan
from cachebake.recipes import list_recipes, load_recipe

NO_TORCH = "import sys; sys.modules['torch'] = None; sys.modules['vllm'] = None\n"


def _all_plans():
    out = []
    for r in list_recipes():
        for name, entry in load_store(r.name)["variants"][r.variant].items():
            if "plan" in entry:
                out.append(pytest.param(entry["plan"], id=f"{r.ref}/{name}"))
    return out


def _default(ref: str):
    r = load_recipe(ref)
    return stored_plan(r, r.serve_args)


def _run(*args, code: str = NO_TORCH):
    return subprocess.run([sys.executable, "-c", code + "from cachebake.vllm.kernels.driver import main; "
                           "sys.exit(main(sys.argv[1:]))", *args], capture_output=True, text=True)


def test_lists_engine_steps_without_torch_or_vllm():
    out = _run("--model", "nemotron-h", "--list")
    assert out.returncode == 0, out.stderr
    labels = out.stdout.split()
    assert labels[0] == "#" and "startup/profile-run/ssd-warmup/init=1/final=1" in labels
    assert "startup/warmup-kernels/prefill/256x2" in labels
    assert any(x.startswith("serve/mixed/decodes=3/") for x in labels)
    assert any(x.startswith("serve/prefix/checkpoint/") for x in labels)


def test_unstored_serve_args_without_vllm_is_one_line():
    out = _run("--model", "nemotron-h", "--serve-args", "--max-num-seqs 64", "--list")
    assert out.returncode == ExitCode.UNSUPPORTED
    assert out.stderr.count("\n") == 1 and "cachebake plan" in out.stderr


@pytest.mark.parametrize("plan", _all_plans())
def test_every_stored_plan_plans_a_sweep(plan):
    """Every recipe variant x TP x prefix caching x speculative decoding: the steps are ones
    the scheduler can form, and vLLM's builder logic turns each into consistent metadata."""
    steps = plan_steps(plan)
    sched, spec, cg = plan["scheduler"], plan["spec"], plan["cudagraph"]
    labels = [s.label for s in steps]
    assert len(labels) == len(set(labels))
    assert sum(s.kind == "ssd_warmup" for s in steps) == 4
    captures = [s for s in steps if s.label.startswith("startup/capture/")]
    assert len(captures) == len(cg["captures"]["PIECEWISE"]) + len(cg["captures"]["FULL"])
    q, table_cols = spec["decode_query_len"], None
    for s in steps:
        if s.kind != "forward":
            continue
        assert 0 < len(s.rows) <= sched["max_num_seqs"]
        assert s.num_tokens <= max(sched["max_num_batched_tokens"], cg["max_capture_size"])
        assert all(r.seq_len <= sched["max_model_len"] for r in s.rows)
        m = build_metadata(plan, s)
        assert m.num_decodes + m.num_prefills == len(s.rows) and m.num_actual_tokens == s.num_tokens
        if m.state_indices_p is not None:
            table_cols = m.state_indices_p.stride[0]
            assert m.state_indices_p.offset == m.num_decodes * table_cols
        if m.num_prefills == 0 and m.num_decodes <= cg["decode_cudagraph_max_bs"]:
            # decode-only: the builder's persistent (max_bs, 1 + k) buffer
            assert m.state_indices_d.stride == (q, 1) and m.state_indices_d.buffer == cg["decode_cudagraph_max_bs"] * q
        if m.checkpoint is not None:
            rows = s.rows[m.num_decodes:]
            for r, off in zip(rows, m.checkpoint.offsets.values):
                assert off == 0 or 0 < off < r.scheduled
    serve = [s.label for s in steps if s.phase == "serve"]
    align = plan["cache"]["mamba_cache_mode"] == "align"
    assert any("/prefix/checkpoint/" in x for x in serve) == align
    assert any(x.startswith("serve/spec/") for x in serve) == (spec["num_speculative_tokens"] > 0)


def test_mixed_steps_meet_every_index_alignment_class():
    plan = _default("nemotron-h:8b")
    offsets = set()
    for s in plan_steps(plan):
        if s.label.startswith("serve/mixed/decodes="):
            m = build_metadata(plan, s)
            offsets.add(m.state_indices_p.offset * 4 % 16)
    assert offsets == {0, 4, 8, 12}  # table[num_decodes:, 0] of an int32 table one column wide


def test_decode_shapes_cover_token_classes_for_an_odd_width():
    r = load_recipe("falcon-h1:7b")
    plan = load_store(r.name)["variants"]["7b"]["tp=4,prefix=default,spec=ngram"]["plan"]
    assert plan["mixer"]["in_proj_width"] == 2054  # 4108 bytes a row: 16-byte class moves by 4
    rows_p, tok_p = alignment_periods(plan)
    assert (rows_p, tok_p) == (1, 4)
    seen = {(len(sh), sum(sh) % tok_p) for sh in decode_shapes(plan)}
    assert {t for _, t in seen} == {0, 1, 2, 3}
    assert all(1 <= t <= plan["spec"]["decode_query_len"] for sh in decode_shapes(plan) for t in sh)


def test_piecewise_captures_above_max_num_seqs_run_prefills():
    """InputBatch.make_dummy spreads a capture size over at most max_num_seqs requests: 264
    tokens on 256 requests is 248 decodes and 8 two-token prefills; 512 is all prefills."""
    plan = _default("nemotron-h:8b")
    by_label = {s.label: s for s in plan_steps(plan)}
    m = build_metadata(plan, by_label["startup/capture/piecewise/tokens=272"])
    assert (m.num_decodes, m.num_prefills, m.num_prefill_tokens) == (240, 16, 32)
    m = build_metadata(plan, by_label["startup/capture/piecewise/tokens=512"])
    assert (m.num_decodes, m.num_prefills) == (0, 256)
    m = build_metadata(plan, by_label["startup/capture/full/reqs=8/tokens=8"])
    assert m.num_prefills == 0 and m.state_indices_d.shape == (8, 1)


def test_long_prefill_checkpoints_on_a_block_boundary():
    plan = _default("nemotron-h:8b")
    step = Step("x", "serve", rows=(Row(0, 3000, True),))
    m = build_metadata(plan, step)
    assert m.checkpoint.offsets.values == (2080,)  # two 1040-token blocks, proof block left
    assert 2080 in m.cu_chunk_seqlens.values  # a chunk ends on it
    assert m.checkpoint.chunk_idx.dtype == "int64"
    none_mode = load_store("nemotron-h")["variants"]["8b"]["tp=1,prefix=flipped,spec=off"]["plan"]
    assert build_metadata(none_mode, step).checkpoint is None


def test_chunk_metadata_matches_vllm_chunking():
    assert chunk_metadata(128, [0], [300])[:3] == ([0, 128, 256, 300], [0, 0, 0], [2])
    # a continuation 37 tokens in: the first chunk finishes the physical chunk (91 tokens)
    assert chunk_metadata(128, [37], [129])[:3] == ([0, 91, 129], [0, 0], [1])
    assert chunk_metadata(128, [0, 200], [300, 57])[:3] == (
        [0, 128, 256, 300, 356, 357], [0, 0, 0, 1, 1], [2, 4])
    # a checkpoint 200 tokens into a 300-token prefill ends a chunk there
    cu, idx, last, ckpt = chunk_metadata(128, [0], [300], [200])
    assert cu == [0, 128, 200, 256, 300] and ckpt == [1] and last == [3]


def test_a_plan_for_another_model_is_refused():
    plan = _default("nemotron-h:8b")
    with pytest.raises(BadInput, match="not for granite-4.0-h:tiny"):
        check_plan_matches(load_recipe("granite-4.0-h:tiny"), plan)
    check_plan_matches(load_recipe("nemotron-h:8b"), plan)


def test_zamba2_plans_and_steps():
    plan = _default("zamba2")
    assert plan["mixer"]["activation"] == "silu" and plan["mixer"]["n_groups"] == 2
    assert len(plan_steps(plan)) > 50


def test_step_label_env_name():
    assert STEP_ENV == "CACHEBAKE_STEP"


def test_a_plan_file_reaches_the_driver(tmp_path):
    import json

    from cachebake.vllm.kernels.driver import load_plan
    from cachebake.drivers.registry import make_driver

    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"cachebake": 1, "command": "plan", "plan": _default("zamba2")}))
    drv = make_driver("kernels", None, model="zamba2", plan=str(path))
    assert drv.kwargs == {"model": "zamba2", "plan": str(path)}
    recipe, plan, source = load_plan("zamba2", plan=str(path))
    assert plan == _default("zamba2") and source == f"file {path}"
    with pytest.raises(BadInput, match="not for nemotron-h:8b"):
        load_plan("nemotron-h", plan=str(path))
    with pytest.raises(BadInput, match="max_num_seqs 256 \\(plan\\) vs 64 \\(bake\\)"):
        load_plan("zamba2", serve_args={"max_num_seqs": 64}, plan=str(path))
    with pytest.raises(UsageError, match="for --driver kernels"):
        make_driver("vllm", None, model="zamba2", plan=str(path))
    with pytest.raises(BadInput, match="no such engine plan"):
        make_driver("kernels", None, model="zamba2", plan=str(tmp_path / "nope.json"))
