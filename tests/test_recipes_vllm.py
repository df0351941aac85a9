"""Recipes through vLLM's own config machinery (needs the real vllm package; CPU is enough).

``EngineArgs(model=<dir with the recipe's config.json>, load_format="dummy",
skip_tokenizer_init=True, **serve_args).create_engine_config()`` is what ``LLM(...)`` does first on
a GPU: it resolves the architecture through vLLM's model registry and parses the config with
vLLM's/transformers' config classes.  A recipe whose config vLLM would read differently (a
missing key, a renamed field) shows up here, not on the GPU builder.

Run with the vllm venv:  VLLM_TARGET_DEVICE=cpu /work/venv-vllm/bin/python -m pytest -m vllm
"""

from __future__ import annotations

import argparse
import os

import pytest

from cachebake.vllm.engine import engine_kwargs, write_model_dir
from cachebake.vllm.request_plan import (default_capture_sizes, limits_from_vllm_config,
                                         plan_requests)
from cachebake.recipes import list_recipes, load_recipe
from cachebake.vllm.serveargs import serve_args_to_flags

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
vllm = pytest.importorskip("vllm", reason="the real vllm package is not installed")

pytestmark = pytest.mark.vllm

RECIPES = list_recipes()
# Which config attribute vLLM's model code reads for each Mamba shape, per model_type.
READ_BY_VLLM = {
    "nemotron_h": {"heads": "mamba_num_heads", "head_dim": "mamba_head_dim", "groups": "n_groups",
                   "d_state": "ssm_state_size", "conv": "conv_kernel"},
    "mamba2": {"heads": "num_heads", "head_dim": "head_dim", "groups": "n_groups",
               "d_state": "state_size", "conv": "conv_kernel"},
    "granitemoehybrid": {"heads": "mamba_n_heads", "head_dim": "mamba_d_head",
                         "groups": "mamba_n_groups", "d_state": "mamba_d_state", "conv": "mamba_d_conv"},
    "falcon_h1": {"heads": "mamba_n_heads", "head_dim": "mamba_d_head", "groups": "mamba_n_groups",
                  "d_state": "mamba_d_state", "conv": "mamba_d_conv"},
    "zamba2": {"head_dim": "mamba_headdim", "groups": "mamba_ngroups", "d_state": "mamba_d_state",
               "conv": "mamba_d_conv"},
}


def _engine_config(recipe, tmp_path, **overrides):
    from vllm.engine.arg_utils import EngineArgs

    mdir = write_model_dir(recipe, tmp_path / "model")
    args = dict(recipe.serve_args, **overrides)
    # TP > 1 needs that many devices even to resolve the parallel config on this machine; the
    # model config (what this test checks) does not depend on it.
    args["tensor_parallel_size"] = 1
    return EngineArgs(**engine_kwargs(mdir, args)).create_engine_config()


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.ref for r in RECIPES])
def test_recipe_resolves_through_vllm(recipe, tmp_path):
    cfg = _engine_config(recipe, tmp_path)
    mc = cfg.model_config
    assert mc.architecture == recipe.architecture
    assert mc.max_model_len == recipe.serve_args["max_model_len"]
    assert mc.get_mamba_chunk_size() == recipe.mamba_shapes()["chunk"]
    shapes = recipe.mamba_shapes()
    for what, attr in READ_BY_VLLM[recipe.hf_config["model_type"]].items():
        assert getattr(mc.hf_config, attr) == shapes[what], (what, attr)
    assert cfg.cache_config.mamba_ssm_cache_dtype == recipe.serve_args["mamba_ssm_cache_dtype"]
    assert cfg.scheduler_config.max_num_seqs == recipe.serve_args["max_num_seqs"]
    assert cfg.scheduler_config.max_num_batched_tokens == recipe.serve_args["max_num_batched_tokens"]


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.ref for r in RECIPES])
def test_plan_from_the_resolved_engine_config(recipe, tmp_path):
    cfg = _engine_config(recipe, tmp_path)
    lim = limits_from_vllm_config(cfg, recipe.hf_config)
    assert lim.source == "engine" and lim.max_num_seqs == recipe.serve_args["max_num_seqs"]
    plan = plan_requests(recipe, recipe.serve_args, lim)
    vocab = recipe.hf_config["vocab_size"]
    for batch in plan:
        assert batch.num_requests <= lim.max_num_seqs
        for ids in batch.prompts(vocab):
            assert 0 < len(ids) < lim.max_model_len and max(ids) < vocab


