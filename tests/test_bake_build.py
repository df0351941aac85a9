"""build: every check before round 1, the CLI's defaults, the report, and no temp dir left."""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import servekit
from click.testing import CliRunner
from test_bake_rounds import runs, warmup_cmd

from cachebake.bake.build import preflight
from cachebake.cli import main
from cachebake.drivers.command import CommandDriver
from cachebake.drivers.registry import DRIVERS, DriverSpec
from cachebake.errors import BadInput, ExitCode

REPO = Path(__file__).resolve().parent.parent
TESTS = servekit.kernels_dir()  # where every process of the session imports the test kernels


@pytest.fixture(autouse=True)
def private_tmpdir(tmp_path, monkeypatch):
    """Temp dirs of the command go here, so a test can see what is left behind."""
    d = tmp_path / "systmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def build(tmp_path, *args, root=None):
    return CliRunner().invoke(main, ["build", "--root", str(root or tmp_path / "root"), *args])


def test_failing_command_exit_code_and_its_output_shown(tmp_path, private_tmpdir):
    result = build(tmp_path, "--out", str(tmp_path / "art"), "--target", "sm_90", "--",
                   sys.executable, "-c", "import sys; print('no weights here', file=sys.stderr); "
                   "raise SystemExit(4)")
    assert result.exit_code == ExitCode.COMMAND_FAILED, result.output
    assert "cachebake: error: round 1:" in result.stderr
    assert "no weights here" in result.stderr  # the failed round's output is on screen
    assert "--work-dir DIR keeps the round logs" in result.stderr
    assert list(private_tmpdir.iterdir()) == []


def test_not_stable_exit_code(tmp_path, private_tmpdir):
    result = build(tmp_path, "--out", str(tmp_path / "art"), "--target", "sm_90", "--max-rounds",
                   "2", "--", *warmup_cmd(tmp_path, 99))
    assert result.exit_code == 10, result.output
    assert not (tmp_path / "art").exists() and list(private_tmpdir.iterdir()) == []


def test_builds_and_packs_the_bake(tmp_path, private_tmpdir):
    out = tmp_path / "art"
    result = build(tmp_path, "--out", str(out), "--target", "sm_90", "--work-dir",
                   str(tmp_path / "work"), "--json", "--", *warmup_cmd(tmp_path, 0))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["command"], report["ok"], report["status"]) == ("build", True, "created")
    assert report["target"] == "cuda:90" and report["stable"] is True and report["rounds"] == 3
    assert report["layer_digest"].startswith("sha256:") and report["manifest_digest"].startswith("sha256:")
    manifest = json.loads((out / "cachebake.json").read_text())
    (entry,) = manifest["bakes"].values()
    bake = entry["bake"]
    assert entry["manifest_digest"] == report["manifest_digest"]
    assert bake == report["bake"]
    assert bake["driver"] == "command" and bake["stable"] is True and bake["rounds"] == 3
    assert (bake["quiet_rounds"], bake["until_stable"]) == (2, True)
    assert [r["compiles"] for r in bake["per_round"]] == [2, 0, 0]
    assert bake["kernels"] == {"add_kernel": 1, "scale_kernel": 1}
    assert [e["kernel"] for e in bake["events"]] == ["add_kernel", "scale_kernel"]
    assert "CACHEBAKE_MONITOR_LOG" not in bake["env"]["pinned"]
    assert bake["env"]["pinned"]["TRITON_CACHE_DIR"] == str(tmp_path / "root/triton")
    assert (tmp_path / "work/events.jsonl").is_file()  # kept: --work-dir
    assert list(private_tmpdir.iterdir()) == []


def test_no_until_stable_runs_one_round_and_says_so(tmp_path):
    result = build(tmp_path, "--out", str(tmp_path / "art"), "--target", "sm_90",
                   "--no-until-stable", "--", *warmup_cmd(tmp_path, 99))
    assert result.exit_code == 0, result.output
    assert runs(tmp_path) == 1
    assert "1 rounds (NOT stable: one round, --no-until-stable)" in result.stdout


def test_out_defaults_to_a_named_directory_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = build(tmp_path, "--target", "sm_90", "--model", "my model:v2", "--",
                   *warmup_cmd(tmp_path, 0))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cachebake-my-model-v2" / "index.json").is_file()


# ---------------------------------------------------------------- checks before round 1

@pytest.mark.parametrize("case", ["out_in_the_way", "out_unwritable", "root_not_clean", "no_target",
                                  "bad_model", "missing_command", "max_below_quiet", "no_triton"])
