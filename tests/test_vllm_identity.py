"""vLLM's torch.compile identity as the vllm driver records it (cachebake.vllm.identity).

Without vLLM: the hash formulas against a real bake's files (tests/data's H200 excerpt: vLLM
0.24's own cache_key_factors.json, the backend dir and the AOT dir it named), the recorded
values, what a round's probe records turn into, the hub-id model placement.

With vLLM (the ``vllm`` marker, CACHEBAKE_VLLM_PYTHON; tests/kit/vllm_identity_kit.py): real Dynamo,
vLLM's backend and Inductor on CPU, each run a fresh process: the probe sees the compile, the
load, and the miss another HOME causes, and the variables serve-args exports make it load again;
the identity of the nemotron-h recipe's engine config and ``verify --check-only``'s verdicts.

    CACHEBAKE_VLLM_PYTHON=/tmp/venv-vllm/bin/python python -m pytest -m vllm tests/test_vllm_identity.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from test_artifact_torch_paths import excerpt
from cachebake.vllm import identity as vi
from cachebake.vllm.engine import config_bytes, place_hub_config, write_model_dir
from cachebake.errors import BadInput
from cachebake.recipes import load_recipe
from cachebake.vllm.serveargs import model_reference
from cachebake.vllm.versions import version_tuple

FACTORS = "vllm/torch_compile_cache/b5f17cf9b9/rank_0_0/backbone/cache_key_factors.json"
AOT_DIR = "a81caeba2363250f00754b85433a6af692f9977a61d73995655567320d0b0d0c"
KIT = Path(__file__).parent / "kit" / "vllm_identity_kit.py"
VLLM_PYTHON = os.environ.get("CACHEBAKE_VLLM_PYTHON", "")


def needs_vllm(test):
    for mark in (pytest.mark.vllm, pytest.mark.slow,
                 pytest.mark.skipif(not os.access(VLLM_PYTHON or "/nonexistent", os.X_OK),
                                    reason="set CACHEBAKE_VLLM_PYTHON to an interpreter with vLLM")):
        test = mark(test)
    return test


def real_factors() -> dict:
    return json.loads(excerpt()[FACTORS])


# ---- the formulas, against a real bake ------------------------------------------------------

def test_the_backend_dir_of_a_real_bake_comes_out_of_its_four_hashes():
    doc = real_factors()
    env_hash = vi.hash_factors(doc["env"])
    assert vi.dir_hash(env_hash, doc["config_hash"], doc["code_hash"], doc["compiler_hash"]) == "b5f17cf9b9"
    # one factor's value away, another dir: what a server with another HOME computed
    moved = {**doc["env"], "VLLM_CONFIG_ROOT": "/home/server/.config/vllm"}
    assert vi.dir_hash(vi.hash_factors(moved), doc["config_hash"], doc["code_hash"],
                       doc["compiler_hash"]) != "b5f17cf9b9"


def test_the_aot_dir_of_a_real_bake_comes_out_of_env_config_and_forward():
    """decorators.py: sha256(str([env_hash, config_hash, _model_hash_key(forward)])); the
    forward is vLLM 0.24.0's NemotronHModel.forward, at line 592 of
    vllm/model_executor/models/nemotron_h.py (the vllm-marked test reads it from vLLM)."""
    doc = real_factors()
    key = hashlib.sha256(b"0.24.0" + b"NemotronHModel.forward" + b"592").hexdigest()
    assert vi.aot_hash([vi.hash_factors(doc["env"]), doc["config_hash"], key]) == AOT_DIR
    assert any(AOT_DIR in name for name in excerpt())


def test_recorded_values_keep_the_hash_and_hide_credentials():
    env = real_factors()["env"]
    recorded = vi.env_factor_values(env)
    assert recorded == env and vi.hash_factors(recorded) == vi.hash_factors(env)
    secret = vi.env_factor_values({**env, "VLLM_API_KEY": "s3cret"})
    assert secret["VLLM_API_KEY"].startswith("sha256:") and "s3cret" not in json.dumps(secret)
    assert secret["VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE"] == 163840  # not a credential


def test_a_factor_value_stays_small_and_shallow():
    assert vi.factor_value((1, 2, "a")) == [1, 2, "a"]
    nested = vi.factor_value(("m.Config", (("a", 1), ("b", ("x",)))))
    assert isinstance(nested, str) and json.loads(nested) == ["m.Config", [["a", 1], ["b", ["x"]]]]
    big = vi.factor_value("x" * 10_000)
    assert big.startswith("sha256:") and len(big) < 100
    assert vi.factor_value(float("inf")) == "inf"


def test_the_code_hash_is_vllms(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    want = hashlib.sha256("\n".join([str(a), "x = 1\n", str(b), "y = 2\n"]).encode()).hexdigest()
    assert vi.code_hash({str(b), str(a), "<string>"}) == want
    # an unreadable file keeps its path, as backends.py does
    gone = tmp_path / "gone.py"
    assert vi.code_hash({str(a), str(gone)}) == hashlib.sha256(
        "\n".join([str(a), "x = 1\n", str(gone)]).encode()).hexdigest()


# ---- what a round's records turn into -------------------------------------------------------

def _aot(path, existed, loaded, **kw):
    return {"event": "aot_load", "path": path, "existed": existed, "loaded": loaded, **kw}


def _backend(updated, loaded):
    return {"event": "backend", "local_cache_dir": "/c/torch_compile_cache/b5f17cf9b9/rank_0_0/backbone",
            "counters": {"num_cache_entries_updated": updated, "num_compiled_artifacts_loaded": loaded}}


def test_the_outcome_of_a_round():
    loaded = vi.torch_compile_outcome([_backend(0, 5), _aot("/c/m", True, True)])
    assert loaded["aot"] == "loaded" and loaded["graphs_loaded"] == 5
    assert vi.outcome_problem(loaded) is None
    compiled = vi.torch_compile_outcome([_aot("/c/other/model", False, False), _backend(5, 0)])
    assert compiled["aot"] == "compiled"
    assert "no AOT artifact at the path vLLM computed (/c/other/model)" in vi.outcome_problem(compiled)
    failed = vi.torch_compile_outcome([_aot("/c/m", True, False, error="RuntimeError('Source code has changed')")])
    assert "found the AOT artifact but compiled again" in vi.outcome_problem(failed)
    backend_miss = vi.torch_compile_outcome([_backend(2, 0), _aot("/c/m", True, True)])
    assert "Inductor compiled 2 graph(s)" in vi.outcome_problem(backend_miss)
    assert vi.outcome_problem(None) is None


def test_the_outcome_from_vllms_own_log_lines():
    """The lines vLLM 0.24 logs (decorators.py, backends.py), as a round's log holds them."""
    hit = ("(EngineCore pid=7) INFO 12-01 [backends.py:292] Directly load the compiled graph(s) for "
           "compile range (1, 8192) from the cache, took 0.81 s\n"
           "(EngineCore pid=7) INFO 12-01 [decorators.py:311] Directly load AOT compilation from "
           "path /var/cache/cachebake/vllm/torch_compile_cache/torch_aot_compile/a81c/rank_0_0/model\n")
    assert vi.outcome_from_log(hit) == {"source": "log", "aot": "loaded", "graphs_compiled": 0,
                                        "graphs_loaded": 1}
    miss = ("INFO [backends.py:393] Compiling a graph for compile range (1, 8192) takes 6.20 s\n"
            "INFO [decorators.py:710] saved AOT compiled function to /x/model\n")
    assert vi.outcome_from_log(miss)["aot"] == "compiled"
    assert vi.outcome_problem(vi.outcome_from_log(miss))
    assert vi.outcome_from_log("WARNING [decorators.py:321] Compiling model again due to a load "
                               "failure from /x/model, reason: EOF")["aot"] == "load-failed"


