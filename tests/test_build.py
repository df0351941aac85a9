"""build: rounds in fresh processes until one compiles nothing, the report, and the CLI."""

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebake.build import run_until_stable
from cachebake.capture.env import bake_env
from cachebake.cli import main
from cachebake.drivers.command import DRIVER_FUNCTIONS, CommandDriver, InProcessDriver, make_driver
from cachebake.errors import BadInput, CommandFailed, ExitCode, NotStable, Unsupported

TESTS = Path(__file__).resolve().parent

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
    script = tmp_path / "warmup.py"
    script.write_text(WARMUP)
    return [sys.executable, str(script), str(tmp_path / "counter"), str(limit)]


def env_for(tmp_path):
    return bake_env(tmp_path / "root", ("triton",), monitor_log=tmp_path / "work/events.jsonl")


def test_stable_after_first_round(tmp_path):
    report = run_until_stable(CommandDriver(warmup_cmd(tmp_path, 0)), env_for(tmp_path))
    assert report.stable and len(report.rounds) == 2
    r1, r2 = report.rounds
    assert (r1.summary.compiles, r1.summary.cache_hits) == (2, 0)
    assert (r2.summary.compiles, r2.summary.cache_hits) == (0, 2)
    assert r1.summary.kernels == ["add_kernel", "scale_kernel"]
    assert (tmp_path / "work/round-1.log").is_file()


def test_stable_after_second_round(tmp_path):
    report = run_until_stable(CommandDriver(warmup_cmd(tmp_path, 1)), env_for(tmp_path))
    assert report.stable
    assert [r.summary.compiles for r in report.rounds] == [2, 1, 0]
    assert [r.summary.cache_hits for r in report.rounds] == [0, 1, 2]


def test_bake_section(tmp_path):
    cmd = warmup_cmd(tmp_path, 1)
    bake = run_until_stable(CommandDriver(cmd), env_for(tmp_path)).to_dict()
    json.dumps(bake)  # goes into the manifest as is
    assert bake["driver"] == "command" and bake["command"] == cmd
    assert bake["stable"] is True and bake["rounds"] == 3
    assert [r["compiles"] for r in bake["per_round"]] == [2, 1, 0]
    assert bake["compiles"] == 3 and bake["autotunes"] == 0
    assert bake["kernels"] == {"add_kernel": 2, "scale_kernel": 1}
    assert bake["compile_seconds_moved"] > 0
    assert bake["env"]["pinned"]["TRITON_CACHE_DIR"] == str(tmp_path / "root/triton")
    assert bake["env"]["invalidating_env_vars"] == {}
    events = bake["events"]
    assert [(e["kind"], e["round"], e["constexprs"]["BLOCK"]) for e in events] == [
        ("compile", 1, 16), ("compile", 1, 128), ("compile", 2, 32)]
    assert all("time" not in e for e in events)


def test_new_compiles_every_round_is_not_stable(tmp_path):
    with pytest.raises(NotStable, match="still compiling after 3 rounds") as exc:
        run_until_stable(CommandDriver(warmup_cmd(tmp_path, 99)), env_for(tmp_path),
                         max_rounds=3)
    assert exc.value.code == ExitCode.NOT_STABLE == 10


def test_no_until_stable_accepts_an_incomplete_bake(tmp_path):
    report = run_until_stable(CommandDriver(warmup_cmd(tmp_path, 99)), env_for(tmp_path),
                              max_rounds=2, until_stable=False)
    assert not report.stable and len(report.rounds) == 2
    assert report.to_dict()["stable"] is False