def test_every_check_runs_before_round_1(tmp_path, case, private_tmpdir, monkeypatch):
    out, root = tmp_path / "art", tmp_path / "root"
    args = ["--out", str(out), "--target", "sm_90"]
    cmd = warmup_cmd(tmp_path, 0)
    code = ExitCode.BAD_INPUT
    if case == "out_in_the_way":
        out.write_text("precious")
    elif case == "out_unwritable":
        args[1] = "/proc/cachebake-art"
    elif case == "root_not_clean":
        (root / "triton" / "OLD").mkdir(parents=True)
    elif case == "no_target":
        monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: no visible GPU
        args = args[:2]
        cmd = [sys.executable] + cmd[1:]
    elif case == "bad_model":
        args += ["--model", "nemotron-hh", "--driver", "kernels"]
        cmd = []
    elif case == "missing_command":
        cmd = [str(tmp_path / "no-such-warmup")]
    elif case == "max_below_quiet":  # options that do not mix: a usage error, as in every command
        args += ["--max-rounds", "1"]
        code = ExitCode.USAGE
    elif case == "no_triton":  # pack would record an empty fingerprint: refused before round 1
        monkeypatch.setitem(sys.modules, "triton", None)
        code = ExitCode.UNSUPPORTED
    result = build(tmp_path, *args, *(["--", *cmd] if cmd else []), root=root)
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("cachebake: error: "), result.stderr
    assert runs(tmp_path) == 0  # no round ran
    assert list(private_tmpdir.iterdir()) == []
    if case == "out_in_the_way":
        assert out.read_text() == "precious"
    if case == "no_triton":
        assert "the `triton` extra" in lines[0] and "'.[triton]'" in lines[0]


def test_reuse_root_bakes_on_top_and_says_what_it_packs(tmp_path):
    root = tmp_path / "root"
    assert build(tmp_path, "--out", str(tmp_path / "a"), "--target", "sm_90", "--keep-root", "--",
                 *warmup_cmd(tmp_path, 0)).exit_code == 0
    refused = build(tmp_path, "--out", str(tmp_path / "b"), "--target", "sm_90", "--",
                    *warmup_cmd(tmp_path, 0))
    assert refused.exit_code == ExitCode.BAD_INPUT and "--reuse-root" in refused.stderr
    again = build(tmp_path, "--out", str(tmp_path / "b"), "--target", "sm_90", "--reuse-root",
                  "--json", "--", *warmup_cmd(tmp_path, 0))
    assert again.exit_code == 0, again.output
    bake = json.loads(again.stdout)["bake"]
    assert [r["compiles"] for r in bake["per_round"]] == [0, 0]  # all hits from the root
    assert bake["env"]["root"] == str(root)
    assert json.loads(again.stdout)["root_cleared"] is False  # --reuse-root: not ours to remove
    assert any((root / "triton").iterdir())


def test_the_documented_flow_on_one_machine_build_twice_then_install_at_the_root(tmp_path):
    """README: `build`, and again, then `install ART --to ROOT` on the same machine.  The root
    is emptied once its caches are packed, so neither refuses (both did: an unclean --root, and
    a cache that is not an install in the way)."""
    root = tmp_path / "root"
    for out in ("a", "b"):
        r = build(tmp_path, "--out", str(tmp_path / out), "--target", "sm_90", "--json", "--",
                  *warmup_cmd(tmp_path, 0))
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["root_cleared"] is True and doc["bake"]["per_round"][0]["compiles"] > 0
        assert not root.exists()  # the bake made it; nothing of it is left
    text = build(tmp_path, "--out", str(tmp_path / "c"), "--target", "sm_90", "--",
                 *warmup_cmd(tmp_path, 0))
    assert f"removed the baked caches under {root}" in text.stdout
    installed = CliRunner().invoke(main, ["install", str(tmp_path / "a"), "--to", str(root),
                                          "--target", "sm_90"])
    assert installed.exit_code == 0, installed.output
    assert f"TRITON_CACHE_DIR={root}/triton" in installed.stdout


