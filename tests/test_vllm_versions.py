"""cachebake.vllm.versions: the one place that knows how each vLLM release names its
torch.compile cache, and what ``verify --check-only`` does with a vLLM 0.34 record (the mega AOT
hash rebuilt from factor reprs, the traced files' content, the startup plan's cache budget).

The formulas are checked against vLLM's own code by the vllm-marked tests
(tests/test_vllm_identity.py: the probe's dir names are the dirs vLLM 0.34 created)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cachebake.vllm import identity as vi
from cachebake.vllm.compile_check import COST_AOT, COST_PLAN, compare
from cachebake.vllm.versions import (FactorDicts, HashList, aot_hash_of_reprs, code_factors,
                                     hash_factors, scheme_for, version_tuple)


@pytest.mark.parametrize("version, scheme", [("0.24.0", "hash-list"), ("0.33.0", "hash-list"),
                                             ("0.34.0", "factor-dicts"), ("0.35.1.dev4+gabc", "factor-dicts"),
                                             (None, "hash-list"), ("garbage", "hash-list")])
def test_each_version_has_one_scheme(version, scheme):
    assert scheme_for(version).name == scheme
    assert version_tuple("0.34.0") == (0, 34, 0) and version_tuple(None) == ()


def test_str_of_a_factor_list_is_its_reprs_joined():
    """decorators.py names the AOT dir sha256(str(factors)); factors hold tuples (0.34's
    normalize_value), bytes and str: the reprs rebuild the same text."""
    factors = ["ab" * 32, "cd" * 32, (("hash", "x"),), "k" * 64,
               (("a", 1), ("b", (True, None))), (("c", "it's"),), "ef" * 32]
    assert aot_hash_of_reprs([repr(f) for f in factors]) == vi.aot_hash(factors)
    recorded = vi.factor_reprs(factors)
    assert [r["repr"] for r in recorded] == [repr(f) for f in factors]
    assert recorded[2]["sha256"] == hashlib.sha256(repr(factors[2]).encode()).hexdigest()
    big = vi.factor_reprs(["x" * 5000])[0]
    assert "repr" not in big and big["sha256"] == hashlib.sha256(repr("x" * 5000).encode()).hexdigest()


def test_code_hash_follows_the_version(tmp_path):
    """0.34's code factors in vLLM's own order (caching.py:38-61: sorted as Path objects, by
    parts; this order was checked against vLLM 0.34.0's get_code_factors on the same files)."""
    for rel, text in (("a.py", "A"), ("a-b/x.py", "B"), ("a/y.py", "C"), ("A/z.py", "D")):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    t = str(tmp_path)
    paths = {f"{t}/a.py", f"{t}/a-b/x.py", f"{t}/a/y.py", f"{t}/A/z.py", "<string>", f"{t}/gone.py"}
    got = code_factors(paths, vi._read_text)
    assert [e["path"] for e in got] == [f"{t}/A/z.py", f"{t}/a/y.py", f"{t}/a-b/x.py", f"{t}/a.py",
                                        f"{t}/gone.py", "<string>"]
    assert got[3] == {"path": f"{t}/a.py", "hash": hash_factors({"content": "A"})}
    assert got[4:] == [{"path": f"{t}/gone.py"}, {"path": "<string>"}]  # unreadable: the path only
    assert vi.code_hash(paths, version="0.34.0") == hash_factors({"files": got})
    assert vi.code_hash(paths, version="0.24.0") == HashList().code_hash(paths, vi._read_text)
    assert vi.code_hash(paths, version="0.24.0") != vi.code_hash(paths, version="0.34.0")
    assert FactorDicts().dir_hash("e", "c", "k", "p") is None  # 0.34 needs the factor dicts
    assert FactorDicts().dir_hash("e", "c", "k", "p", {"env": {}}) == hash_factors({"env": {}})[:10]


INDUCTOR = [(("device", "H200"),), "a1" * 32, (("max_autotune", False),), (("bundled", True),)]
MODEL_KEY = hashlib.sha256(b"0.34.0NemotronHModel.forward600").hexdigest()


def identity_034(**extra) -> dict:
    env_factors = {"VLLM_USE_AOT_COMPILE": True}
    env_hash = hash_factors(env_factors)
    factors = [env_hash, "c0" * 32, *INDUCTOR, MODEL_KEY]
    ident = {"schema": 1, "vllm_version": "0.34.0", "hash_scheme": "factor-dicts",
             "env_factors": env_factors, "env_hash": env_hash, "path_factors": {},
             "model": {"requested": "/models/n", "resolved": "/models/n", "hf_hub_cache": None},
             "config_hash": "c0" * 32, "code_hash": "d0" * 32, "compiler_hash": "e0" * 32,
             "roots": {"vllm": "/bake/site/vllm"}, "traced_files": [],
             "engine_args": {"model": "/models/n", "gpu_memory_utilization": 0.9,
                             "kv_cache_memory_bytes": None, "num_gpu_blocks_override": None},
             "aot": [{"hash": vi.aot_hash(factors), "rank": "rank_0_0",
                      "factors": [vi.factor_value(f) for f in factors],
                      "factor_reprs": vi.factor_reprs(factors)}]}
    ident.update(extra)
    return ident


def server_034(ident: dict, **changes) -> dict:
    out = {"vllm_version": "0.34.0", "env_factors": dict(ident["env_factors"]),
           "env_hash": ident["env_hash"], "engine_args": dict(ident["engine_args"]),
           "frontend_flags": [], "vllm_cache_root": None, "roots": {"vllm": "/srv/site/vllm"},
           "code_hash": "ff" * 32, "changed_files": [],
           "aot_inductor_reprs": [repr(("device", "no GPU here")), *map(repr, INDUCTOR[1:])]}
    out.update(changes)
    return out


def test_a_034_bake_at_another_install_path_is_predicted_to_load():
    """The mega AOT load checks the traced files' content, not their paths, and never reaches
    the backend dir: a moved install is no difference; the GPU's system info is the bake's."""
    ident = identity_034()
    report = compare(ident, server_034(ident), source="t", model="/models/n")
    assert report.ok, [d.line() for d in report.differences]
    assert report.predicted == {"aot": [ident["aot"][0]["hash"]]}


def test_a_034_bake_names_an_inductor_factor_and_a_changed_source_file():
    ident = identity_034()
    other = server_034(ident, aot_inductor_reprs=[repr(INDUCTOR[0]), repr("b2" * 32), *map(repr, INDUCTOR[2:])],
                       changed_files=["/srv/site/vllm/model_executor/models/nemotron_h.py"])
    report = compare(ident, other, source="t", model="/models/n")
    assert [d.factor for d in report.differences] == ["traced source files", "compiler torch_key (AOT hash)"]
    assert all(d.cost.startswith(COST_AOT) for d in report.differences)
    assert "Source code has changed" in report.differences[0].cost
    assert "aot" not in report.predicted


def test_a_startup_plan_refuses_a_server_with_another_cache_budget():
    ident = identity_034()
    here = server_034(ident, engine_args={**ident["engine_args"], "gpu_memory_utilization": 0.5})
    plan = {"enabled": True, "plans": [{"file": "startup_plan_0123456789abcdef.json",
                                        "kv_cache_memory_bytes": 80 << 30}]}
    report = compare(ident, here, source="t", model="/models/n", startup_plan=plan)
    assert [(d.factor, d.baked, d.here) for d in report.differences] == [
        ("serve arg gpu_memory_utilization", 0.9, 0.5)]
    assert report.differences[0].cost == COST_PLAN
    # no plan in the bake: the budget is vLLM's to profile, not a difference
    assert compare(ident, here, source="t", model="/models/n").ok


FACTORS_034 = Path(__file__).parent / "data" / "vllm-0.34-cpu-cache-key-factors.json.zst"


def real_factors_034() -> dict:
    import zstandard

    return json.loads(zstandard.ZstdDecompressor().decompress(FACTORS_034.read_bytes()))


def test_a_real_034_backend_dir_comes_out_of_its_four_factor_dicts():
    """vLLM 0.34.0's own file (tests/data/README.md): its dir e7ae3a48a4 and its three hashes."""
    doc = real_factors_034()
    everything = {k: doc[k] for k in ("env", "config", "code", "compiler")}
    assert FactorDicts().dir_hash("", "", "", "", everything) == "e7ae3a48a4"
    assert hash_factors(doc["config"]) == doc["config_hash"]
    assert hash_factors(doc["code"]) == doc["code_hash"]
    assert hash_factors(doc["compiler"]) == doc["compiler_hash"]
    assert HashList().dir_hash(hash_factors(doc["env"]), doc["config_hash"], doc["code_hash"],
                               doc["compiler_hash"]) != "e7ae3a48a4"  # 0.24's formula no longer


def test_a_034_tree_is_read_with_its_own_version(tmp_path):
    """``verify --check-only`` without --artifact reads vLLM's own file: 0.34's names its
    version (the config's), so no 0.24 backend dir is predicted and then found missing."""
    import zstandard

    from cachebake.vllm.compile_check import identity_from_tree

    d = tmp_path / "vllm" / "torch_compile_cache" / "e7ae3a48a4" / "rank_0_0" / "backbone"
    d.mkdir(parents=True)
    (d / "cache_key_factors.json").write_bytes(zstandard.ZstdDecompressor().decompress(FACTORS_034.read_bytes()))
    ident = identity_from_tree(str(tmp_path / "vllm"))
    assert ident["vllm_version"] == "0.34.0" and ident["backend_dirs"] == ["e7ae3a48a4/rank_0_0/backbone"]
    server = {"vllm_version": "0.34.0", "env_factors": dict(ident["env_factors"]),
              "env_hash": ident["env_hash"], "engine_args": None, "frontend_flags": [],
              "vllm_cache_root": str(tmp_path / "vllm")}
    report = compare(ident, server, source="tree", model=None, cache_root=str(tmp_path / "vllm"))
    assert report.ok, [x.line() for x in report.differences]
    assert "backend_dirs" not in report.predicted


def test_serve_arg_defaults_follow_the_release():
    from cachebake.vllm.versions import serve_arg_defaults

    # 0.24 config/cache.py:67 and 0.33 config/cache.py:215: Field(default=0.92); 0.34: None
    assert serve_arg_defaults("0.24.0") == serve_arg_defaults("0.33.0") == {"gpu_memory_utilization": 0.92}
    assert serve_arg_defaults("0.34.0") == {} and serve_arg_defaults("0.35.1") == {}
