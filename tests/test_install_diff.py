"""``cachebake diff``: real artifacts (real Triton entries compiled on CPU, the real vLLM bake of
tests/data), compared entry by entry, with the key factors that explain each change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import aot
from cachebake.artifact.oci import open_artifact
from cachebake.artifact.pack import pack_artifact, parse_root
from cachebake.cli import main
from cachebake.errors import ExitCode, NotComparable
from cachebake.install.diff import bake_entries, diff_artifacts, ir_signature, short_spec

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


@pytest.mark.parametrize("how", ["flipped", "missing", "link", "fifo"])
def test_one_declared_layer_is_equal_only_where_both_blobs_are_that_layer(bakes, tmp_path, how):
    """Both bakes declare one layer digest (no entry compared): B's blob must still be it."""
    bad = tmp_path / "bad"
    shutil.copytree(bakes["a"], bad)
    ref = open_artifact(bad).select()
    layer = bad / "blobs" / "sha256" / ref.layer_digest.split(":")[1]
    if how == "flipped":
        data = bytearray(layer.read_bytes())
        data[len(data) // 2] ^= 0xFF
        layer.write_bytes(bytes(data))
    else:
        layer.unlink()
        if how == "link":
            layer.symlink_to("/dev/zero")
        elif how == "fifo":
            os.mkfifo(layer)
    for a, b in ((bakes["a"], bad), (bad, bakes["a"])):
        r = CliRunner().invoke(main, ["diff", str(a), str(b)])
        assert r.exit_code in (ExitCode.CORRUPT, ExitCode.BAD_INPUT), r.output
        assert "Traceback" not in r.output and "equal" not in r.stdout


def test_one_declared_layer_with_a_tampered_record_is_not_equal(tmp_path):
    """Two bakes with one layer: B's compile record blob rewritten (another module named)."""
    import aot

    cache = tmp_path / "c" / "triton"
    aot.compile_in_subprocess(cache, specs=aot.SPECS[:1])
    record = {"format_version": 1, "compiles": [], "autotune": []}
    from cachebake.capture.record import CompileRecord

    a = tmp_path / "A"
    pack_artifact([parse_root(f"triton={cache}")], a, target="sm_90", record=CompileRecord.from_dict(record))
    bad = tmp_path / "B"
    shutil.copytree(a, bad)
    desc = open_artifact(bad).select().manifest.record
    blob = bad / "blobs" / "sha256" / desc["digest"].split(":")[1]
    blob.write_text(json.dumps({**record, "triton_key": "another"}))
    assert CliRunner().invoke(main, ["diff", str(a), str(a)]).exit_code == 0
    r = CliRunner().invoke(main, ["diff", str(a), str(bad)])
    assert r.exit_code == ExitCode.CORRUPT and "Traceback" not in r.output, r.output


def test_ir_signature_strips_locations():
    src = (b'module {\n  tt.func public @k(%x: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("x"(#loc)), '
           b'%n: i32 loc("n"(#loc3))) attributes {noinline = false} {\n')
    assert ir_signature(src, "k") == "%x: !tt.ptr<f32> {tt.divisibility = 16 : i32}, %n: i32"
    assert ir_signature(src, "other") is None
    spec = json.dumps({"signature": ir_signature(src, "k"), "options": {"num_warps": 4, "num_stages": 3}})
    assert short_spec(spec) == "*f32:16,i32 stages=3 warps=4"
    record_form = json.dumps({"signature": [["x", "*fp16"], ["n", "i32"], ["B", "constexpr"]],
                              "constexprs": [[[2], 128]], "options": {"num_warps": 8}})
    assert short_spec(record_form) == "*fp16,i32 [2]=128 warps=8"
    assert short_spec("not json") == "" and short_spec(None) == ""


@pytest.fixture(scope="module")
def vllm_bake(tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm")
    # tests/data, ours: GNU tar (the no-data-filter CI job runs a Python without filter=)
    subprocess.run(["tar", "-xf", str(VLLM_BAKE), "-C", str(base)], check=True)
    return base / "cachebake-nemotron-h"


def test_real_vllm_bake_entries(vllm_bake, tmp_path):
    """The H200 bake's entries as diff lists them: its kernels by specialization, its autotune
    results, its launcher helpers, vLLM's backend dir and AOT dir."""
    art = open_artifact(vllm_bake)
    ref = art.select()
    entries = bake_entries(art, ref, tmp_path / "x")
    kinds = {}
    for e in entries:
        kinds.setdefault((e.role, e.kind), []).append(e)
    inv = ref.manifest.inventory
    assert len(kinds["triton", "kernel"]) == len(inv.kernels) == 132
    assert len(kinds["triton", "autotune"]) == len(inv.autotune)
    assert [e.name for e in kinds["vllm", "compile-dir"]] == ["rank_0_0/backbone"]
    assert kinds["vllm", "compile-dir"][0].key == "torch_compile_cache/b5f17cf9b9/rank_0_0/backbone"
    assert len(kinds["vllm", "aot"]) == 1
    # specializations from the bake's own compile record where it has the kernel
    assert any("source_hash" in e.detail for e in kinds["triton", "kernel"])


def test_real_vllm_bake_flag_change_named(vllm_bake, tmp_path):
    """The H200 bake's image again, its bake record saying the server flag it was not baked for
    (--mamba-ssm-cache-dtype bfloat16), beside the same layer (what a bake with that flag
    records; its cache would differ too, which needs the GPU): diff names the flag in vLLM's
    cache_config and in the serve args."""
    from cachebake.artifact import oci
    from cachebake.artifact.manifest import BakeManifest

    other = tmp_path / "other"
    shutil.copytree(vllm_bake, other)
    art = open_artifact(other)
    ref = art.select()
    doc = ref.manifest.to_dict()
    doc["bake"]["serve_args"]["mamba_ssm_cache_dtype"] = "bfloat16"
    doc["bake"]["compile_identity"]["config_parts"]["cache_config"]["factors"]["mamba_ssm_cache_dtype"] = "bfloat16"
    manifest = BakeManifest.from_dict(doc)
    desc = oci.add_image(other, manifest)
    oci.write_index(other, [desc], {manifest.target: {"manifest_digest": desc["digest"], **manifest.to_dict()}})
    r = CliRunner().invoke(main, ["diff", str(vllm_bake), str(other), "--json"])
    assert r.exit_code == ExitCode.DIFFERENT, r.output
    d = json.loads(r.output.split("\ncachebake: error")[0])["bakes"][0]
    factors = {f["factor"]: f for f in d["factors"]}
    assert set(factors) == {"cache_config.mamba_ssm_cache_dtype", "serve_args.mamba_ssm_cache_dtype"}
    f = factors["cache_config.mamba_ssm_cache_dtype"]
    assert (f["category"], f["a"], f["b"], f["roles"]) == ("vLLM compile factors", "float32", "bfloat16", ["vllm"])
    assert factors["serve_args.mamba_ssm_cache_dtype"]["category"] == "serve flags"
    assert d["same_layer"]
    t = CliRunner().invoke(main, ["diff", str(vllm_bake), str(other)])
    assert "cache_config.mamba_ssm_cache_dtype: float32 -> bfloat16" in t.output


def test_folded_flags_named(vllm_bake, tmp_path):
    """A fold-back's bake (its bake section gains a ``folded`` entry whose vllm round packed
    dirs for --mamba-ssm-cache-dtype bfloat16, as the H200 fold of 2026-12-03 wrote) against its
    base: diff names that flag; a round that packed nothing, or serve args of another shape, name
    none (the manifest schema refuses a fold entry that is no object)."""
    from cachebake.artifact import oci
    from cachebake.artifact.manifest import BakeManifest

    other = tmp_path / "folded"
    shutil.copytree(vllm_bake, other)
    art = open_artifact(other)
    doc = art.select().manifest.to_dict()
    own = dict(doc["bake"]["serve_args"])
    doc["bake"]["folded"] = [
        {"vllm": [{"serve_args": {**own, "mamba_ssm_cache_dtype": "bfloat16"},
                   "packed": ["torch_compile_cache/fddab831d4/rank_0_0/backbone"], "not_reproduced": []},
                  {"serve_args": {**own, "max_num_seqs": 8}, "packed": [], "not_reproduced": ["x"]},
                  {"serve_args": ["forged"], "packed": ["y"]}]}]
    manifest = BakeManifest.from_dict(doc)
    desc = oci.add_image(other, manifest)
    oci.write_index(other, [desc], {manifest.target: {"manifest_digest": desc["digest"], **manifest.to_dict()}})
    r = CliRunner().invoke(main, ["diff", str(vllm_bake), str(other), "--json"])
    assert r.exit_code == ExitCode.DIFFERENT, r.output
    d = json.loads(r.output.split("\ncachebake: error")[0])["bakes"][0]
    assert [(f["factor"], f["a"], f["b"], f["category"]) for f in d["factors"]] == [
        ("folded serve_args.mamba_ssm_cache_dtype", None, ["bfloat16"], "serve flags")]
