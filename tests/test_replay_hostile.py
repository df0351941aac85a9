"""A compile record is data: forged records against ``cachebake replay`` and ``build --seed``.

The record is recorded by the compile monitor from real Triton launches (tests/kit/jit_launch.py,
as tests/test_replay_engine.py does), then forged as an attacker who can write a record (a
compromised builder's artifact, a registry) or a miss line would: variables that make a
worker's gcc, ld, ptxas or LLVM load a library (a canary whose constructor leaves a mark) or
overwrite a file, options that name files, modules that are not kernels (a canary module whose
import leaves a mark), text that a terminal acts on, nesting that overflows a recursive parser.
Every forged entry must be refused before it is imported or compiled, the rest compiled as
usual, and each answer one line with its documented exit code, never a traceback.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import canarykit
import pytest
from click.testing import CliRunner
from test_replay_engine import ALLOW_KERNELS, REPO, TESTS, jit_warmup

from cachebake.capture.recorder import load_record_log
from cachebake.cli import main

pytestmark = pytest.mark.slow  # real compiles in worker processes

TOKEN = "SECRET-TOKEN-d41d8cd98f00"  # the first line of a file ir_override would make Triton read


def cli(*args, extra_path=(), timeout=600):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), *map(str, extra_path)])}
    return subprocess.run([sys.executable, "-m", "cachebake.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd="/")


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr and "\x1b" not in stderr
    errors = [ln for ln in stderr.splitlines() if ln.startswith("cachebake: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    """A real record, and the same record with forged entries appended, one per attack."""
    d = tmp_path_factory.mktemp("forged")
    jit_warmup(d / "cache", 90, RECORD_LOG=d / "events.jsonl")
    record = load_record_log(d / "events.record.jsonl")
    assert record.summary()["compiles"] == 9 and record.summary()["unverified"] == 0
    lib, lib_mark = canarykit.shared_library(d / "lib")
    mod_mark = canarykit.python_module(d / "mods", "canary_kernels")
    victim = d / "victim.txt"
    victim.write_text("the user's file\n")
    ir = d / "override.ttir"
    ir.write_text(f"{TOKEN} module {{}}\n")
    base = next(c for c in record.compiles if c.kernel.name == "add_kernel")

    def forge(**change):
        spec = copy.deepcopy(base)
        for k, v in change.items():
            setattr(spec, k, v)
        return spec

    def module(name):
        return forge(kernel=type(base.kernel)(name, base.kernel.qualname, base.kernel.name,
                                              base.kernel.source_hash))

    attacks = {
        "env": forge(env_vars={"LD_PRELOAD": str(lib), "LLVM_PASS_PLUGIN_PATH": str(lib),
                               "MLIR_ENABLE_DUMP": "1", "MLIR_DUMP_PATH": str(victim)}),
        "ir_override": forge(options={**base.options, "ir_override": str(ir)}),
        "extern_libs": forge(options={**base.options, "extern_libs": [["libdevice", str(lib)]]}),
        "canary_module": module("canary_kernels"),
        "main": module("__main__"),
        "os": module("os"),
        "markup": module("\x1b]0;owned\x07[/x]\x1b[2J"),
    }
    bad = copy.deepcopy(record)
    bad.compiles += list(attacks.values())
    path = d / "forged.json"
    path.write_bytes(bad.to_json())
    return {"dir": d, "record": path, "lib_mark": lib_mark, "mod_mark": mod_mark, "victim": victim,
            "mods": d / "mods", "attacks": attacks}


@pytest.fixture(scope="module")
def replayed(forged):
    """The CLI on the forged record: once as is (refused), once with --partial."""
    d = forged["dir"]
    args = ["replay", str(forged["record"]), "--target", "sm_90", "--jobs", "2", *ALLOW_KERNELS]
    refused = cli(*args, "--out", str(d / "art"), extra_path=[forged["mods"]])
    partial = cli(*args, "--out", str(d / "art-partial"), "--partial", "--json", extra_path=[forged["mods"]])
    assert partial.returncode == 0, partial.stderr[-3000:]
    report = json.loads(partial.stdout)
    return {"refused": refused, "partial": partial, "report": report,
            "problems": report["problems"], "out": d / "art", "partial_out": d / "art-partial"}


def problem_of(replayed, needle: str) -> str:
    (found,) = [p for p in replayed["problems"] if needle in p]
    return found


def test_forged_entries_are_refused_and_nothing_is_written(replayed):
    run = replayed["refused"]
    assert run.returncode == 7
    line = one_error_line(run.stderr)
    assert "7 record entries could not be replayed for cuda:90; nothing written" in line
    assert not replayed["out"].exists()
    # with --partial the genuine entries compile as always, and only those
    report = replayed["report"]
    assert report["compiled"] == 9 and len(replayed["problems"]) == 7 and report["helpers_built"] >= 1


def test_a_records_variables_are_never_applied(forged, replayed):
    """Class 1: LD_PRELOAD would reach the gcc/ld of the helper builds (which ran: helpers
    were built), LLVM_PASS_PLUGIN_PATH makes LLVM dlopen the library, MLIR_DUMP_PATH writes
    the user's file.  The entry is refused, naming the variables."""
    problem = problem_of(replayed, "LD_PRELOAD")
    assert "cache-invalidating variables differ from this process's" in problem
    assert "LLVM_PASS_PLUGIN_PATH" in problem and "MLIR_DUMP_PATH" in problem and "never applied" in problem
    assert not forged["lib_mark"].exists()
    assert forged["victim"].read_text() == "the user's file\n"


