"""The kernels driver on CPU: it imports without torch or vllm, reads a model's shapes, splits
them per TP rank as vLLM does, and plans the cases a bake needs (the GPU run is bench's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cachebake.recipes import load_recipe

NEMOTRON_H_8B_CONFIG = load_recipe("nemotron-h:8b").hf_config

from cachebake.drivers.kernels import (
    STEP_ENV,
    ModelShapes,
    chunk_metadata,
    load_shapes,
    plan_sweep,
)
from cachebake.errors import BadInput


@pytest.fixture
def nemotron() -> ModelShapes:
    return ModelShapes.from_config(NEMOTRON_H_8B_CONFIG)


def test_module_imports_and_plans_without_torch_or_vllm():
    # None in sys.modules makes `import torch` / `import vllm` raise ImportError.
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['vllm'] = None\n"
        "from cachebake.drivers import kernels as k\n"
        "print(len(k.plan_sweep(k.load_shapes('nemotron-h'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 256


def test_cli_plan_prints_labels_without_a_gpu():
    out = subprocess.run(
        [sys.executable, "-m", "cachebake.drivers.kernels", "--model", "nemotron-h", "--plan",
         "--max-num-seqs", "8"],
        capture_output=True, text=True, check=True,
    )
    labels = out.stdout.split()
    assert "decode/bs=8" in labels and "conv/offset=7/lens=100" in labels


def test_nemotron_h_8b_shapes(nemotron):
    s = nemotron
    assert (s.num_heads, s.head_dim, s.n_groups, s.d_state) == (128, 64, 8, 128)
    assert (s.conv_kernel, s.chunk_size, s.activation) == (4, 128, "silu")
    assert (s.act_dtype, s.conv_state_dtype, s.ssm_state_dtype) == ("bfloat16", "bfloat16", "float32")
    assert s.rank_intermediate == 8192
    assert s.rank_conv_dim == 8192 + 2 * 8 * 128
    assert s.rank_proj_dim == 18560  # in_proj 4096 -> 18560 in the checkpoint
    assert not s.uses_triton_gated_norm  # 8 groups: vLLM runs the gated norm as torch ops


@pytest.mark.parametrize("tp, heads, groups", [(1, 128, 8), (2, 64, 4), (4, 32, 2), (8, 16, 1)])
def test_per_rank_split(nemotron, tp, heads, groups):
    s = nemotron.with_tp(tp)
    assert (s.rank_heads, s.rank_groups) == (heads, groups)
    assert s.rank_proj_dim * tp == 18560
    assert ModelShapes.from_config(NEMOTRON_H_8B_CONFIG, tp) == s
    plan = plan_sweep(nemotron, tp=tp)
    assert plan == plan_sweep(s)


def test_refuses_tp_that_does_not_divide_heads(nemotron):
    with pytest.raises(BadInput, match="heads do not divide by tp=3"):
        ModelShapes.from_config(NEMOTRON_H_8B_CONFIG, tp=3)
    with pytest.raises(BadInput):
        plan_sweep(nemotron, tp=3)


def test_groups_split_like_vllm():
    cfg = dict(NEMOTRON_H_8B_CONFIG, n_groups=8, mamba_num_heads=64)
    with pytest.raises(BadInput, match="groups do not divide by tp=16"):
        ModelShapes.from_config(cfg, tp=16)
    one = ModelShapes.from_config(dict(NEMOTRON_H_8B_CONFIG, n_groups=1), tp=4)
    assert one.rank_groups == 1  # a single group is replicated on every rank
    assert not one.uses_triton_gated_norm
    assert ModelShapes.from_config(dict(NEMOTRON_H_8B_CONFIG, n_groups=1)).uses_triton_gated_norm


def test_generic_mamba2_config_and_config_path(tmp_path):
    cfg = {"model_type": "mamba2", "num_heads": 48, "head_dim": 64, "n_groups": 1,
           "state_size": 128, "conv_kernel": 4, "chunk_size": 256, "torch_dtype": "float16"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava_mamba2", "text_config": cfg}))
    s = load_shapes(str(tmp_path))
    assert (s.num_heads, s.d_state, s.chunk_size, s.ssm_state_dtype) == (48, 128, 256, "float16")
    with pytest.raises(BadInput, match="unknown model"):
        load_shapes(str(tmp_path / "nope"))
    with pytest.raises(BadInput, match="power of 2"):
        ModelShapes.from_config(dict(cfg, chunk_size=100))


def test_plan_covers_the_specializations_a_server_meets(nemotron):
    cases = plan_sweep(nemotron, max_num_seqs=256, max_num_batched_tokens=8192)
    labels = [c.label for c in cases]
    assert len(labels) == len(set(labels))
    c = nemotron.chunk_size
    single = {c_.seq_lens[0] for c_ in cases if c_.kind == "prefill" and len(c_.seq_lens) == 1
              and not c_.has_initial_states}
    assert {1, c - 1, c, c + 1, 2 * c - 1, 2 * c, 2 * c + 1, 8192} <= single
    assert any(c_.kind == "prefill" and len(c_.seq_lens) > 1 for c_ in cases)  # varlen batches
    # HAS_INITSTATES x final-state writes, all four
    variants = {(c_.has_initial_states, c_.final_states) for c_ in cases if c_.kind == "prefill"}
    assert variants == {(False, True), (False, False), (True, True), (True, False)}
    # chunked-prefill continuations both on and off a chunk boundary
    computed = {x for c_ in cases for x in c_.computed if x}
    assert any(x % c == 0 for x in computed) and any(x % c for x in computed)
    assert sorted(c_.conv_offset for c_ in cases if c_.kind == "conv") == list(range(8))
    decode = [c_.decode_batch for c_ in cases if c_.kind == "decode"]
    assert decode == list(range(1, 257))  # 1, every non-multiple and multiple of 16
    assert any(c_.kind == "mixed" and c_.decode_batch and c_.seq_lens for c_ in cases)


def test_plan_respects_scheduler_limits(nemotron):
    cases = plan_sweep(nemotron, max_num_seqs=24, max_num_batched_tokens=512)
    assert max(c.decode_batch for c in cases if c.kind == "decode") == 24
    for case in cases:
        assert case.num_tokens <= 512
        assert case.decode_batch + len(case.seq_lens) <= 24  # state slots in use
    with pytest.raises(BadInput):
        plan_sweep(nemotron, max_num_seqs=0)


def test_chunk_metadata_matches_vllm_chunking():
    assert chunk_metadata(128, (0,), (300,)) == ([0, 128, 256, 300], [0, 0, 0], [2])
    # a continuation 37 tokens in: the first chunk finishes the physical chunk (91 tokens)
    assert chunk_metadata(128, (37,), (129,)) == ([0, 91, 129], [0, 0], [1])
    assert chunk_metadata(128, (0, 200), (300, 57)) == (
        [0, 128, 256, 300, 356, 357], [0, 0, 0, 1, 1], [2, 4])
    assert chunk_metadata(128, (128,), (1,)) == ([0, 1], [0], [0])


def test_step_label_env_name():
    assert STEP_ENV == "CACHEBAKE_STEP"