def test_failing_command(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    with pytest.raises(CommandFailed, match="round 1: .* exited with exit code 3") as exc:
        run_until_stable(CommandDriver(cmd), env_for(tmp_path))
    assert exc.value.code == ExitCode.COMMAND_FAILED
    assert "boom" in (tmp_path / "work/round-1.log").read_text()


def test_missing_command(tmp_path):
    with pytest.raises(CommandFailed, match="could not start"):
        run_until_stable(CommandDriver([str(tmp_path / "nope")]), env_for(tmp_path))


def test_command_without_triton_proves_nothing(tmp_path):
    with pytest.raises(CommandFailed, match="saw no Triton"):
        run_until_stable(CommandDriver(["true"]), env_for(tmp_path))


def test_in_process_driver_runs_a_function_per_round(tmp_path):
    benv = bake_env(tmp_path / "root", ("triton",), monitor_log=tmp_path / "work/ev.jsonl",
                    base_env={**os.environ, "PYTHONPATH": str(TESTS)})
    driver = InProcessDriver("test", "aot:compile_round", {"blocks": [32, 64]})
    report = run_until_stable(driver, benv)
    assert [r.summary.compiles for r in report.rounds] == [2, 0]
    assert report.to_dict()["function"] == "aot:compile_round"


def test_make_driver(monkeypatch):
    assert make_driver(None, ["echo", "hi"]).round_argv() == ["echo", "hi"]
    monkeypatch.setitem(DRIVER_FUNCTIONS, "kernels", "aot:compile_round")
    kernels = make_driver("kernels", None, model="nemotron-h", tp=2)
    assert kernels.function == "aot:compile_round"
    assert kernels.kwargs == {"model": "nemotron-h", "tp": 2}
    assert kernels.round_argv()[1:] == ["-m", "cachebake.drivers.command", "aot:compile_round",
                                        '{"model": "nemotron-h", "tp": 2}']
    monkeypatch.setitem(DRIVER_FUNCTIONS, "kernels", "cachebake.drivers.no_such_driver:run")
    with pytest.raises(Unsupported, match="not available"):
        make_driver("kernels", None, model="m")
    for bad in [dict(driver=None, cmd=None), dict(driver="kernels", cmd=None),
                dict(driver="kernels", cmd=["x"]), dict(driver="nope", cmd=None, model="m")]:
        with pytest.raises(BadInput):
            make_driver(bad.pop("driver"), bad.pop("cmd"), **bad)


def test_cli_build_failing_command_exit_code(tmp_path):
    result = CliRunner().invoke(main, ["build", "--out", str(tmp_path / "art"), "--root",
                                       str(tmp_path / "root"), "--", sys.executable, "-c",
                                       "raise SystemExit(4)"])
    assert result.exit_code == ExitCode.COMMAND_FAILED, result.output
    assert "cachebake: error: round 1:" in result.output

    shown = CliRunner().invoke(main, ["build", "--out", str(tmp_path / "art"), "--root",
                                      str(tmp_path / "root"), "--", sys.executable, "-c",
                                      "import sys; print('no weights here', file=sys.stderr); "
                                      "raise SystemExit(4)"])
    assert "no weights here" in shown.stderr  # the failed round's output is on screen


def test_cli_build_not_stable_exit_code(tmp_path):
    result = CliRunner().invoke(main, ["build", "--out", str(tmp_path / "art"), "--root",
                                       str(tmp_path / "root"), "--max-rounds", "2", "--",
                                       *warmup_cmd(tmp_path, 99)])
    assert result.exit_code == 10, result.output


def test_cli_build_packs_the_bake(tmp_path):
    pytest.importorskip("cachebake.artifact.pack")
    out = tmp_path / "art"
    result = CliRunner().invoke(main, ["build", "--out", str(out), "--root",
                                       str(tmp_path / "root"), "--target", "sm_90",
                                       "--work-dir", str(tmp_path / "work"), "--",
                                       *warmup_cmd(tmp_path, 0)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "cachebake.json").read_text())
    (entry,) = manifest["bakes"].values()
    bake = entry["bake"]
    assert bake["driver"] == "command" and bake["stable"] is True and bake["rounds"] == 2
    assert [r["compiles"] for r in bake["per_round"]] == [2, 0]
    assert bake["kernels"] == {"add_kernel": 1, "scale_kernel": 1}
    assert bake["compile_seconds_moved"] > 0
    assert [e["kernel"] for e in bake["events"]] == ["add_kernel", "scale_kernel"]
    assert "CACHEBAKE_MONITOR_LOG" not in bake["env"]["pinned"]
    assert (tmp_path / "work/events.jsonl").is_file()


def test_cli_build_with_a_driver_function(tmp_path, monkeypatch):
    """--driver NAME runs NAME's run function once per round, in a fresh process."""
    (tmp_path / "fake_driver.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport aot\n"
        "from cachebake.capture import monitor\n"
        "import json, os, pathlib\n"
        "def run_sweep(model, tp=1):\n"
        "    with monitor.step(f'{model} tp{tp}'):\n"
        "        aot.compile_round(blocks=(32, 64))\n"
        "    log = pathlib.Path(os.environ['CACHEBAKE_MONITOR_LOG'])\n"
        "    (log.parent / 'kernels-bake.json').write_text(json.dumps({'engine_steps': ['a', 'b']}))\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # for the rounds
    monkeypatch.syspath_prepend(str(tmp_path))  # for the availability check here
    monkeypatch.setitem(DRIVER_FUNCTIONS, "kernels", "fake_driver:run_sweep")
    out = tmp_path / "art"
    result = CliRunner().invoke(main, ["build", "--driver", "kernels", "--model", "tiny",
                                       "--tp", "2", "--out", str(out), "--root",
                                       str(tmp_path / "root"), "--target", "sm_90", "--json"])
    assert result.exit_code == 0, result.output
    bake = json.loads(result.stdout)["bake"]
    assert bake["driver"] == "kernels" and bake["model"] == "tiny" and bake["tp"] == 2
    assert [r["compiles"] for r in bake["per_round"]] == [2, 0]
    assert {e["step"] for e in bake["events"]} == {"tiny tp2"}
    # The driver's record joins the manifest's bake section; inspect names each
    # specialization's engine step.
    shown = CliRunner().invoke(main, ["inspect", str(out), "--json"])
    manifest_bake = json.loads(shown.stdout)["bakes"][0]["manifest"]["bake"]
    assert manifest_bake["engine_steps"] == ["a", "b"]
    text = CliRunner().invoke(main, ["inspect", str(out)])
    assert text.exit_code == 0 and "specializations by engine step" in text.output
    assert text.output.count("tiny tp2") == 2  # one row per compiled specialization