def test_options_that_name_files_are_refused_before_any_compile(replayed):
    ir = problem_of(replayed, "ir_override")
    assert "names a file of IR" in ir
    assert TOKEN not in replayed["partial"].stdout + replayed["partial"].stderr  # never read
    assert "names library files" in problem_of(replayed, "extern_libs")


def test_modules_off_the_allowlist_are_never_imported(forged, replayed):
    assert "module canary_kernels is not on the allowlist" in problem_of(replayed, "canary_kernels")
    assert "is a program's __main__" in problem_of(replayed, "__main__")
    assert "module os is not on the allowlist" in problem_of(replayed, "module os ")
    assert not forged["mod_mark"].exists()


def test_the_canary_module_would_have_been_imported_if_listed(forged, tmp_path):
    """The same entry, its module listed: it is imported (and then is no kernel).  So the test
    above, which saw no mark, could have seen one."""
    from cachebake.capture.record import CompileRecord

    path = tmp_path / "one.json"
    path.write_bytes(CompileRecord(compiles=[forged["attacks"]["canary_module"]]).to_json())
    run = cli("replay", str(path), "--target", "sm_90", "--out", str(tmp_path / "art"), "--jobs", "1",
              "--allow-module", "canary_kernels", "--json", extra_path=[forged["mods"]])
    assert run.returncode == 7 and "canary_kernels has no add_kernel" in run.stdout
    assert forged["mod_mark"].exists()
    forged["mod_mark"].unlink()


def test_terminal_control_and_markup_in_a_record_print_as_text(forged, replayed):
    problem = problem_of(replayed, "owned")
    assert "not a dotted Python identifier" in problem and "\x1b" not in problem
    for run in (replayed["refused"], replayed["partial"]):
        assert "\x1b" not in run.stdout + run.stderr and "\x07" not in run.stdout + run.stderr
    # the text view (what a person's terminal gets) of the --partial report
    run = cli("replay", str(forged["record"]), "--target", "sm_90", "--jobs", "2", "--partial",
              "--out", str(forged["dir"] / "art-text"), *ALLOW_KERNELS, extra_path=[forged["mods"]])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "\x1b" not in run.stdout and "[/x]" in run.stdout and "problem:" in run.stdout


def test_a_record_nested_200000_deep_is_one_line_exit_5(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"format_version": 1, "compiles": [' + "[" * 200_000 + "]" * 200_000 + "]}")
    run = cli("replay", str(path), "--target", "sm_90", "--out", str(tmp_path / "art"))
    assert run.returncode == 5
    assert "nests deeper than 32 levels" in one_error_line(run.stderr)
    assert not (tmp_path / "art").exists()


def test_a_record_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "record.json")
    run = cli("replay", str(tmp_path / "record.json"), "--target", "sm_90", "--out", str(tmp_path / "a"),
              timeout=60)
    assert run.returncode == 5 and "not a regular file (a FIFO)" in one_error_line(run.stderr)


def test_seeding_a_build_from_a_forged_record_compiles_only_the_genuine_entries(forged, tmp_path):
    """``build --seed``: the same rules (the rounds then compile what seeding refused)."""
    from cachebake.bake.seed import prepare_bake
    from cachebake.capture.env import bake_env
    from cachebake.gpu import GPUTargetSpec

    benv = bake_env(tmp_path / "root", monitor_log=tmp_path / "events.jsonl")
    prep = prepare_bake(benv, seed=forged["record"], jobs=2, target="sm_90",
                        visible=lambda: (GPUTargetSpec("cuda", 90, 32), "NVIDIA H200"),
                        allow_modules=["aot_kernels", "replay_kernels"])
    assert prep.seed["compiled"] == 9 and len(prep.seed["problems"]) == 7
    assert not forged["lib_mark"].exists() and not forged["mod_mark"].exists()
    assert forged["victim"].read_text() == "the user's file\n"


@pytest.mark.parametrize("name", ["pkg.__main__", "os; id", "a.<locals>"])
def test_allow_module_takes_only_module_names(name, tmp_path):
    res = CliRunner().invoke(main, ["replay", "REC", "--target", "sm_90", "--out", str(tmp_path / "o"),
                                    "--allow-module", name])
    assert res.exit_code == 2 and "--allow-module" in res.output
    res = CliRunner().invoke(main, ["build", "--allow-module", "aot", "--out", str(tmp_path / "o"),
                                    "--", "true"])
    assert res.exit_code == 2 and "--allow-module is for --seed" in res.output


def test_build_says_what_seeding_refused(forged, tmp_path):
    """``build --seed`` with the forged record: one warning per refused entry, each one line and
    nothing a terminal acts on; the genuine entries are in the bake."""
    run = cli("build", "--seed", str(forged["record"]), "--target", "sm_90", "--jobs", "2", *ALLOW_KERNELS,
              "--out", str(tmp_path / "art"), "--root", str(tmp_path / "root"), "--max-rounds", "2",
              "--quiet-rounds", "1", "--", sys.executable, str(TESTS / "aot_kernels.py"),
              extra_path=[forged["mods"]])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "\x1b" not in run.stderr and "\x07" not in run.stderr
    seeded = [ln for ln in run.stderr.splitlines() if ln.startswith("cachebake: warning: seed: ")]
    assert len(seeded) == len(forged["attacks"]), run.stderr
    assert (tmp_path / "art" / "index.json").is_file()
