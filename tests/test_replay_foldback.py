"""Fold serve-time misses into a new artifact on this CPU machine, then prove it hits.

The whole loop with real sm_90 compiles: a base artifact packed from a real cache; replicas
served from it through the layered manager, missing kernels the bake lacks (several
specializations: constexprs, dtypes, divisibility attrs, num_warps); their logs folded (by
``fold_misses`` and by ``cachebake replay --base ART --misses LOG``, through the replay
engine's worker processes); the new artifact installed at another path; the same calls hit
with Triton's own cache manager.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import aot
import pytest
import servekit
from click.testing import CliRunner
from test_serve_layered import ALSO_NOT_IN_BAKE, IN_BAKE, NOT_IN_BAKE

from cachebake.artifact.pack import CacheRoot, pack_artifact
from cachebake.cli import main
from cachebake.cli.inspect import inspect_artifact
from cachebake.errors import BadInput, PreflightMismatch
from cachebake.install import install_artifact
from cachebake.replay import foldback
from cachebake.replay.engine import load_record
from cachebake.serve import misslog

# bf16, two pointers 16-divisible, num_warps 8: every part of the record
SPECIALIZED = ["scale_kernel", aot.SPECS[2][1], {"BLOCK": 512, "SQUARE": True},
               {"x_ptr": [["tt.divisibility", 16]], "out_ptr": [["tt.divisibility", 16]]},
               {"num_warps": 8}]
MISSED = [NOT_IN_BAKE, ALSO_NOT_IN_BAKE, SPECIALIZED]
KERNELS = ["aot"]  # the served kernels' module: named with --allow-module (the base has no record)


@pytest.fixture
def base(installed, tmp_path) -> Path:
    art = tmp_path / "base-art"
    pack_artifact([CacheRoot("triton", installed)], art, target="sm_90")
    return art


@pytest.fixture
def served(base, installed, tmp_path, monkeypatch) -> dict:
    """Two replicas' logs from serving the base bake, plus an autotune miss (the line the
    layered manager writes when the autotuner stores a result; benchmarking needs a GPU)."""
    serve = tmp_path / "served" / "triton"
    shutil.copytree(installed, serve)
    servekit.relocate(serve)
    out = {}
    for pod, specs in (("vllm-a", [IN_BAKE] + MISSED), ("vllm-b", [IN_BAKE, SPECIALIZED])):
        res = servekit.run_server(specs, servekit.serve_env(serve, tmp_path / pod, POD_NAME=pod))
        assert res["error"] is None, res["stderr"]
        out[pod] = res
    tuned = aot.write_autotune_result(tmp_path / "scratch", kernel="add_kernel", tuning_key=(8192, "torch.float16"))
    data = json.loads(tuned.read_text())
    # A launcher-helper miss (building cuda_utils and loading it needs libcuda: GPU only), keyed
    # as triton/runtime/build.py compile_module_from_src keys it.
    from triton.backends.nvidia import driver
    from triton.runtime.build import platform_key
    from triton.runtime.cache import _base32

    source = Path(driver.dirname, "driver.c").read_text()
    helper_key = _base32(hashlib.sha256((source + platform_key()).encode()).hexdigest())
    helper_file = "cuda_utils" + sysconfig.get_config_var("EXT_SUFFIX")
    with monkeypatch.context() as m:
        m.setenv("CACHEBAKE_MISS_LOG", str(tmp_path / "vllm-a" / "misses.jsonl"))
        misslog.note_file_miss(tuned.parent.name, tuned.name, tuned.read_bytes(), 4.2, "overlay")
        misslog.note_file_miss(helper_key, helper_file, b"", 0.9, "overlay")
    return {"logs": [str(tmp_path / "vllm-a" / "misses.jsonl"), str(tmp_path / "vllm-b")],
            "replicas": out, "autotune_key": tuned.parent.name, "autotune": data,
            "helper": f"{helper_key}/{helper_file}"}


def _hits_at_another_path(art: Path, served: dict, tmp_path: Path) -> Path:
    """``art`` installed at another path: the calls that missed now hit, with Triton's own
    manager, under the keys and with the cubins the server compiled."""
    srv = tmp_path / "elsewhere"
    install_artifact(art, srv, target="sm_90")
    res = servekit.run_server([IN_BAKE] + MISSED, servekit.serve_env(srv / "triton"))
    assert res["error"] is None and res["cache_hits"] == [True] * 4, res["stderr"]
    missed = served["replicas"]["vllm-a"]["compiles"][1:]
    assert [c["key"] for c in res["compiles"][1:]] == [c["key"] for c in missed]
    assert [c["cubin_sha256"] for c in res["compiles"][1:]] == [c["cubin_sha256"] for c in missed]
    return srv


def test_fold_then_hit_at_another_path(base, served, tmp_path):
    out = tmp_path / "next-art"
    report = foldback.fold_misses(base, served["logs"], out, jobs=2, allow_modules=KERNELS)
    assert sorted(c["kernel"] for c in report.compiled) == ["add_kernel", "rowsum_kernel", "scale_kernel"]
    assert report.failed == [] and report.in_base == [] and report.problems == []
    (tuned,) = report.autotune
    assert tuned["result"] == "carried" and tuned["key"] == served["autotune_key"]
    # The server logged each miss with the replay recorder's own entry, its key re-derived there.
    records = [e["record"] for e in servekit.miss_lines(served["logs"][0]) if e["kind"] == "kernel"]
    assert len(records) == 3 and all(r["verified"] and r["seen"] == "compile" for r in records)
    scale = next(c for c in report.compiled if c["kernel"] == "scale_kernel")
    assert scale["count"] == 2 and scale["replicas"] == ["vllm-a", "vllm-b"]

    # The new artifact: base + the 3 kernels + the carried autotune result, base fingerprint.
    (bake,) = inspect_artifact(out).bakes
    (old,) = inspect_artifact(base).bakes
    assert len(bake.manifest.inventory.kernels) == len(old.manifest.inventory.kernels) + 3
    assert bake.manifest.fingerprint == old.manifest.fingerprint
    assert {a.key_dir for a in bake.manifest.inventory.autotune} >= {f"triton/{served['autotune_key']}"}
    (folded,) = bake.manifest.bake.folded
    assert folded["base_layer_digest"] == old.layer_digest and len(folded["kernels"]) == 3

    # The launcher helpers were built here: the logged cuda_utils miss is in the artifact, and
    # one __triton_launcher per folded kernel (cuda_utils: +1).
    (helper,) = report.helpers
    assert helper["folded"] and report.helpers_built == 4
    assert (folded["helpers"]) == [{"file": served["helper"].split("/")[1], "folded": True}]

    # Its compile record: the base's (none: packed without one) plus the three folded entries,
    # verified, under the keys the server logged; replay reads it for any target.
    record = load_record(out).record
    logged = {c["key"] for c in report.compiled}
    assert len(record.compiles) == 3 and all(c.verified and c.target == "cuda:90" for c in record.compiles)
    from triton.runtime.cache import _base32

    assert {_base32(c.hash) for c in record.compiles} == logged

    # Installed at another path, the calls that missed now hit, with Triton's own manager.
    srv = _hits_at_another_path(out, served, tmp_path)
    carried = srv / "triton" / served["autotune_key"] / "add_kernel.autotune.json"
    assert json.loads(carried.read_text()) == served["autotune"]
    assert (srv / "triton" / served["helper"]).is_file()

    # A second fold of the same logs on the new artifact: everything is already there, and the
    # base's record is carried over as it was.
    again = foldback.fold_misses(out, served["logs"], tmp_path / "third-art")  # aot: in out's record
    assert again.compiled == [] and len(again.in_base) == 3 and again.helpers[0]["folded"]
    assert again.autotune[0]["result"] == "in base"
    assert load_record(tmp_path / "third-art").record.to_dict() == record.to_dict()


def test_unreplayable_misses_are_reported(base, tmp_path):
    log = tmp_path / "misses.jsonl"
    record = {"kernel": {"module": "no_such_module_here", "qualname": "k", "name": "k",
                         "source_hash": "0" * 64},
              "signature": [], "constexprs": [], "attrs": [], "options": {}, "env_vars": {},
              "target": "cuda:90", "hash": "0" * 64, "verified": False, "seen": "compile"}
    lines = [misslog.make_entry("kernel", "k", "K" * 52, 1.0, "overlay", record=record),
             misslog.make_entry("kernel", "m", "M" * 52, 1.0, "overlay",
                                record={**record, "target": "cuda:100"}),
             misslog.make_entry("kernel", "j", "J" * 52, 1.0, "overlay", record=None,
                                record_error=misslog.NO_LISTENER),
             misslog.make_entry("autotune", "t", "T" * 52, 3.0, "overlay", unreadable=True),
             misslog.make_entry("helper", "__triton_launcher", "H" * 52, 0.8, "overlay",
                                file="__triton_launcher.cpython-311-x86_64-linux-gnu.so"),
             misslog.make_entry("kernel", "bad", "B" * 52, 1.0, "overlay", record={"kernel": {"module": "m"}})]
    lines.append(misslog.make_entry("kernel", "u", "U" * 52, 1.0, "overlay",
                                    record={**record, "kernel": {**record["kernel"], "module": "unlisted_mod"}}))
    log.write_text("".join(json.dumps(e) + "\n" for e in lines))
    report = foldback.fold_misses(base, [str(log)], tmp_path / "out", allow_modules=["no_such_module_here"])
    reasons = {f["kernel"]: f["reason"] for f in report.failed}
    assert "module no_such_module_here does not import here" in reasons["k"]
    assert "module unlisted_mod is not on the allowlist" in reasons["u"]
    assert "listener did not run" in reasons["j"]
    assert reasons["m"] == "missed on cuda:100, the base bake is for cuda:90"
    assert "malformed compile entry" in reasons["bad"]
    assert report.autotune[0]["result"] == "needs benchmark"
    assert report.helpers[0]["file"].startswith("__triton_launcher") and not report.helpers[0]["folded"]
    assert report.compiled == []


def test_source_changed_since_the_miss(base, served, tmp_path):
    log = Path(served["logs"][0])
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for e in lines:
        if e.get("record"):
            e["record"]["kernel"]["source_hash"] = "0" * 64
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(json.dumps(e) + "\n" for e in lines))
    report = foldback.fold_misses(base, [str(edited)], tmp_path / "out", allow_modules=KERNELS)
    assert report.compiled == [] and all("source differs" in f["reason"] for f in report.failed)


def test_refusals(base, served, tmp_path):
    with pytest.raises(BadInput, match="is the base artifact"):
        foldback.fold_misses(base, served["logs"], base)
    with pytest.raises(PreflightMismatch, match="triton_key"):
        foldback.check_same_compiler({"triton_key": "another build", "triton_version": "3.6.0"}, "cuda:90")


@pytest.mark.parametrize("in_the_way", ["file", "link"])
def test_an_out_in_the_way_is_refused_before_anything_is_compiled(base, served, tmp_path, monkeypatch, in_the_way):
    out = tmp_path / "out"
    if in_the_way == "file":
        out.write_text("keep")
    else:
        (tmp_path / "elsewhere").mkdir()
        out.symlink_to(tmp_path / "elsewhere")
    compiled = []
    monkeypatch.setattr(foldback, "_fold_kernels", lambda *a, **k: compiled.append(1) or [])
    with pytest.raises(BadInput, match="--out"):
        foldback.fold_misses(base, served["logs"], out, allow_modules=KERNELS)
    assert compiled == [] and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []


def test_cli_folds_then_the_missed_kernels_hit_elsewhere(base, served, tmp_path):
    """``cachebake replay --base ART --misses LOG --misses DIR --out ART2``, run where the
    serving variables are set (TRITON_CACHE_MANAGER=layered, an overlay): the engine's workers
    still write the artifact's cache with Triton's own manager, nothing goes to the overlay."""
    out = tmp_path / "next-art"
    overlay = tmp_path / "fold-overlay"
    env = servekit.serve_env(tmp_path / "unused-cache", overlay)
    run = subprocess.run([sys.executable, "-m", "cachebake.cli", "replay", "--base", str(base),
                          "--misses", served["logs"][0], "--misses", served["logs"][1],
                          "--out", str(out), "--jobs", "2", "--allow-module", "aot", "--json"],
                         env=env, capture_output=True, text=True, timeout=600, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert doc["ok"] and doc["command"] == "replay" and doc["jobs"] == 2
    assert sorted(c["kernel"] for c in doc["compiled"]) == ["add_kernel", "rowsum_kernel", "scale_kernel"]
    assert doc["record"]["compiles"] == 3 and doc["failed"] == []
    assert not (overlay / "triton").exists()
    _hits_at_another_path(out, served, tmp_path)

    res = CliRunner().invoke(main, ["inspect", str(out)])
    assert res.exit_code == 0, res.output
    assert "folded" in res.output and "3 kernels" in res.output


@pytest.mark.parametrize("args, message", [
    (["ART", "--misses", "LOG"], "does not mix with --base/--misses"),
    (["--base", "ART"], "--base ART and --misses LOG|DIR go together"),
    (["--misses", "LOG"], "--base ART and --misses LOG|DIR go together"),
    (["--base", "ART", "--misses", "LOG", "--partial"], "do not apply with --base"),
    (["ART"], "give ART|RECORD and --target"),
])
def test_cli_refuses_mixed_arguments(args, message, tmp_path):
    res = CliRunner().invoke(main, ["replay", *args, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and message in res.output
    assert res.output.count("cachebake: error:") == 1 and not (tmp_path / "o").exists()


# -- logs from a compromised pod ---------------------------------------------------------------

KERNEL_KEY = "A" * 52  # the shape of a Triton key dir, absent from the base
CONFIG = {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 3, "num_ctas": 1, "maxnreg": None,
          "pre_hook": None, "ir_override": None}


def _write_log(path: Path, lines: list) -> Path:
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in lines))
    return path


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace (.ci/run installs it)")
def test_names_from_a_log_never_leave_the_scratch_tree(base, tmp_path):
    """Class 2: keys and names that are paths.  Each line is refused and nothing outside is
    written, created or even looked up: strace sees no system call naming those paths."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "present").write_text("a file fold-back must not learn about\n")
    timings = [[CONFIG, [0.1, 0.09, 0.11]]]
    tune = dict(tuning_key=[4096], configs=[CONFIG], timings=timings)
    e = misslog.make_entry
    lines = [
        e("autotune", "add_kernel", "../../escaped", 1.0, "overlay", **tune),
        e("autotune", "add_kernel", str(outside), 1.0, "overlay", **tune),
        e("autotune", "../../escaped-name", KERNEL_KEY, 1.0, "overlay", **tune),
        e("helper", "passwd", "/etc", 0.1, "overlay", file="passwd"),
        e("helper", "present", str(outside), 0.1, "overlay", file="present"),
        e("helper", "cuda_utils", KERNEL_KEY, 0.1, "overlay", file=f"../../{outside.name}/present"),
        e("kernel", "../../escaped", KERNEL_KEY, 1.0, "overlay", record=None),
        e("kernel", "k", "/etc", 1.0, "overlay", record=None),
        e("kernel", "k", KERNEL_KEY + "\n", 1.0, "overlay", record=None),
    ]
    (tmp_path / "log").mkdir()
    log = _write_log(tmp_path / "log" / "misses.jsonl", lines)
    before = servekit.tree_state(tmp_path)
    trace = tmp_path.parent / f"{tmp_path.name}.strace"
    run = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=%file",
                          sys.executable, "-m", "cachebake.cli", "replay", "--base", str(base),
                          "--misses", str(log), "--out", str(tmp_path / "next"), "--json"],
                         env=servekit.serve_env(tmp_path / "unused"), capture_output=True, text=True,
                         timeout=600, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert len(doc["failed"]) == len(lines) and doc["autotune"] == [] and doc["helpers"] == []
    assert all(f["reason"].startswith("refused, nothing read or written") for f in doc["failed"])
    calls = trace.read_text()
    trace.unlink()
    assert "/etc/passwd" not in calls and str(outside) not in calls and "escaped" not in calls
    after = servekit.tree_state(tmp_path)
    new = {p for p in after if p not in before}
    assert all(p == "next" or p.startswith("next/") for p in new), new  # only --out was written
    assert {p: before[p] for p in before} == {p: after[p] for p in before}


