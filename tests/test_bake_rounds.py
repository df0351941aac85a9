"""rounds: fresh-process rounds under the monitor, and the evidence a bake needs to call itself
stable (consecutive quiet rounds), with real Triton compiles (AOT for sm_90 on CPU)."""

import json
import os
import sys
from pathlib import Path

import pytest
import servekit

from cachebake.bake.rounds import run_rounds
from cachebake.capture.env import bake_env
from cachebake.drivers.command import CommandDriver
from cachebake.drivers.registry import DriverSpec, InProcessDriver
from cachebake.errors import CommandFailed, ExitCode, NotStable, UsageError

TESTS = servekit.kernels_dir()  # where every process of the session imports the test kernels

# A warmup that compiles add_kernel at BLOCK = 16 << min(runs so far, LIMIT): with LIMIT 0 it
# compiles in round 1 only, with LIMIT 1 in rounds 1 and 2, with a large LIMIT every round.
WARMUP = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import aot
counter, limit = sys.argv[1], int(sys.argv[2])
try:
    runs = int(open(counter).read())
except FileNotFoundError:
    runs = 0
open(counter, "w").write(str(runs + 1))
aot.aot_compile(None, constexprs={{"BLOCK": 16 << min(runs, limit)}})
aot.aot_compile(None, aot.scale_kernel)
"""


def warmup_cmd(tmp_path, limit):
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "warmup.py"
    script.write_text(WARMUP)
    return [sys.executable, str(script), str(tmp_path / "counter"), str(limit)]


def runs(tmp_path) -> int:
    """How many rounds the warmup actually ran."""
    counter = tmp_path / "counter"
    return int(counter.read_text()) if counter.exists() else 0


def env_for(tmp_path):
    return bake_env(tmp_path / "root", ("triton",), monitor_log=tmp_path / "work/events.jsonl")


def test_two_quiet_rounds_in_a_row_make_a_bake_stable(tmp_path):
    report = run_rounds(CommandDriver(warmup_cmd(tmp_path, 0)), env_for(tmp_path))
    assert report.stable and len(report.rounds) == 3 == runs(tmp_path)
    r1, r2, r3 = report.rounds
    assert (r1.summary.compiles, r1.summary.cache_hits) == (2, 0)
    assert (r2.summary.compiles, r2.summary.cache_hits) == (0, 2)
    assert (r3.summary.compiles, r3.summary.cache_hits) == (0, 2)
    assert r1.summary.kernels == ["add_kernel", "scale_kernel"]
    assert (tmp_path / "work/round-1.log").is_file()


def test_one_quiet_round_is_enough_when_asked(tmp_path):
    report = run_rounds(CommandDriver(warmup_cmd(tmp_path, 0)), env_for(tmp_path), quiet_rounds=1)
    assert report.stable and [r.summary.compiles for r in report.rounds] == [2, 0]


def test_stable_after_compiling_in_two_rounds(tmp_path):
    report = run_rounds(CommandDriver(warmup_cmd(tmp_path, 1)), env_for(tmp_path))
    assert report.stable
    assert [r.summary.compiles for r in report.rounds] == [2, 1, 0, 0]
    assert [r.summary.cache_hits for r in report.rounds] == [0, 1, 2, 2]


def test_bake_section_records_the_evidence(tmp_path):
    bake = run_rounds(CommandDriver(warmup_cmd(tmp_path, 1)), env_for(tmp_path)).to_dict()
    json.dumps(bake)  # goes into the manifest as is
    assert bake["stable"] is True and bake["rounds"] == 4
    assert (bake["quiet_rounds"], bake["until_stable"], bake["max_rounds"]) == (2, True, 6)
    assert [r["compiles"] for r in bake["per_round"]] == [2, 1, 0, 0]
    assert bake["compiles"] == 3 and bake["autotunes"] == 0
    assert bake["kernels"] == {"add_kernel": 2, "scale_kernel": 1}
    assert bake["compile_seconds_moved"] > 0
    events = bake["events"]
    assert [(e["kind"], e["round"], e["constexprs"]["BLOCK"]) for e in events] == [
        ("compile", 1, 16), ("compile", 1, 128), ("compile", 2, 32)]
    assert all("time" not in e and "pid" not in e for e in events)


def test_new_compiles_every_round_is_not_stable(tmp_path):
    with pytest.raises(NotStable, match="not stable after 3 of --max-rounds 4 rounds") as exc:
        run_rounds(CommandDriver(warmup_cmd(tmp_path, 99)), env_for(tmp_path), max_rounds=4)
    assert exc.value.code == ExitCode.NOT_STABLE == 10
    assert runs(tmp_path) == 3  # a 4th round could not have made two quiet rounds


@pytest.mark.slow  # rounds of real processes until the evidence runs out: 4.5 s alone on the 2-vCPU VM
def test_stops_as_soon_as_the_evidence_cannot_come_any_more(tmp_path):
    # compiles in rounds 1-4; with 5 allowed, round 5 alone cannot make 2 quiet rounds
    with pytest.raises(NotStable, match="not stable after 4 of --max-rounds 5 rounds"):
        run_rounds(CommandDriver(warmup_cmd(tmp_path, 3)), env_for(tmp_path), max_rounds=5)
    assert runs(tmp_path) == 4
    # compiles in rounds 1-3, then quiet: rounds 4 and 5 are the evidence
    assert run_rounds(CommandDriver(warmup_cmd(tmp_path / "again", 2)),
                      env_for(tmp_path / "again"), max_rounds=5).stable


def test_no_until_stable_runs_exactly_one_round(tmp_path):
    report = run_rounds(CommandDriver(warmup_cmd(tmp_path, 99)), env_for(tmp_path),
                        max_rounds=5, until_stable=False)
    assert not report.stable and len(report.rounds) == 1 == runs(tmp_path)
    assert report.to_dict()["stable"] is False and report.to_dict()["until_stable"] is False


def test_round_options_that_can_never_be_stable_are_refused(tmp_path):
    with pytest.raises(UsageError, match="could never be called stable"):  # options that do not mix: exit 2
        run_rounds(CommandDriver(["true"]), env_for(tmp_path), max_rounds=1, quiet_rounds=2)
    assert not (tmp_path / "work").exists()


def test_failing_command(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    with pytest.raises(CommandFailed, match="round 1: .* exited with exit code 3") as exc:
        run_rounds(CommandDriver(cmd), env_for(tmp_path))
    assert exc.value.code == ExitCode.COMMAND_FAILED
    assert "boom" in (tmp_path / "work/round-1.log").read_text()


def test_missing_command(tmp_path):
    with pytest.raises(CommandFailed, match="could not start"):
        run_rounds(CommandDriver([str(tmp_path / "nope")]), env_for(tmp_path))


def test_command_without_triton_proves_nothing(tmp_path):
    with pytest.raises(CommandFailed, match="saw no Triton"):
        run_rounds(CommandDriver(["true"]), env_for(tmp_path))


def test_in_process_driver_runs_a_function_per_round(tmp_path):
    benv = bake_env(tmp_path / "root", ("triton",), monitor_log=tmp_path / "work/ev.jsonl",
                    base_env={**os.environ, "PYTHONPATH": str(TESTS)})
    driver = InProcessDriver(DriverSpec("test", "aot:compile_round", (), "test-bake.json"), {"blocks": [32, 64]})
    report = run_rounds(driver, benv)
    assert [r.summary.compiles for r in report.rounds] == [2, 0, 0]
