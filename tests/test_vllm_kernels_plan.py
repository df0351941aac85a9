"""Engine plans without vLLM: the stored plans' shape and consistency, targets, `cachebake plan`.

That every stored plan equals what vLLM computes is tests/test_vllm_kernels_plan_vllm.py's job (it needs
the real vllm); these hold the stored data to the model configs through the one config
reader, and check the command works where vllm is not installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cachebake.vllm.kernels.driver import check_plan_matches
from cachebake.errors import BadInput, ExitCode
from cachebake.vllm.kernels.plan import PLAN_SECTIONS, SPEC_NGRAM, check_plan, gpu_target, read_plan
from cachebake.vllm.kernels.plan.store import TP_SIZES, combinations, load_store, normalized_args, stored_plan
from cachebake.recipes import list_recipes, load_recipe
from cachebake.recipes.model_keys import state_dtypes

RECIPES = list_recipes()
NO_VLLM = "import sys; sys.modules['vllm'] = None; sys.modules['torch'] = None\n"


def _entries(recipe):
    return load_store(recipe.name)["variants"][recipe.variant]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.ref)
def test_every_variant_stores_every_combination(recipe):
    entries = _entries(recipe)
    assert sorted(entries) == sorted(name for name, _ in combinations(recipe))
    assert len(entries) == 4 * len(TP_SIZES)
    default = f"tp={recipe.serve_args['tensor_parallel_size']},prefix=default,spec=off"
    assert "plan" in entries[default], f"{recipe.ref}: its own serve args are refused"
    for name, entry in entries.items():
        assert ("plan" in entry) != ("refused" in entry), name
        if "refused" in entry:
            assert entry["refused"] and "\n" not in entry["refused"]
            continue
        plan = check_plan(entry["plan"], name)
        assert plan["recipe"] == recipe.ref
        tp = plan["model"]["tensor_parallel_size"]
        assert name.startswith(f"tp={tp},") and plan["serve_args"]["tensor_parallel_size"] == tp
        assert (plan["spec"]["num_speculative_tokens"] > 0) == name.endswith("spec=ngram")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.ref)
def test_stored_plans_agree_with_the_config_reader(recipe):
    """vLLM's per-rank mixer (stored) is the config reader's, split as vLLM splits it; the
    state dtypes are the reader's resolution of the serve args."""
    for entry in _entries(recipe).values():
        if "plan" not in entry:
            continue
        plan = entry["plan"]
        check_plan_matches(recipe, plan)
        conv, ssm = state_dtypes(recipe.hf_config, plan["serve_args"])
        assert (plan["cache"]["conv_state_dtype"], plan["cache"]["ssm_state_dtype"]) == (conv, ssm)


def test_nemotron_h_8b_default_plan_is_the_engines_page():
    """The layout shared/FACTS.md read off vLLM 0.33 by hand for Nemotron-H 8B on an H200."""
    plan = stored_plan(load_recipe("nemotron-h"), load_recipe("nemotron-h").serve_args)
    kv = plan["kv_cache"]
    assert (kv["block_size"], kv["page_bytes"], kv["layout"]) == (1040, 4259840, "LBNHC")
    conv, ssm = kv["views"]
    assert (conv["shape"], conv["stride"], conv["offset_bytes"]) == ([3, 10240], [2129920, 10240, 1], 0)
    assert (ssm["dtype"], ssm["stride"], ssm["offset_bytes"]) == ("float32", [1064960, 8192, 128, 1], 61440)
    assert plan["mixer"]["in_proj_width"] == 18560 and not plan["mixer"]["gated_norm_triton"]
    # vLLM 0.33 turns prefix caching on for hybrid models: Mamba "align" mode.
    assert plan["cache"]["mamba_cache_mode"] == "align" and plan["block_table"]["width"] == 8
    assert plan["cudagraph"]["mode"] == "FULL_AND_PIECEWISE" and plan["cudagraph"]["max_capture_size"] == 512


def test_stored_plan_lookup_is_exact():
    r = load_recipe("nemotron-h")
    assert stored_plan(r, r.serve_args) is not None
    assert stored_plan(r, {**r.serve_args, "max_num_seqs": 64}) is None
    assert stored_plan(r, r.serve_args, gpu="h100") is None  # stored for the H200 class
    spec = {**r.serve_args, "speculative_config": dict(SPEC_NGRAM)}
    assert stored_plan(r, spec)["spec"]["num_speculative_tokens"] == 3


