"""Fold-back of the vllm role on this CPU machine: the plan, the stop (exit 7: no vLLM, no GPU)
and the packing of what a round wrote.

The round itself runs vLLM on a GPU (bench/gpu_fold_vllm.sh, for the lead).  Here: the plan of
`replay --base ART --misses LOG --dry-run` from real miss lines (written by the exit hook over
a real installed vllm role), the flags a log may not hand a round, and ``take_round_units``
on an artifact packed from a torch.compile tree (its bytes opaque, as the round's are).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_serve_vllm_misses import (BAKE_ROOT, BAKE_SECTION, BAKED_BACKEND, NEW_AOT, NEW_BACKEND,
                                    SERVER_ARGV, serve_with_new_flag, vllm_tree, write_unit)
from test_serve_vllm_misses import base_art, served  # noqa: F401 - fixtures

from cachebake.artifact.pack import CacheRoot, pack_artifact
from cachebake.cli import main
from cachebake.replay import vllm_fold
from cachebake.replay.misses import merge, misses_of
from cachebake.serve import vllm_misses as vm


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def logged(served, tmp_path, monkeypatch) -> Path:
    serve_with_new_flag(served)
    log = tmp_path / "overlay" / "misses.jsonl"
    with monkeypatch.context() as m:
        m.setenv("VLLM_CACHE_ROOT", str(served))
        m.setenv("CACHEBAKE_MISS_LOG", str(log))
        m.setattr(sys, "argv", SERVER_ARGV)
        vm.record_at_exit()
    return log


def test_dry_run_plans_one_round_with_the_logged_flags(base_art, logged, tmp_path):
    out = tmp_path / "next"
    r = run("replay", "--base", base_art, "--misses", logged, "--out", out, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["dry_run"] is True and not out.exists()
    [rnd] = doc["vllm"]
    assert rnd["status"] == "dry-run"
    assert sorted(u["dir"] for u in rnd["units"]) == sorted([NEW_BACKEND, NEW_AOT])
    argv = rnd["argv"]
    assert argv[:6] == ["cachebake", "build", "--model", "nemotron-h", "--driver", "vllm"]
    assert argv[argv.index("--seed") + 1] == str(base_art) and "--no-until-stable" in argv
    assert argv[argv.index("--serve-args") + 1] == "--max-num-seqs 64 --mamba-ssm-cache-dtype bfloat16"
    assert argv[argv.index("--model-dir") + 1] == "/models/nemotron-h-8b"
    assert argv[argv.index("--layer-root") + 1] == BAKE_ROOT
    text = run("replay", "--base", base_art, "--misses", logged, "--out", out, "--dry-run")
    assert text.exit_code == 0 and "vllm round (dry-run): 2 torch.compile dirs" in text.output


def test_without_vllm_and_a_gpu_it_stops_with_exit_7_writing_nothing(base_art, logged, tmp_path):
    out = tmp_path / "next"
    r = run("replay", "--base", base_art, "--misses", logged, "--out", out, "--json")
    assert r.exit_code == 7, r.output
    err = json.loads(r.stdout)["error"]
    assert "vllm fold round" in err["message"] and "vLLM (pip install vllm)" in err["message"]
    assert "--dry-run" in err["message"]
    assert not out.exists() and not list(tmp_path.glob(".next*"))


def test_flags_that_load_code_or_name_places_are_not_folded(base_art, logged, tmp_path):
    lines = [json.loads(x) for x in logged.read_text().splitlines()]
    forged = tmp_path / "forged.jsonl"
    lines[0]["serve_args"] = {"trust_remote_code": True}
    lines[1]["serve_args"] = {"max_num_seqs": "$(reboot)"}
    forged.write_text("".join(json.dumps(e) + "\n" for e in lines))
    r = run("replay", "--base", base_art, "--misses", forged, "--out", tmp_path / "n", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["vllm"] == []
    reasons = " | ".join(f["reason"] for f in doc["failed"])
    assert "--trust-remote-code is not one a fold round takes" in reasons
    assert "--max-num-seqs has a value a fold round does not take: must be an integer" in reasons


def test_a_logged_compilation_config_of_known_keys_is_folded_and_one_naming_a_path_is_not(base_art, logged,
                                                                                        tmp_path):
    lines = [json.loads(x) for x in logged.read_text().splitlines()]
    forged = tmp_path / "cc.jsonl"
    lines[0]["serve_args"] = {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}}
    lines[1]["serve_args"] = {"compilation_config": {"debug_dump_path": "/tmp/x"}}
    forged.write_text("".join(json.dumps(e) + "\n" for e in lines))
    r = run("replay", "--base", base_art, "--misses", forged, "--out", tmp_path / "n", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    [rnd] = doc["vllm"]
    assert "--compilation-config" in rnd["argv"][rnd["argv"].index("--serve-args") + 1]
    assert "holds 'debug_dump_path'" in " | ".join(f["reason"] for f in doc["failed"])


def test_a_pods_serving_flags_are_left_out_not_refused(served, base_art, tmp_path, monkeypatch):
    """The server as a Pod runs it (its port; the bench runner's --load-format dummy --tokenizer):
    those flags never shape the graphs, so the round takes the others and names them."""
    serve_with_new_flag(served)
    log = tmp_path / "pod-overlay" / "misses.jsonl"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(served))
    monkeypatch.setenv("CACHEBAKE_MISS_LOG", str(log))
    monkeypatch.setattr(sys, "argv", SERVER_ARGV + ["--load-format", "dummy", "--tokenizer",
                                                    "/models/nemotron-h-8b", "--port", "8000"])
    vm.record_at_exit()
    r = run("replay", "--base", base_art, "--misses", log, "--out", tmp_path / "n", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    [rnd] = json.loads(r.output)["vllm"]
    assert rnd["left_out"] == ["load_format", "port", "tokenizer"]
    assert rnd["serve_args"] == {"max_num_seqs": 64, "mamba_ssm_cache_dtype": "bfloat16"}
    argv = rnd["argv"]
    assert argv[argv.index("--serve-args") + 1] == "--max-num-seqs 64 --mamba-ssm-cache-dtype bfloat16"
    text = run("replay", "--base", base_art, "--misses", log, "--out", tmp_path / "n", "--dry-run")
    assert "left out (serving only, never applied): --load-format --port --tokenizer" in text.output


@pytest.mark.parametrize("value", ["--trust-remote-code", "-trust-remote-code", "auto --trust-remote-code"])
def test_a_value_that_reads_as_a_flag_is_not_folded(base_art, logged, tmp_path, value):
    """The plan shows the round as a `cachebake build --serve-args '...'` command line: a logged
    value that parses there as a flag of its own would turn remote code on when it is run."""
    lines = [json.loads(x) for x in logged.read_text().splitlines()]
    forged = tmp_path / "forged.jsonl"
    for e in lines:
        e["serve_args"] = {"dtype": value}
    forged.write_text("".join(json.dumps(e) + "\n" for e in lines))
    r = run("replay", "--base", base_art, "--misses", forged, "--out", tmp_path / "n", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["vllm"] == [] and "trust" not in json.dumps([rnd["argv"] for rnd in doc["vllm"]])
    assert all("--dtype has a value a fold round does not take" in f["reason"] for f in doc["failed"])


@pytest.mark.parametrize("edit, reason", [
    ({"serve_args": {"max_num_seqs": 64, "trust_remote_code": True}}, "--trust-remote-code is not one a fold round takes from an artifact"),
    ({"serve_args": {"max_num_seqs": 64, "worker_extension_cls": "evil.X"}}, "--worker-extension-cls is not one"),
    ({"serve_args": {"max_num_seqs": 64, "dtype": "--trust-remote-code"}}, "--dtype has a value a fold round does not take"),
    ({"model": {"recipe": "nemotron-h", "path": "/etc"}}, "model dir /etc is not under /models"),
    ({"model": {"recipe": "nemotron-h", "path": "/models/../root/.ssh"}}, "is not under /models"),
    ({"model": {"recipe": "nemotron-h", "path": "/models/x\x9b2J"}}, "model dir /models/x\\x9b2J is not under"),
])
def test_the_base_artifacts_own_warmup_is_held_to_the_logs_rules(installed, logged, tmp_path, edit, reason):
    """A round runs the base's recipe with its serve args and model dir: an artifact must not
    turn remote code on or pick where the round writes the model's config.json."""
    art = tmp_path / "forged-base"
    pack_artifact([CacheRoot("triton", installed), CacheRoot("vllm", vllm_tree(tmp_path / "bake"))], art,
                  target="sm_90", bake={**BAKE_SECTION, **edit}, layer_root=BAKE_ROOT)
    r = run("replay", "--base", art, "--misses", logged, "--out", tmp_path / "n", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["vllm"] == [] and len(doc["failed"]) == 2
    assert all(reason in f["reason"] for f in doc["failed"]), doc["failed"]
    r = run("replay", "--base", art, "--misses", logged, "--out", tmp_path / "n")
    assert r.exit_code == 0 and not [p for p in tmp_path.iterdir() if p.name.startswith(".n")]


def test_a_bases_serving_only_flags_are_left_out_of_its_rounds(installed, logged, tmp_path):
    art = tmp_path / "base-with-tokenizer"
    bake = {**BAKE_SECTION, "serve_args": {"max_num_seqs": 64, "tokenizer": "/etc", "port": 8000}}
    pack_artifact([CacheRoot("triton", installed), CacheRoot("vllm", vllm_tree(tmp_path / "bake"))], art,
                  target="sm_90", bake=bake, layer_root=BAKE_ROOT)
    r = run("replay", "--base", art, "--misses", logged, "--out", tmp_path / "n", "--dry-run", "--json")
    [rnd] = json.loads(r.output)["vllm"]
    assert "tokenizer" not in rnd["round_serve_args"] and "port" not in rnd["round_serve_args"]
    assert "/etc" not in " ".join(rnd["argv"])


def test_dirs_the_base_has_are_not_planned(base_art, logged, tmp_path):
    lines = [json.loads(x) for x in logged.read_text().splitlines()]
    e = next(x for x in lines if x["unit"] == "backend")
    e.update(backend_dir=BAKED_BACKEND, key="b5f17cf9b9")
    log = tmp_path / "base-has.jsonl"
    log.write_text(json.dumps(e) + "\n")
    r = run("replay", "--base", base_art, "--misses", log, "--out", tmp_path / "n", "--dry-run", "--json")
    doc = json.loads(r.output)
    assert doc["vllm"] == [] and [c["dir"] for c in doc["vllm_in_base"]] == [BAKED_BACKEND]


def test_a_base_without_a_vllm_warmup_is_refused_by_name(installed, logged, tmp_path):
    art = tmp_path / "kernels-art"
    pack_artifact([CacheRoot("triton", installed)], art, target="sm_90",
                  bake={"driver": "kernels", "model": "nemotron-h"})
    r = run("replay", "--base", art, "--misses", logged, "--out", tmp_path / "n", "--dry-run", "--json")
    doc = json.loads(r.output)
    assert doc["vllm"] == [] and all("no vllm-driver warmup" in f["reason"] for f in doc["failed"])


def test_round_units_packed_beside_the_bases(base_art, logged, tmp_path):
    """What a round wrote (an artifact packed from its tree: the base's dirs again, the new
    flags' dirs, one dir the server did not log) goes into the fold's vllm role; the base's
    stay; a logged dir the round did not write is named."""
    round_tree = vllm_tree(tmp_path / "round")
    write_unit(round_tree, NEW_BACKEND, {"cache_key_factors.json": b"{}", "computation_graph.py": b"g"})
    extra = "torch_compile_cache/1111111111/rank_0_0/backbone"
    write_unit(round_tree, extra, {"computation_graph.py": b"h"})
    round_art = tmp_path / "round.art"
    pack_artifact([CacheRoot("vllm", round_tree)], round_art, target="sm_90", bake=BAKE_SECTION,
                  layer_root=BAKE_ROOT)
    from cachebake.artifact.reader import open_source

    src = open_source(str(base_art))
    base_units = vllm_fold.layer_units(src, src.select("sm_90"))
    fold_vllm = vllm_tree(tmp_path / "fold")  # the base, as fold-back extracts it
    copied = vllm_fold.take_round_units(round_art, "cuda:90", base_units, fold_vllm, tmp_path)
    assert copied == [NEW_BACKEND, extra]
    assert (fold_vllm / NEW_BACKEND / "computation_graph.py").read_bytes() == b"g"
    assert (fold_vllm / BAKED_BACKEND / "vllm_compile_cache.py").is_file()
    groups = misses_of(merge([str(logged)]), "vllm")
    [rnd], _, _ = vllm_fold.plan_rounds(groups, base_units, src.select("sm_90").manifest.bake,
                                        str(base_art), "cuda:90", BAKE_ROOT)
    vllm_fold.settle(rnd, copied)
    assert rnd.not_reproduced == [NEW_AOT]
    nxt = tmp_path / "next"
    pack_artifact([CacheRoot("vllm", fold_vllm)], nxt, target="sm_90", bake=BAKE_SECTION, layer_root=BAKE_ROOT)
    assert {u.rel for u in vllm_fold.layer_units(open_source(str(nxt)), open_source(str(nxt)).select("sm_90"))} \
        == {u.rel for u in base_units} | {NEW_BACKEND, extra}