def test_flags_round_trip_through_vllms_own_parser(tmp_path):
    """serve_args_to_flags must mean to `vllm serve` exactly what the bake ran with."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve_args = {
        "tensor_parallel_size": 2, "dtype": "bfloat16", "max_model_len": 8192,
        "max_num_seqs": 96, "max_num_batched_tokens": 4096, "enable_prefix_caching": True,
        "mamba_ssm_cache_dtype": "float32", "block_size": 32, "enable_chunked_prefill": False,
        "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16]},
        "speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                               "prompt_lookup_max": 4},
    }
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    mdir = write_model_dir(RECIPES[0], tmp_path / "model")
    ns = parser.parse_args(["--model", str(mdir), *serve_args_to_flags(serve_args)])
    ea = EngineArgs.from_cli_args(argparse.Namespace(**vars(ns)))
    for key, want in serve_args.items():
        got = getattr(ea, key)
        if key == "compilation_config":
            assert list(got.cudagraph_capture_sizes) == want["cudagraph_capture_sizes"]
        elif key == "speculative_config":
            assert {k: got[k] for k in want} == want
        else:
            assert got == want, key


def test_recipe_serve_flags_parse_in_vllm():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    for r in RECIPES:
        ns = parser.parse_args(["--model", "/m", *serve_args_to_flags(r.serve_args)])
        for key, want in r.serve_args.items():
            assert getattr(ns, key) == want, (r.ref, key)


@pytest.mark.slow
def test_a_round_boots_the_real_engine(tmp_path):
    """One driver round with the real vLLM: on a GPU it serves the whole plan; on a CPU-only
    machine with the CUDA wheel the engine cannot start (no CPU kernels), and the round must
    fail loudly with vLLM's own error after vLLM accepted the bake's engine arguments."""
    import json
    import sys

    from cachebake.vllm.engine import run_engine_round
    from cachebake.errors import CommandFailed
    from cachebake.recipes import load_recipe

    tiny = dict(load_recipe("nemotron-h").hf_config)  # the 8B family layout, shrunk to fit a CPU
    tiny.update(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                attention_head_dim=64, mamba_num_heads=8, mamba_head_dim=32, n_groups=2,
                ssm_state_size=16, hybrid_override_pattern="M*-", num_hidden_layers=3,
                vocab_size=1024, max_position_embeddings=2048)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps(tiny))
    recipe = load_recipe(str(tmp_path / "src"))
    serve_args = {"max_model_len": 1024, "max_num_seqs": 8, "max_num_batched_tokens": 256,
                  "dtype": "float32"}
    env = {k: v for k, v in os.environ.items()}
    try:
        report = run_engine_round(recipe, serve_args, model_dir=tmp_path / "model", env=env,
                           workdir=tmp_path / "work", python=sys.executable, timeout=400)
    except CommandFailed as e:
        log = (tmp_path / "work" / "vllm.log").read_text(errors="replace")
        assert "Initializing a V1 LLM engine" in log, str(e)  # vLLM took the engine args
        assert "load_format=dummy" in log and "skip_tokenizer_init=True" in log
        pytest.skip(f"vLLM's engine cannot run on this machine: {str(e)[-300:]}")
    assert report.startup_seconds > 0 and report.limits["source"] == "engine"
    assert [b.label for b in report.batches][0] == "single"
    assert all(b.output_tokens > 0 for b in report.batches)


def _scheduler(cfg, hasher=None):
    """vLLM's real V1 scheduler for ``cfg`` and a function adding a token-id request to it.
    One attention group stands in for the model's layers: batching and chunking decisions
    depend on the token budget and max_num_seqs, not on the layer kinds."""
    import torch
    from vllm import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    bs = cfg.cache_config.block_size
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=16, dtype=torch.float32)
    cfg.cache_config.num_gpu_blocks = 200_000
    kvc = KVCacheConfig(num_blocks=200_000, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    sched = Scheduler(cfg, kvc, StructuredOutputManager(cfg), block_size=bs)

    def add(req_id, ids, max_tokens, hasher=hasher):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        sched.add_request(Request(req_id, ids, sp, None, block_hasher=hasher))

    return sched, add


def _simulate(cfg, batches, vocab):
    """Run batches through vLLM's real V1 scheduler (no model: every scheduled request that
    finished its prompt samples one token).  Returns per batch the steps vLLM would run."""
    from vllm.v1.outputs import ModelRunnerOutput

    bs = cfg.cache_config.block_size
    hasher = None
    if cfg.cache_config.enable_prefix_caching:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        hash_fn = get_hash_fn_by_name(cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(bs, hash_fn)
    sched, add = _scheduler(cfg, hasher)
    result, cached = {}, {}
    for b_i, batch in enumerate(batches):
        for i, ids in enumerate(batch.prompts(vocab)):
            add(f"{b_i}-{i}", ids, batch.max_tokens)
        steps = []
        while sched.has_unfinished_requests():
            out = sched.schedule()
            step = {"decode": 0, "prefill": 0, "init_state_prefill": 0,
                    "tokens": out.total_num_scheduled_tokens}
            ids_, sampled = list(out.num_scheduled_tokens), []
            new = {n.req_id for n in out.scheduled_new_reqs}
            for rid in ids_:
                req = sched.requests[rid]
                start = req.num_computed_tokens - out.num_scheduled_tokens[rid]
                if rid in new:  # first scheduled: what it starts from came from the prefix cache
                    cached[batch.label] = cached.get(batch.label, 0) + start
                if start >= req.num_prompt_tokens:
                    step["decode"] += 1
                else:
                    step["prefill"] += 1
                    step["init_state_prefill"] += start > 0  # a later chunk: HAS_INITSTATES
                sampled.append([17] if req.num_computed_tokens >= req.num_prompt_tokens else [])
            sched.update_from_output(out, ModelRunnerOutput(
                req_ids=ids_, req_id_to_index={k: i for i, k in enumerate(ids_)},
                sampled_token_ids=sampled))
            steps.append(step)
        result[batch.label] = steps
    return result, cached


@pytest.mark.parametrize("ref,prefix", [("nemotron-h:8b", False), ("nemotron-h:nano-9b-v2", True)])
def test_plan_does_what_it_says_in_vllms_scheduler(ref, prefix, tmp_path):
    """The plan's claims, checked against vLLM's own scheduler with the recipe's serve args."""
    recipe = load_recipe(ref)
    serve_args = {**recipe.serve_args, "enable_prefix_caching": prefix}
    cfg = _engine_config(recipe, tmp_path, enable_prefix_caching=prefix)
    lim = limits_from_vllm_config(cfg, recipe.hf_config)
    lim.capture_sizes = default_capture_sizes(lim.max_num_seqs)  # what a GPU would capture
    plan = plan_requests(recipe, serve_args, lim)
    steps, cached = _simulate(cfg, plan, recipe.hf_config["vocab_size"])
    if prefix:
        assert cached["prefix-hit"] >= 2 * lim.block_size  # both requests hit the seeded prefix
    else:
        assert "prefix-hit" not in steps
    for batch in plan:
        s = steps[batch.label]
        pure_decode = {x["decode"] for x in s if x["prefill"] == 0}
        if batch.label.startswith("decode-"):
            assert batch.num_requests in pure_decode, (batch.label, pure_decode)
        if batch.label.startswith(("chunked-prefill", "split-prefill")):
            assert sum(x["init_state_prefill"] for x in s) >= 1, batch.label
        if batch.label == "chunked-prefill-3":
            assert sum(x["init_state_prefill"] for x in s) >= 2
    mixed = [x for x in steps["mixed"] if x["decode"] and x["prefill"]]
    assert mixed and any(x["init_state_prefill"] for x in mixed)
    assert max(x["tokens"] for x in mixed) > lim.largest_capture
    assert 1 in {x["decode"] for x in steps["single"] if x["prefill"] == 0}


