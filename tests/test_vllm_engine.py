"""The vllm driver's pure parts: request plan, serve args and flags, model dir, bake record.

These run without vLLM.  What they cannot show (the engine itself on a GPU) is covered by the
vllm-marked suite as far as a CPU allows (tests/test_recipes_vllm.py) and otherwise not at all.
"""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from cachebake.cli import main
from cachebake.vllm.engine import (OFFLINE_ENV, bake_environment, bake_record,
                                           engine_kwargs, generate_at_once, run_engine_round,
                                           write_model_dir)
from cachebake.vllm.request_plan import (SAMPLING_KINDS, TOPP_KERNEL_ROWS, EngineLimits,
                                         decode_sizes, default_capture_sizes,
                                         limits_from_serve_args, plan_digest, plan_requests,
                                         token_ids)
from cachebake.errors import BadInput, CommandFailed, ExitCode
from cachebake.recipes import list_recipes, load_recipe
from cachebake.serve.command import serve_command
from cachebake.vllm.serveargs import parse_serve_args, serve_args_to_flags, validate_serve_args

RECIPES = list_recipes()


def _limits(**kw):
    base = dict(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=8192,
                capture_sizes=default_capture_sizes(64), block_size=16, prefix_caching=True,
                chunk_size=128)
    base.update(kw)
    return EngineLimits(**base)


# ---- request plan ----------------------------------------------------------------------------

@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.ref)
def test_plan_per_recipe_stays_inside_the_limits(recipe):
    lim = limits_from_serve_args(recipe.hf_config, recipe.serve_args)
    plan = plan_requests(recipe, recipe.serve_args)
    labels = [b.label for b in plan]
    assert labels[0] == "single" and "mixed" in labels and "split-prefill" in labels
    assert len(set(labels)) == len(labels)
    vocab = recipe.hf_config["vocab_size"]
    for b in plan:
        assert 1 <= b.num_requests <= lim.max_num_seqs
        prompts = b.prompts(vocab)
        assert [len(p) for p in prompts] == b.prompt_lens
        assert all(16 <= t < vocab for p in prompts for t in p)
        assert all(len(p) + b.max_tokens <= lim.max_model_len for p in prompts)
    # decode batch of 1, multiples and non-multiples of 16
    sizes = [b.num_requests for b in plan if b.label.startswith("decode-")]
    assert 1 in sizes and any(s % 16 == 0 for s in sizes) and any(s % 16 for s in sizes if s > 1)


def test_chunked_prefill_when_the_model_len_allows_it():
    r = load_recipe("nemotron-h:nano-9b-v2")  # max_model_len 32768 > 8192 tokens per step
    plan = {b.label: b for b in plan_requests(r, r.serve_args)}
    assert plan["chunked-prefill"].prompt_lens[0] > r.serve_args["max_num_batched_tokens"]
    assert plan["chunked-prefill-3"].prompt_lens[0] > 2 * r.serve_args["max_num_batched_tokens"]
    # nemotron-h:8b serves 8192 = the step budget: no single prompt can exceed it, two split
    r8 = load_recipe("nemotron-h")
    plan8 = {b.label: b for b in plan_requests(r8, r8.serve_args)}
    assert "chunked-prefill" not in plan8
    assert sum(plan8["split-prefill"].prompt_lens) > r8.serve_args["max_num_batched_tokens"]


def test_prefix_batches_follow_prefix_caching():
    r = load_recipe("nemotron-h")
    on = {b.label: b for b in plan_requests(r, {**r.serve_args, "enable_prefix_caching": True})}
    hit, seed = on["prefix-hit"], on["prefix-seed"]
    vocab = r.hf_config["vocab_size"]
    n = hit.shared_prefix
    assert n == seed.shared_prefix and n >= 32
    p_seed, p_hit = seed.prompts(vocab)[0], hit.prompts(vocab)
    assert all(p[:n] == p_seed[:n] for p in p_hit) and p_hit[0][n:] != p_hit[1][n:]
    off = [b.label for b in plan_requests(r, {**r.serve_args, "enable_prefix_caching": False})]
    assert "prefix-hit" not in off and "prefix-seed" not in off


def test_decode_sizes_go_past_the_largest_graph():
    lim = _limits(max_num_seqs=256, capture_sizes=[1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64])
    sizes = decode_sizes(lim)
    assert sizes[0] == 1 and 64 in sizes and 63 in sizes
    past = [s for s in sizes if s > 64]
    assert {65, 80, 81} <= set(past) and 256 in past
    assert all(s <= 256 for s in sizes)
    # capped by max_num_seqs
    assert max(decode_sizes(_limits(max_num_seqs=20))) == 20