def test_a_logged_autotune_result_is_rewritten_from_checked_values(base, tmp_path):
    """A config with ir_override (the server would compile a file of IR in place of the
    kernel) or pre_hook, or a timing that is not a number, is refused; a good one is carried
    with exactly Triton's Config fields."""
    e = misslog.make_entry
    bad_config = {**CONFIG, "ir_override": "/etc/passwd"}
    lines = [
        e("autotune", "add_kernel", "b" * 64, 1.0, "overlay", tuning_key=[1], timings=[[bad_config, [0.1]]]),
        e("autotune", "add_kernel", "C" * 52, 1.0, "overlay", tuning_key=[1],
          timings=[[{**CONFIG, "pre_hook": "os.system"}, [0.1]]]),
        e("autotune", "add_kernel", "D" * 52, 1.0, "overlay", tuning_key=[1], timings=[[CONFIG, ["fast"]]]),
        e("autotune", "add_kernel", "E" * 52, 1.0, "overlay", tuning_key=[1],
          timings=[[{**CONFIG, "num_warps": 3}, [0.1]]]),
        e("autotune", "add_kernel", "F" * 52, 1.0, "overlay", tuning_key=[2],
          timings=[[CONFIG, [0.2, 0.19, 0.21]], [{**CONFIG, "kwargs": {"BLOCK": 128}}, ["inf", "inf", "inf"]]]),
    ]
    log = _write_log(tmp_path / "misses.jsonl", lines)
    report = foldback.fold_misses(base, [str(log)], tmp_path / "next")
    reasons = {f["key"][:1]: f["reason"] for f in report.failed}
    assert "sets ir_override" in reasons["b"] and "sets pre_hook" in reasons["C"]
    assert "not a number" in reasons["D"] and "not a power of 2" in reasons["E"]
    (carried,) = report.autotune
    assert carried["key"] == "F" * 52 and carried["result"] == "carried"
    srv = tmp_path / "srv"
    install_artifact(tmp_path / "next", srv, target="sm_90")
    logged = {e["key"] for e in lines}
    assert [p.parent.name for p in (srv / "triton").glob("*/*.autotune.json") if p.parent.name in logged] == ["F" * 52]
    data = json.loads((srv / "triton" / ("F" * 52) / "add_kernel.autotune.json").read_text())
    assert data["configs_timings"][1][1] == [float("inf")] * 3  # as Triton's json.load reads it
    assert all(set(c) == set(CONFIG) and c["ir_override"] is None for c, _ in data["configs_timings"])