def test_plan_sampling_params_pass_vllms_own_validation(tmp_path):
    """Every SamplingParams the plan sends is accepted by vLLM for the recipe's model (the
    engine validates them the same way before a request reaches the scheduler)."""
    from vllm import SamplingParams

    recipe = load_recipe("nemotron-h")
    cfg = _engine_config(recipe, tmp_path)
    lim = limits_from_vllm_config(cfg, recipe.hf_config)
    kinds = 0
    for batch in plan_requests(recipe, recipe.serve_args, lim):
        for i in range(batch.num_requests):
            sp = SamplingParams(max_tokens=batch.max_tokens, ignore_eos=True, detokenize=False,
                                **batch.sampling_for(i))
            sp.verify(cfg.model_config, cfg.speculative_config, cfg.structured_outputs_config, None)
            kinds += bool(batch.sampling)
    assert kinds > 50


def test_a_paused_scheduler_admits_the_whole_batch_in_one_step(tmp_path):
    """What generate_at_once relies on, in vLLM's own scheduler: paused with PAUSED_ALL (the
    "keep" mode of pause_scheduler), requests added meanwhile wait; resumed, the first step
    admits all of them (up to the token budget), whatever order they arrived in."""
    from vllm.v1.core.sched.interface import PauseState

    recipe = load_recipe("nemotron-h")
    cfg = _engine_config(recipe, tmp_path)
    sched, add = _scheduler(cfg)
    sched.set_pause_state(PauseState.PAUSED_ALL)
    for i in range(7):
        add(f"r{i}", list(range(100 + i, 130 + i)), 4)
        assert sched.schedule().total_num_scheduled_tokens == 0  # nothing runs while paused
    sched.set_pause_state(PauseState.UNPAUSED)
    first = sched.schedule()
    assert len(first.scheduled_new_reqs) == 7
