"""``cachebake diff``: real artifacts (real Triton entries compiled on CPU, the real vLLM bake of
tests/data), compared entry by entry, with the key factors that explain each change."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import aot
from cachebake.artifact.oci import open_artifact
from cachebake.artifact.pack import pack_artifact, parse_root
from cachebake.cli import main
from cachebake.errors import ExitCode, NotComparable
from cachebake.install.diff import diff_artifacts, ir_signature

VLLM_BAKE = Path(__file__).parent / "data" / "nemotron-h-8b-vllm-0.24-sm_90-2026-12-01.artifact.tar"
EXTRA = [("clamp_kernel", {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "LIMIT": "constexpr",
                           "BLOCK": "constexpr"}, {"LIMIT": 6.0, "BLOCK": 128}, {}, {})]


def _pack(cache: Path, out: Path, target: str = "sm_90") -> Path:
    pack_artifact([parse_root(f"triton={cache}")], out, target=target)
    return out


@pytest.fixture(scope="module")
def bakes(_built_cache, tmp_path_factory):
    """A: the 5 specializations + an autotune result (conftest's cache); B: A's cache + one more
    kernel; E: the same compiles with TRITON_DEFAULT_FP_FUSION set (every key differs)."""
    base = tmp_path_factory.mktemp("diff")
    a = base / "a" / "triton"
    shutil.copytree(_built_cache, a)
    b = base / "b" / "triton"
    shutil.copytree(a, b)
    aot.compile_in_subprocess(b, specs=EXTRA)
    e = base / "e" / "triton"
    aot.compile_in_subprocess(e, extra_env={"TRITON_DEFAULT_FP_FUSION": "0"})
    return {"a": _pack(a, base / "A"), "b": _pack(b, base / "B"), "e_cache": e, "base": base}


def test_same_artifact_is_equal_exit_0(bakes):
    r = CliRunner().invoke(main, ["diff", str(bakes["a"]), str(bakes["a"]), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["ok"] and doc["equal"] and doc["bakes"][0]["same_layer"]


def test_added_kernel_listed_with_its_specialization(bakes):
    r = CliRunner().invoke(main, ["diff", str(bakes["a"]), str(bakes["b"]), "--json"])
    assert r.exit_code == ExitCode.DIFFERENT == 14, r.output
    doc = json.loads(r.output.split("\ncachebake: error")[0])
    assert not doc["ok"] and not doc["equal"]
    triton = doc["bakes"][0]["roles"]["triton"]
    assert [e["name"] for e in triton["added"]] == ["clamp_kernel"]
    assert triton["removed"] == [] and triton["changed"] == []
    # 5 kernels, 1 autotune result: the same key dirs, the same bytes
    assert triton["same"] == 6
    spec = json.loads(triton["added"][0]["specialization"])
    assert "!tt.ptr<f32>" in spec["signature"] and spec["options"]["num_warps"] == 4
    assert doc["bakes"][0]["factors"] == []
    # text view: one line per entry, the error line on stderr says it differs
    t = CliRunner().invoke(main, ["diff", str(bakes["a"]), str(bakes["b"])])
    assert t.exit_code == 14 and "+ triton kernel clamp_kernel" in t.output


def test_environment_factor_explains_every_changed_kernel(bakes, monkeypatch):
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    e = _pack(bakes["e_cache"], bakes["base"] / "E")
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    report = diff_artifacts(str(bakes["a"]), str(e))
    d = report.bakes[0]
    assert [f.factor for f in d.factors] == ["env.TRITON_DEFAULT_FP_FUSION"]
    assert d.factors[0].category == "environment" and d.factors[0].a is None
    kernels = [c for c in d.changed if c.a.kind == "kernel"]
    # the five specializations, each under another key, each explained by the variable
    assert sorted(c.a.name for c in kernels) == sorted(s[0] for s in aot.SPECS)
    assert all("key" in c.what and c.why == ["env.TRITON_DEFAULT_FP_FUSION"] for c in kernels)
    assert [x.name for x in d.removed] == ["add_kernel"] and d.removed[0].kind == "autotune"


def test_gpu_target_difference_sm90_vs_sm120(bakes, tmp_path):
    c120 = tmp_path / "c120" / "triton"
    aot.compile_in_subprocess(c120, target=("cuda", 120, 32))
    b120 = _pack(c120, tmp_path / "B120", target="sm_120")
    d = diff_artifacts(str(bakes["a"]), str(b120)).bakes[0]
    assert (d.target_a, d.target_b) == ("cuda:90", "cuda:120")
    names = {f.factor for f in d.factors}
    assert {"target", "ptxas"} <= names
    changed = {c.a.name for c in d.changed if c.a.kind == "kernel"}
    assert changed == {s[0] for s in aot.SPECS}
    assert all({"target", "ptxas"} <= set(c.why) for c in d.changed if c.a.kind == "kernel")


def test_no_bake_to_compare_is_exit_15(bakes):
    with pytest.raises(NotComparable):
        diff_artifacts(str(bakes["a"]), str(bakes["b"]), target="sm_80")
    r = CliRunner().invoke(main, ["diff", str(bakes["a"]), str(bakes["b"]), "--target", "sm_80"])
    assert r.exit_code == ExitCode.NOT_COMPARABLE == 15


def test_corrupt_blob_is_refused_as_install_would(bakes, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(bakes["b"], bad)
    ref = open_artifact(bad).select()
    layer = bad / "blobs" / "sha256" / ref.layer_digest.split(":")[1]
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    layer.write_bytes(bytes(data))
    r = CliRunner().invoke(main, ["diff", str(bakes["a"]), str(bad)])
    assert r.exit_code == ExitCode.CORRUPT and "Traceback" not in r.output


def test_ir_signature_strips_locations():
    src = (b'module {\n  tt.func public @k(%x: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("x"(#loc)), '
           b'%n: i32 loc("n"(#loc3))) attributes {noinline = false} {\n')
    assert ir_signature(src, "k") == "%x: !tt.ptr<f32> {tt.divisibility = 16 : i32}, %n: i32"
    assert ir_signature(src, "other") is None


@pytest.fixture(scope="module")
def vllm_bake(tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm")
    with tarfile.open(VLLM_BAKE) as t:
        t.extractall(base, filter="data")
    return base / "cachebake-nemotron-h"


def test_real_vllm_bake_flag_change_named(vllm_bake, tmp_path):
    """The H200 bake, repacked with the bake record of a server flag it was not baked for
    (--mamba-ssm-cache-dtype bfloat16): diff names the flag in vLLM's cache_config and the
    serve args, and lists the bake's real entries."""
    import dataclasses

    from cachebake.install import extract

    art = open_artifact(vllm_bake)
    ref = art.select()
    root = tmp_path / "root"
    limits = extract.LayerLimits.from_manifest(ref.manifest, ref.layer_size, (str(root),))
    with art.open_layer(ref) as c:
        extract.extract_to(c, limits, root)
    bake = json.loads(json.dumps(ref.manifest.bake.to_json()))
    bake["serve_args"]["mamba_ssm_cache_dtype"] = "bfloat16"
    parts = bake["compile_identity"]["config_parts"]
    parts["cache_config"]["factors"]["mamba_ssm_cache_dtype"] = "bfloat16"
    fp = {k: v for k, v in dataclasses.asdict(ref.manifest.fingerprint).items() if k != "target"}
    other = tmp_path / "other"
    pack_artifact([parse_root(f"triton={root / 'triton'}"), parse_root(f"vllm={root / 'vllm'}")],
                  other, target="sm_90", bake=bake, layer_root=ref.manifest.layer_root,
                  fingerprint_from=fp)
    report = diff_artifacts(str(vllm_bake), str(other))
    d = report.bakes[0]
    factors = {f.factor: (f.category, f.a, f.b) for f in d.factors}
    assert factors["cache_config.mamba_ssm_cache_dtype"] == ("vLLM compile factors", "float32", "bfloat16")
    assert factors["serve_args.mamba_ssm_cache_dtype"][0] == "serve flags"
    assert not report.equal
    # the same cache files: every entry of both roles is listed as the same
    assert d.added == d.removed == d.changed == []
    assert d.same["triton"] == len(list((root / "triton").iterdir()))
    assert d.same["vllm"] >= 3  # the backend dir, the AOT dir, modelinfos