def test_probe_records_are_read_skipping_torn_lines(tmp_path):
    p = tmp_path / "probe.jsonl"
    p.write_text(json.dumps(_aot("/m", True, True)) + "\n{\"event\": \"aot_lo\n" + json.dumps({"x": 1}) + "\n")
    assert vi.read_probe(p) == [_aot("/m", True, True)]
    assert vi.read_probe(tmp_path / "none.jsonl") == []


def test_vllm_cache_dirs_reads_vllms_own_record(tmp_path):
    for name, data in excerpt().items():
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    dirs = vi.vllm_cache_dirs(str(tmp_path / "vllm"))
    doc = real_factors()
    assert dirs == [{"hash": "b5f17cf9b9", "rank": "rank_0_0", "prefix": "backbone",
                     "config_hash": doc["config_hash"], "code_hash": doc["code_hash"],
                     "compiler_hash": doc["compiler_hash"], "env_hash": vi.hash_factors(doc["env"])}]


# ---- the model reference: a path the server uses, or the hub id it serves --------------------

def test_model_reference_kinds(tmp_path, monkeypatch):
    assert model_reference("/models/x/") == ("path", "/models/x/")  # as given: it is hashed
    assert model_reference("nvidia/Nemotron-H-8B-Base-8K") == ("hub", "nvidia/Nemotron-H-8B-Base-8K")
    monkeypatch.chdir(tmp_path)
    assert model_reference("mymodel") == ("path", str(tmp_path / "mymodel"))
    assert model_reference("a/b/c") == ("path", str(tmp_path / "a/b/c"))
    (tmp_path / "org" / "name").mkdir(parents=True)
    with pytest.raises(BadInput, match="both a directory here and a Hugging Face repo id"):
        model_reference("org/name")
    for bad in ("", "a\nb", "x\0y"):
        with pytest.raises(BadInput):
            model_reference(bad)