def test_stored_plan_counts_its_vllms_default_as_unset():
    """The stored plans were computed by vLLM 0.33 with gpu_memory_utilization unset, i.e. its
    0.92; the recipes now set 0.92 (vLLM 0.34's default OOMs Mamba2 prefill): the same plan."""
    r = load_recipe("nemotron-h")
    assert r.serve_args["gpu_memory_utilization"] == 0.92
    plan = stored_plan(r, r.serve_args)
    assert plan["vllm_version"] == "0.33.0" and "gpu_memory_utilization" not in plan["serve_args"]
    assert "gpu_memory_utilization 0.92" in plan["kv_cache"]["kv_cache_bytes_source"]
    unset = {k: v for k, v in r.serve_args.items() if k != "gpu_memory_utilization"}
    assert stored_plan(r, unset) is plan or stored_plan(r, unset) == plan
    assert stored_plan(r, {**r.serve_args, "gpu_memory_utilization": 0.8}) is None
    # a plan computed by 0.34 (no fixed default) keeps the value: set and unset differ there
    assert normalized_args({"gpu_memory_utilization": 0.92, "x": None}, "0.34.0") == {"gpu_memory_utilization": 0.92}
    assert normalized_args({"gpu_memory_utilization": 0.92, "x": None}, "0.33.0") == {}
    assert normalized_args({"gpu_memory_utilization": 0.92}) == {"gpu_memory_utilization": 0.92}


def test_gpu_targets():
    assert gpu_target(None)["gpu_name"] == "NVIDIA H200"
    assert gpu_target("H100")["memory_gib"] == 79.2
    assert gpu_target("96")["memory_gib"] == 96.0 and gpu_target(96)["capability"] == [9, 0]
    for bad in ("lots", "0", "-3"):
        with pytest.raises(BadInput) as e:
            gpu_target(bad)
        assert e.value.code == ExitCode.BAD_INPUT


def test_read_plan_refuses_what_is_not_a_plan(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text("{}")
    with pytest.raises(BadInput, match="format"):
        read_plan(str(p))
    p.write_text("[1")
    with pytest.raises(BadInput, match="not JSON"):
        read_plan(str(p))
    plan = stored_plan(load_recipe("zamba2"), load_recipe("zamba2").serve_args)
    p.write_text(json.dumps({"cachebake": 1, "plan": plan}))  # a `cachebake plan --json` report
    assert read_plan(str(p)) == plan
    broken = {k: v for k, v in plan.items() if k != "kv_cache"}
    p.write_text(json.dumps(broken))
    with pytest.raises(BadInput, match="lacks kv_cache"):
        read_plan(str(p))
    assert "kv_cache" in PLAN_SECTIONS


def _cli(*args, code: str = NO_VLLM):
    return subprocess.run([sys.executable, "-c", code + "from cachebake.cli import main; main()",
                           *args], capture_output=True, text=True)


def test_plan_command_without_vllm_prints_the_stored_plan():
    out = _cli("plan", "--model", "zamba2", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] and doc["command"] == "plan" and doc["source"].startswith("stored")
    assert doc["plan"]["mixer"]["activation"] == "silu"
    text = _cli("plan", "--model", "nemotron-h")
    assert text.returncode == 0 and "1040 tokens" in text.stdout and "align" in text.stdout


def test_plan_command_without_vllm_refuses_unstored_args_in_one_line():
    out = _cli("plan", "--model", "nemotron-h", "--serve-args", "--max-num-seqs 7", "--json")
    assert out.returncode == ExitCode.UNSUPPORTED
    assert json.loads(out.stdout)["error"]["kind"] == "unsupported"
    assert out.stderr.count("\n") == 1 and "vllm is not installed" in out.stderr
    assert "serve args" in out.stderr and "--gpu-memory" not in out.stderr


@pytest.mark.parametrize("gpu", ["h100", "80"])
def test_plan_on_a_gpu_the_store_lacks_blames_gpu_memory_not_the_serve_args(gpu):
    """The recipe's own serve args are stored for h200: what has no stored plan is the GPU."""
    for extra in (["--stored"], []):  # and without vllm here, the same
        out = _cli("plan", "--model", "nemotron-h", "--gpu-memory", gpu, *extra)
        assert out.returncode == ExitCode.UNSUPPORTED and out.stderr.count("\n") == 1, out.stderr
        assert f"on --gpu-memory {gpu} (stored plans are for h200)" in out.stderr
        assert "serve args" not in out.stderr


def test_a_gpu_memory_of_the_wrong_form_is_a_usage_error_naming_it():
    bad = _cli("plan", "--model", "nemotron-h", "--gpu-memory", "lots")
    assert bad.returncode == ExitCode.USAGE and bad.stderr.count("\n") == 1
    assert "--gpu-memory" in bad.stderr and "h200, h100" in bad.stderr and "Traceback" not in bad.stderr