def test_bad_lines_and_markup_in_a_log_never_crash_the_fold(base, served, tmp_path):
    """Class 6 and terminal safety: a string seconds, a non-object record, a list key, a line
    nested 200,000 deep, a kernel name of rich markup and control sequences: counted or
    listed; the text view prints them as text (once this crashed after packing --out)."""
    good = servekit.miss_lines(served["logs"][0])[0]
    hostile = "[/x][link=file:///etc/passwd]\x1b]0;owned\x07k\x1b[2J"
    lines = [{**good, "seconds": "a lot"}, {**good, "record": "not an object"}, {**good, "key": ["K"]},
             '{"cachebake_miss": 1, "kind": ' + "[" * 200_000 + "]" * 200_000 + "}",
             {**good, "kernel": hostile, "key": "G" * 52, "record": None, "record_error": "\x1b[31mred"},
             {**good, "kernel": "k", "key": hostile}]
    log = _write_log(tmp_path / "misses.jsonl", lines)
    run = subprocess.run([sys.executable, "-m", "cachebake.cli", "replay", "--base", str(base),
                          "--misses", str(log), "--out", str(tmp_path / "next")],
                         env={**servekit.serve_env(tmp_path / "unused"), "COLUMNS": "400"},
                         capture_output=True, text=True, timeout=600, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "\x1b" not in run.stdout + run.stderr
    assert "\x07" not in run.stdout
    assert "lines skipped: 1 unreadable, 3 malformed" in run.stdout
    assert "[/x][link=file:///etc/passwd]" in run.stdout  # shown as text, not applied as markup
    assert "not a Triton cache key" in run.stdout and (tmp_path / "next" / "index.json").exists()


def test_a_logged_records_variables_are_never_applied(base, served, tmp_path):
    """Class 1 at fold-back: a miss line whose record names LD_PRELOAD and LLVM's pass plugin
    (a canary library) and MLIR's dump path (the user's file) is refused by the engine's
    workers, which still build the launcher helpers with gcc, under this process's variables."""
    import canarykit

    lib, mark = canarykit.shared_library(tmp_path / "canary")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    lines = [e for e in servekit.miss_lines(served["logs"][0]) if e["kind"] == "kernel"][:1]
    lines[0]["record"]["env_vars"] = {"LD_PRELOAD": str(lib), "LLVM_PASS_PLUGIN_PATH": str(lib),
                                      "MLIR_ENABLE_DUMP": "1", "MLIR_DUMP_PATH": str(victim)}
    log = _write_log(tmp_path / "misses.jsonl", lines)
    report = foldback.fold_misses(base, [str(log)], tmp_path / "next", jobs=1, allow_modules=KERNELS)
    (failed,) = report.failed
    assert "cache-invalidating variables differ" in failed["reason"] and "LD_PRELOAD" in failed["reason"]
    assert report.helpers_built == 1  # cuda_utils: gcc and ld ran
    assert not mark.exists() and victim.read_text() == "the user's file\n"