def test_mixed_step_exceeds_the_largest_graph():
    lim = _limits()
    mixed = next(b for b in plan_requests({"vocab_size": 1000, "max_position_embeddings": 8192},
                                          {}, lim) if b.label == "mixed")
    assert mixed.prompt_tokens > lim.largest_capture and mixed.num_requests > 2


def test_spec_decode_batches_only_when_configured():
    r = load_recipe("nemotron-h")
    assert not [b for b in plan_requests(r, r.serve_args) if b.label.startswith("spec-")]
    sa = {**r.serve_args, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    lim = limits_from_serve_args(r.hf_config, sa)
    assert lim.num_speculative_tokens == 3
    spec = [b for b in plan_requests(r, sa) if b.label.startswith("spec-")]
    assert spec and all(b.repetitive for b in spec)
    ns = {b.num_requests for b in spec}
    assert 1 in ns and lim.largest_capture // 4 + 1 in ns
    ids = spec[0].prompts(1000)[0]
    assert ids[:5] == ids[5:10]  # a repeated n-gram: ngram drafts have something to match


def test_capture_sizes_from_serve_args():
    assert default_capture_sizes(4) == [1, 2, 4, 8]
    assert default_capture_sizes(1024)[-1] == 512
    lim = limits_from_serve_args({}, {"compilation_config": {"cudagraph_capture_sizes": [8, 1, 4]}})
    assert lim.capture_sizes == [1, 4, 8]
    lim = limits_from_serve_args({}, {"compilation_config": {"max_cudagraph_capture_size": 96}})
    assert lim.largest_capture == 96


def test_token_ids_are_deterministic_and_in_range():
    a = token_ids(500, 3, 1000)
    assert a == token_ids(500, 3, 1000) and a != token_ids(500, 4, 1000)
    assert all(16 <= t < 1000 for t in a)


# ---- serve args ------------------------------------------------------------------------------

def test_enforce_eager_is_refused():
    with pytest.raises(BadInput, match="enforce_eager") as e:
        validate_serve_args({"enforce_eager": True})
    assert e.value.code == ExitCode.BAD_INPUT
    with pytest.raises(BadInput, match="enforce_eager"):
        engine_kwargs("/models/x", {"max_num_seqs": 8, "enforce_eager": True})
    validate_serve_args({"enforce_eager": False})  # explicitly off is fine


def test_driver_owned_args_are_refused():
    for key in ("model", "load_format", "skip_tokenizer_init"):
        with pytest.raises(BadInput, match=key):
            validate_serve_args({key: "x"})


def test_engine_kwargs_are_the_serve_args_plus_dummy_weights():
    kw = engine_kwargs("/models/m", {"max_num_seqs": 8, "dtype": "bfloat16"})
    assert kw == {"model": "/models/m", "load_format": "dummy", "skip_tokenizer_init": True,
                  "max_num_seqs": 8, "dtype": "bfloat16"}


def test_flags():
    flags = serve_args_to_flags({
        "tensor_parallel_size": 2, "enable_prefix_caching": True, "enable_chunked_prefill": False,
        "block_size": None, "speculative_config": {"num_speculative_tokens": 3, "method": "ngram"},
        "mamba_ssm_cache_dtype": "float32"})
    assert flags == ["--tensor-parallel-size", "2", "--enable-prefix-caching",
                     "--no-enable-chunked-prefill", "--speculative-config",
                     '{"method":"ngram","num_speculative_tokens":3}',
                     "--mamba-ssm-cache-dtype", "float32"]


def test_parse_serve_args_both_spellings():
    want = {"max_num_seqs": 64, "enable_prefix_caching": True, "enable_chunked_prefill": False,
            "gpu_memory_utilization": 0.85, "speculative_config": {"method": "ngram"}}
    assert parse_serve_args(json.dumps(want)) == want
    text = ("--max-num-seqs 64 --enable-prefix-caching --no-enable-chunked-prefill "
            "--gpu-memory-utilization=0.85 --speculative-config '{\"method\": \"ngram\"}'")
    assert parse_serve_args(text) == want
    assert parse_serve_args(" ".join(serve_args_to_flags(want)).replace('{"method":"ngram"}',
                                                                      "'{\"method\":\"ngram\"}'")) == want
    with pytest.raises(BadInput):
        parse_serve_args("/models/x --max-num-seqs 4")
    with pytest.raises(BadInput):
        parse_serve_args("{nope")


# ---- model dir, bake record, serve-args command -----------------------------------------------

def test_model_dir_gets_the_recipe_config(tmp_path):
    r = load_recipe("nemotron-h")
    d = write_model_dir(r, tmp_path / "nemotron")
    assert d == str(tmp_path / "nemotron")  # the reference, exactly: it enters vLLM's hash
    assert json.loads((tmp_path / "nemotron" / "config.json").read_text()) == r.hf_config
    write_model_dir(r, d)  # same config again: fine
    with pytest.raises(BadInput, match="different config"):
        write_model_dir(load_recipe("mamba2"), d)
    with pytest.raises(BadInput, match="absolute"):
        write_model_dir(r, "relative/dir/x")
    assert write_model_dir(r, str(tmp_path / "slash") + "/") == str(tmp_path / "slash") + "/"


def test_bake_environment_is_offline():
    env = bake_environment({"TRITON_CACHE_DIR": "/var/cache/cachebake/triton", "HF_HUB_OFFLINE": "0"})
    assert env["TRITON_CACHE_DIR"] == "/var/cache/cachebake/triton"
    assert all(env[k] == v for k, v in OFFLINE_ENV.items())


def _manifest(tmp_path):
    r = load_recipe("nemotron-h")
    sa = {**r.serve_args, "enable_prefix_caching": True}
    serve_env = {"TRITON_CACHE_DIR": "/var/cache/cachebake/triton", "TRITON_CACHE_AUTOTUNING": "1"}
    return {"roles": ["triton", "vllm"], "fingerprint": {"env": {"TRITON_DEFAULT_FP_FUSION": "0"}},
            "bake": bake_record(r, sa, "/models/nemotron-h-8b", serve_env)}


def test_serve_command_from_a_manifest(tmp_path):
    m = _manifest(tmp_path)
    assert m["bake"]["model"]["path"] == "/models/nemotron-h-8b"
    assert m["bake"]["model"]["mamba"]["heads"] == 128
    cmd = serve_command(m)
    assert cmd.argv[:3] == ["vllm", "serve", "/models/nemotron-h-8b"]
    assert "--enable-prefix-caching" in cmd.argv and "--load-format" not in cmd.argv
    # no root recorded: the roles' variables are never the artifact's own (issue 31)
    assert "TRITON_CACHE_DIR" not in cmd.env and any("records no root" in n for n in cmd.notes)
    assert cmd.env["TRITON_DEFAULT_FP_FUSION"] == "0"
    at = serve_command(m, root="/srv/cache")
    assert at.env["TRITON_CACHE_DIR"] == "/srv/cache/triton"
    assert at.env["VLLM_CACHE_ROOT"] == "/srv/cache/vllm" and "FLASHINFER_WORKSPACE_BASE" not in at.env
    with pytest.raises(BadInput, match="not baked with the vllm driver"):
        serve_command({"bake": {"driver": "command"}})


def test_cli_serve_args_from_a_real_artifact(triton_cache, tmp_path):
    """Pack a real cache with a vllm bake record; serve-args reads it back through the OCI reader."""
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    art = tmp_path / "artifact"
    pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90",
                  bake=_manifest(tmp_path)["bake"])
    runner = CliRunner()
    res = runner.invoke(main, ["serve-args", str(art)])
    assert res.exit_code == 0, res.output
    assert "export TRITON_CACHE_DIR=/var/cache/cachebake/triton" in res.output
    assert "vllm serve /models/nemotron-h-8b " in res.output
    res = runner.invoke(main, ["serve-args", str(art), "--json", "--root", "/srv/c"])
    out = json.loads(res.output)
    assert out["env"]["TRITON_CACHE_DIR"] == "/srv/c/triton"
    # the manifest stores the serve args (key order is the manifest's); the flags mean the same
    argv = out["argv"]
    assert argv[:3] == ["vllm", "serve", "/models/nemotron-h-8b"]
    assert argv[argv.index("--max-num-seqs") + 1] == "256" and "--enable-prefix-caching" in argv
    assert "--load-format" not in argv
    res = runner.invoke(main, ["serve-args", str(tmp_path / "missing")])
    assert res.exit_code == ExitCode.BAD_INPUT