def test_a_hub_id_gets_the_hugging_face_cache_layout(tmp_path):
    r = load_recipe("nemotron-h")
    hub = tmp_path / "hub"
    assert write_model_dir(r, "nvidia/Nemotron-H-8B-Base-8K", hub_cache=str(hub)) == "nvidia/Nemotron-H-8B-Base-8K"
    repo = hub / "models--nvidia--Nemotron-H-8B-Base-8K"
    commit = (repo / "refs" / "main").read_text()
    assert commit == hashlib.sha1(config_bytes(r.hf_config)).hexdigest()
    assert json.loads((repo / "snapshots" / commit / "config.json").read_text()) == r.hf_config
    write_model_dir(r, "nvidia/Nemotron-H-8B-Base-8K", hub_cache=str(hub))  # again: the same
    with pytest.raises(BadInput, match="different config"):
        write_model_dir(load_recipe("mamba2"), "nvidia/Nemotron-H-8B-Base-8K", hub_cache=str(hub))
    # a real snapshot named by refs/main: used as it is when its config is the recipe's
    other = hub / "models--org--real"
    (other / "refs").mkdir(parents=True)
    (other / "refs" / "main").write_text("ab" * 20)
    (other / "snapshots" / ("ab" * 20)).mkdir(parents=True)
    with pytest.raises(BadInput, match="without config.json"):
        place_hub_config(r, "org/real", hub_cache=str(hub))
    assert not (other / "snapshots" / ("ab" * 20) / "config.json").exists()
    snap = place_hub_config(r, "org/pinned", revision="cd" * 20, hub_cache=str(hub))
    assert snap == hub / "models--org--pinned" / "snapshots" / ("cd" * 20)
    with pytest.raises(BadInput, match="not a commit hash or a ref"):
        place_hub_config(r, "org/x", revision="../../etc", hub_cache=str(hub))


# ---- with real vLLM ---------------------------------------------------------------------------