def test_clearing_the_root_removes_only_what_the_bake_made(tmp_path):
    """A root that was there keeps its other files; a role dir that was there (empty) stays,
    emptied; a role that is a symlink is left alone, and what it leads to too."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    (root / "triton").mkdir(parents=True)
    (root / "notes.txt").write_text("mine")
    elsewhere.mkdir()
    (root / "flashinfer").symlink_to(elsewhere)  # empty, so the root is clean
    r = build(tmp_path, "--out", str(tmp_path / "a"), "--target", "sm_90", "--",
              *warmup_cmd(tmp_path, 0))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in root.iterdir()) == ["flashinfer", "notes.txt", "triton"]
    assert list((root / "triton").iterdir()) == [] and (root / "notes.txt").read_text() == "mine"
    assert (root / "flashinfer").is_symlink() and elsewhere.is_dir()


def test_a_kept_root_and_a_failed_bake_keep_the_caches(tmp_path):
    root = tmp_path / "root"
    r = build(tmp_path, "--out", str(tmp_path / "a"), "--target", "sm_90", "--keep-root", "--",
              *warmup_cmd(tmp_path, 0))
    assert r.exit_code == 0 and "kept the caches under" in r.stdout
    assert any((root / "triton").iterdir())
    other = tmp_path / "other-root"
    failed = build(tmp_path, "--out", str(tmp_path / "b"), "--target", "sm_90", "--max-rounds", "2",
                   "--", *warmup_cmd(tmp_path, 99), root=other)
    assert failed.exit_code == ExitCode.NOT_STABLE, failed.output
    assert any((other / "triton").iterdir())  # what --reuse-root continues from


def test_the_bake_target_is_the_visible_gpu_unless_a_cross_target_is_asked(tmp_path, monkeypatch):
    from test_gpu import _fake_nvidia_smi

    _fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA H200, 9.0")
    from cachebake.drivers.registry import InProcessDriver

    drv = InProcessDriver(DriverSpec("kernels", "aot:compile_round", ("gpu",), "kernels-bake.json"), {})
    assert preflight(drv, out=tmp_path / "a", root=tmp_path / "r").target == "cuda:90"
    # another target than the visible GPU's is a cross-target bake (cachebake.bake.seed)
    assert preflight(drv, out=tmp_path / "a", root=tmp_path / "r", target="cuda:120").target == "cuda:120"
    # a command may compile ahead of time for any target
    assert preflight(CommandDriver(["true"]), out=tmp_path / "a", root=tmp_path / "r",
                     target="sm_120").target == "cuda:120"


def test_the_main_command_on_a_machine_without_a_gpu(tmp_path):
    """`cachebake build --model nemotron-h`, as typed, where no driver can run: one line, a
    documented exit code (7, not 1 or 9), before anything is written, in well under 10 s."""
    if any(Path(d, "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("a GPU machine: this is about one without a GPU")
    fake = tmp_path / "fake"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise RuntimeError('torch imported')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}{os.pathsep}{fake}",  # no nvidia-smi
           "HOME": str(tmp_path)}
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "build", "--model", "nemotron-h"],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - start
    assert r.returncode == ExitCode.UNSUPPORTED, r.stderr
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith("cachebake: error: ") and "Traceback" not in r.stderr
    assert "pip install" in r.stderr or "visible GPU" in r.stderr
    assert list(cwd.iterdir()) == []
    assert seconds < 10, seconds


def test_cli_build_with_a_driver_function(tmp_path, monkeypatch):
    """--driver NAME runs NAME's run function once per round, in a fresh process.  (No GPU
    here: the test driver needs none, so its DriverSpec says so.)"""
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
    monkeypatch.setitem(DRIVERS, "kernels", DriverSpec("kernels", "fake_driver:run_sweep", (), "kernels-bake.json"))
    out = tmp_path / "art"
    result = build(tmp_path, "--driver", "kernels", "--model", "nemotron-h", "--tp", "2", "--out",
                   str(out), "--target", "sm_90", "--json")
    assert result.exit_code == 0, result.output
    bake = json.loads(result.stdout)["bake"]
    assert bake["driver"] == "kernels" and bake["model"] == "nemotron-h" and bake["tp"] == 2
    assert [r["compiles"] for r in bake["per_round"]] == [2, 0, 0]
    assert {e["step"] for e in bake["events"]} == {"nemotron-h tp2"}
    # The driver's record joins the manifest's bake section; inspect names each
    # specialization's engine step.
    shown = CliRunner().invoke(main, ["inspect", str(out), "--json"])
    manifest_bake = json.loads(shown.stdout)["bakes"][0]["manifest"]["bake"]
    assert manifest_bake["engine_steps"] == ["a", "b"]
    text = CliRunner().invoke(main, ["inspect", str(out)])
    assert text.exit_code == 0 and "specializations by engine step" in text.output
    assert text.output.count("nemotron-h tp2") == 2  # one row per compiled specialization


def test_a_last_round_that_recompiled_torch_compile_is_a_warning():
    """The vllm driver's last round records what torch.compile did (the probe's outcome, as
    torch_compile_outcome builds it): a load is silent, a compile after the first round says
    the packed vllm role would not spare a server like the rounds its Dynamo/Inductor time."""
    from cachebake.bake.build import torch_compile_note
    from cachebake.vllm.identity import torch_compile_outcome

    loaded = torch_compile_outcome([{"event": "aot_load", "path": "/r/a", "existed": True, "loaded": True}])
    compiled = torch_compile_outcome([{"event": "aot_load", "path": "/r/a", "existed": False, "loaded": False}])
    assert torch_compile_note({"rounds": 4, "torch_compile": loaded}) is None
    assert torch_compile_note({"rounds": 1, "torch_compile": compiled}) is None  # round 1 must compile
    assert torch_compile_note({"rounds": 3}) is None  # kernels and command drivers record none
    note = torch_compile_note({"rounds": 3, "torch_compile": compiled})
    assert note.startswith("the last round did not load torch.compile's artifact: no AOT artifact at "
                           "the path vLLM computed (/r/a)") and "recompile" in note