def test_serve_command_from_the_builds_driver_record():
    """`cachebake build --driver vllm` records the driver (model, tp, serve args) and the env;
    the rest is resolved the way the driver resolved it."""
    bake = {"driver": "vllm", "function": "cachebake.vllm.engine:run_warmup",
            "model": "nemotron-h:47b", "tp": 8, "serve_args": {"max_num_seqs": 64},
            "env": {"root": "/var/cache/cachebake", "roles": ["triton", "vllm"],
                    "invalidating_env_vars": {"TRITON_DEFAULT_FP_FUSION": "0"}}}
    cmd = serve_command({"bake": bake})
    assert cmd.model_path == "/models/nemotron-h-47b"
    argv = cmd.argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--max-num-seqs") + 1] == "64"
    assert argv[argv.index("--mamba-ssm-cache-dtype") + 1] == "float32"
    assert cmd.env == {"TRITON_CACHE_DIR": "/var/cache/cachebake/triton",
                       "VLLM_CACHE_ROOT": "/var/cache/cachebake/vllm",
                       "TRITON_CACHE_AUTOTUNING": "1", "TRITON_DEFAULT_FP_FUSION": "0"}
    assert cmd.notes and cmd.shell().startswith("# serve args resolved from recipe nemotron-h:47b")