def kit(*args, env: dict | None = None, home: str = "/tmp") -> object:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "VLLM_"))}
    repo = Path(__file__).resolve().parent.parent
    run_env.update(PYTHONPATH=f"{repo}:{repo / 'tests' / 'kit'}", HF_HUB_OFFLINE="1", HOME=home, **(env or {}))
    r = subprocess.run([VLLM_PYTHON, str(KIT), *map(str, args)], capture_output=True, text=True,
                       env=run_env, timeout=900, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@needs_vllm
def test_probe_sees_the_load_and_the_miss_another_home_causes(tmp_path):
    from cachebake.vllm.serveargs import identity_serve_env

    root = tmp_path / "vllm-cache"
    (tmp_path / "home-a").mkdir()
    (tmp_path / "home-b").mkdir()
    first = kit("compile", root, env={vi.PROBE_ENV: str(tmp_path / "p1.jsonl")}, home=str(tmp_path / "home-a"))
    assert first["outcome"]["aot"] == "compiled" and first["outcome"]["graphs_compiled"] >= 1
    backend = next(e for e in first["events"] if e["event"] == "backend")
    # the probe's hashes are the ones vLLM named its dirs by
    assert backend["local_cache_dir"] == f"{root}/torch_compile_cache/{backend['dir_hash']}/rank_0_0/backbone"
    aot = next(e for e in first["events"] if e["event"] == "aot_load")
    assert aot["path"] == f"{root}/torch_compile_cache/torch_aot_compile/{aot['aot_hash']}/rank_0_0/model"
    assert aot["aot_factors"][:2] == [backend["env_hash"], backend["config_hash"]]
    # 0.24 hashes two HOME-derived paths; 0.34 none (PR #47573, envs.py:2505-2511)
    since_034 = version_tuple(first["vllm"]) >= (0, 34)
    assert set(first["path_factors"]) == (set() if since_034 else {"VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH"})
    if since_034:  # the backend dir named by the four factor dicts (versions.FactorDicts)
        assert backend["scheme"] == "factor-dicts" and len(aot["aot_factor_reprs"]) == 7
        assert first["aot_rebuilt"] == aot["aot_hash"]  # what --check-only predicts, from reprs

    again = kit("compile", root, env={vi.PROBE_ENV: str(tmp_path / "p2.jsonl")}, home=str(tmp_path / "home-a"))
    assert again["outcome"]["aot"] == "loaded" and again["outcome"]["graphs_compiled"] == 0
    assert vi.outcome_problem(again["outcome"]) is None

    other_home = kit("compile", root, env={vi.PROBE_ENV: str(tmp_path / "p3.jsonl")}, home=str(tmp_path / "home-b"))
    if since_034:  # another HOME no longer moves the hash
        assert other_home["outcome"]["aot"] == "loaded"
        assert other_home["outcome"]["aot_paths"] == again["outcome"]["aot_paths"]
    else:
        assert other_home["outcome"]["aot"] == "compiled"  # the miss, on CPU
        assert other_home["outcome"]["aot_paths"] != again["outcome"]["aot_paths"]

    # what serve-args exports, derived from the bake's record: the other HOME loads again
    exported = identity_serve_env({"compile_identity": {"env_factors": first["path_factors"],
                                                        "path_factors": first["path_factors"]}})
    fixed = kit("compile", root, env={vi.PROBE_ENV: str(tmp_path / "p4.jsonl"), **exported},
                home=str(tmp_path / "home-b"))
    assert fixed["outcome"]["aot"] == "loaded" and fixed["outcome"]["graphs_compiled"] == 0


@needs_vllm
def test_identity_of_a_recipe_and_the_check_before_start(tmp_path):
    (tmp_path / "home").mkdir()
    got = kit("identity", tmp_path / "models" / "nemotron-h-8b", home=str(tmp_path / "home"))
    ident = got["bake"]["compile_identity"]
    assert ident["env_hash"] == got["vllm_env_hash"] and ident["config_hash"] == got["config_hash"]
    assert ident["model"] == {"requested": str(tmp_path / "models" / "nemotron-h-8b"),
                              "resolved": str(tmp_path / "models" / "nemotron-h-8b"), "hf_hub_cache": None}
    since_034 = version_tuple(ident["vllm_version"]) >= (0, 34)
    assert ident["path_factors"] == ({} if since_034 else
                                     {"VLLM_CONFIG_ROOT": f"{tmp_path}/home/.config/vllm",
                                      "VLLM_XLA_CACHE_PATH": f"{tmp_path}/home/.cache/vllm/xla_cache"})
    assert ident["hash_scheme"] == ("factor-dicts" if since_034 else "hash-list")
    parallel = ident["config_parts"]["parallel_config"]["factors"]
    assert parallel["tensor_parallel_size"] == 1
    assert ident["config_parts"]["model_config"]["factors"]["model"] == str(tmp_path / "models" / "nemotron-h-8b")
    assert len(json.dumps(ident)) < 256 << 10
    bake = tmp_path / "bake.json"
    bake.write_text(json.dumps(got["bake"]))
    from cachebake.vllm.serveargs import identity_serve_env

    exported = identity_serve_env(got["bake"])
    mdir = str(tmp_path / "models" / "nemotron-h-8b")
    flags = ["--tensor-parallel-size", "1", "--dtype", "bfloat16", "--max-model-len", "8192",
             "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--mamba-ssm-cache-dtype", "float32"]
    scenarios = [
        {},  # the bake's own environment, model and flags
        {"env": {"HOME": "/nonexistent"}},  # another HOME: the miss
        {"env": {"HOME": "/nonexistent", **exported}},  # ... with what serve-args exports
        {"argv": ["vllm", "serve", mdir, *flags[:1], "2", *flags[2:], "--port", "8000"]},
        {"model": "/srv/models/nemotron"},  # the model served from another path
        {"env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"}},  # a compile factor set only here
    ]
    same, home, fixed, tp, path, sampler = kit("check", bake, json.dumps(scenarios), home=str(tmp_path / "home"))
    assert same["would_hit"] and same["differences"] == []
    if since_034:  # another HOME changes nothing vLLM 0.34 hashes
        assert home["would_hit"] and home["differences"] == []
    else:
        assert [d["factor"] for d in home["differences"]] == ["env VLLM_CONFIG_ROOT", "env VLLM_XLA_CACHE_PATH"]
        assert "~9 s at every start" in home["differences"][0]["cost"]
    assert fixed["would_hit"], fixed["differences"]
    assert [d["factor"] for d in tp["differences"]] == ["serve arg tensor_parallel_size"]
    assert "parallel_config" in tp["differences"][0]["cost"] and any("--port" in u for u in tp["unchecked"])
    assert [d["factor"] for d in path["differences"]] == ["model (ModelConfig.model)"]
    assert path["differences"][0]["here"] == "/srv/models/nemotron"
    assert [d["factor"] for d in sampler["differences"]] == ["env VLLM_USE_FLASHINFER_SAMPLER"]