def test_cli_recipes():
    runner = CliRunner()
    res = runner.invoke(main, ["recipes", "--json"])
    rows = json.loads(res.output)["recipes"]
    assert {row["recipe"] for row in rows} >= {"nemotron-h:8b", "mamba2:codestral-7b", "zamba2:7b"}
    res = runner.invoke(main, ["recipes"])
    assert res.exit_code == 0 and "NemotronHForCausalLM" in res.output


def test_round_without_vllm_fails_with_the_childs_error(tmp_path):
    """No fake engine: a python without vllm makes the round fail, with the reason in the message."""
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is importable here; the failure path needs a python without it")
    except ImportError:
        pass
    r = load_recipe("nemotron-h")
    with pytest.raises(CommandFailed, match="vllm"):
        run_engine_round(r, r.serve_args, model_dir=tmp_path / "m", env={"PATH": "/usr/bin:/bin"},
                  workdir=tmp_path / "w", python=sys.executable)
    assert json.loads((tmp_path / "w" / "spec.json").read_text())["engine_kwargs"]["load_format"] == "dummy"
    with pytest.raises(BadInput, match="enforce_eager"):
        run_engine_round(r, {"enforce_eager": True}, model_dir=tmp_path / "m", env={}, workdir=tmp_path / "w")


def test_prepare_merges_recipe_serve_args_tp_and_model_dir(tmp_path):
    from cachebake.vllm.engine import prepare

    recipe, args, mdir = prepare("nemotron-h:47b", 8, serve_args="--max-num-seqs 64 --enable-prefix-caching",
                                 model_dir=str(tmp_path / "m47"))
    assert args["tensor_parallel_size"] == 8 and args["max_num_seqs"] == 64
    assert args["enable_prefix_caching"] is True and args["mamba_ssm_cache_dtype"] == "float32"
    assert json.loads((tmp_path / "m47" / "config.json").read_text()) == recipe.hf_config
    _, args, _ = prepare("nemotron-h:47b", serve_args={"max_num_seqs": 8}, model_dir=str(tmp_path / "m2"))
    assert args["tensor_parallel_size"] == 4  # the recipe's, when tp is not given
    # a local model is baked in place: the path the server serves it from
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "config.json").write_text(json.dumps(load_recipe("mamba2").hf_config))
    _, args, mdir = prepare(str(tmp_path / "local" / "config.json"), serve_args={"max_num_seqs": 4})
    assert mdir == str((tmp_path / "local").resolve()) and args == {"max_num_seqs": 4}
    with pytest.raises(BadInput, match="enforce_eager"):
        prepare("nemotron-h", serve_args="--enforce-eager", model_dir=str(tmp_path / "m3"))


def test_bake_record_is_what_serve_args_reads(tmp_path):
    r = load_recipe("falcon-h1:3b")
    rec = bake_record(r, r.serve_args, "/models/falcon", {"TRITON_CACHE_DIR": "/c/triton"})
    assert rec["driver"] == "vllm" and rec["model"]["recipe"] == "falcon-h1:3b"
    assert rec["model"]["mamba"]["head_dim"] == 128 and len(rec["model"]["config_sha256"]) == 64
    cmd = serve_command({"bake": rec})
    # the record's own TRITON_CACHE_DIR is never exported (issue 31): no root, no role variable
    assert cmd.model_path == "/models/falcon" and cmd.env == {}
    assert cmd.flags == rec["vllm_flags"]


# ---- traffic the plan sends besides shapes ---------------------------------------------------

def test_sampling_traffic_at_sizes_of_both_divisibilities():
    lim = _limits()
    plan = plan_requests(load_recipe("nemotron-h"), {}, lim)
    sampled = {b.label: b for b in plan if b.sampling}
    kinds = {label.rsplit("-", 1)[0] for label in sampled}
    assert kinds == set(SAMPLING_KINDS)
    assert {sampled[f"sample-penalties-{n}"].num_requests for n in (1, 7, 16)} == {1, 7, 16}
    mixed = sampled["sample-mixed-16"]
    params = [mixed.sampling_for(i) for i in range(mixed.num_requests)]
    assert {"temperature": 0.0} in params and any(p.get("top_p") for p in params)
    assert all("seed" in p for p in params if p.get("temperature"))  # repeatable rounds
    assert f"sample-mixed-{lim.largest_capture + 1}" in sampled  # past the largest graph size
    greedy = next(b for b in plan if b.label == "decode-7")
    assert greedy.sampling_for(3) == {"temperature": 0.0}
    # top-p without top-k in a batch big enough for vLLM's kernel, at a BATCH_SIZE no multiple
    # of 16 (what the H200 still compiled for unseen traffic)
    topp = sampled[f"sample-top-p-{TOPP_KERNEL_ROWS}"]
    params = [topp.sampling_for(i) for i in range(topp.num_requests)]
    assert topp.num_requests > 64 and topp.num_requests % 16
    assert any(p.get("top_p") for p in params) and not any(p.get("top_k") for p in params)


def test_unseeded_sampling_only_without_drafts():
    assert any(b.label.startswith("sample-unseeded") for b in plan_requests({}, {}, _limits()))
    spec = plan_requests({}, {}, _limits(num_speculative_tokens=2))
    assert not any(b.label.startswith("sample-unseeded") for b in spec)
    assert all("seed" in b.sampling_for(i) for b in spec for i in range(b.num_requests)
               if b.sampling_for(i).get("temperature"))


def test_longest_prompt_when_nothing_else_is_as_long():
    plan = plan_requests({}, {}, _limits(max_num_batched_tokens=8192, max_model_len=8192))
    (longest,) = [b for b in plan if b.label == "longest-prompt"]
    assert longest.prompt_lens == [8184] and max(longest.prompt_lens) + longest.max_tokens <= 8192
    assert max(max(b.prompt_lens) for b in plan if b is not longest) < 8184


def test_plan_digest_pins_what_is_sent():
    lim = _limits()
    a = plan_requests(load_recipe("nemotron-h"), {}, lim)
    assert plan_digest(a, 131072) == plan_digest(plan_requests(load_recipe("nemotron-h"), {}, lim), 131072)
    a[-1].sampling = [{"temperature": 0.5, "seed": 99}]
    assert plan_digest(a, 131072) != plan_digest(plan_requests(load_recipe("nemotron-h"), {}, lim), 131072)


class _RecordingEngine:
    """A stand-in for ``LLM`` that records the calls ``generate_at_once`` makes (the real
    engine cannot start without a GPU; vLLM's own scheduler semantics of the pause are
    checked in tests/test_recipes_vllm.py)."""

    def __init__(self, utilities=True):
        self.calls = []
        self.llm_engine = type("E", (), {})()
        self.llm_engine.engine_core = self
        self.utilities = utilities

    def call_utility(self, name, *args):
        if not self.utilities:
            raise RuntimeError(f"no utility {name}")
        self.calls.append((name, *args))

    def enqueue(self, prompts, params, use_tqdm):
        self.calls.append(("enqueue", len(prompts)))

    def wait_for_completion(self, use_tqdm):
        self.calls.append(("wait",))
        return ["out"]

    def generate(self, prompts, params, use_tqdm):
        self.calls.append(("generate", len(prompts)))
        return ["out"]


def test_a_batch_is_enqueued_while_the_scheduler_is_paused():
    llm = _RecordingEngine()
    assert generate_at_once(llm, [1, 2, 3], [None] * 3) == (["out"], True)
    assert llm.calls == [("pause_scheduler", "keep", False), ("enqueue", 3),
                         ("resume_scheduler",), ("wait",)]
    old = _RecordingEngine(utilities=False)
    assert generate_at_once(old, [1], [None]) == (["out"], False)
    assert old.calls == [("generate", 1)]


def test_serve_command_keeps_the_runner_the_bake_used():
    r = load_recipe("nemotron-h")
    rec = bake_record(r, r.serve_args, "/models/n", {"TRITON_CACHE_DIR": "/c/triton",
                                                     "VLLM_USE_V2_MODEL_RUNNER": "0"})
    cmd = serve_command({"bake": rec, "roles": ["triton"]}, root="/serve")
    assert cmd.env["TRITON_CACHE_DIR"] == "/serve/triton" and cmd.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
