"""drivers.registry and drivers.child: which driver a bare `--model` gets, what each needs
before round 1, and the round child's error boundary.

This machine has no GPU, no torch and no vLLM, so the packages the choice depends on are
stand-ins on sys.path (found, never imported: the choice must not import them) and the GPU is
a stand-in nvidia-smi answering the one query cachebake makes."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu import _fake_nvidia_smi

from cachebake.drivers.command import CommandDriver
from cachebake.drivers.registry import DriverSpec, InProcessDriver, default_driver, default_out, make_driver
from cachebake.errors import BadInput, Unsupported, UsageError

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
RAISE = "raise RuntimeError('imported: the driver choice must only locate packages')\n"


def _fake_packages(site: Path, *names: str) -> None:
    files = {"torch": ["torch/__init__.py"],
             "vllm-ops": ["vllm/__init__.py", "vllm/model_executor/layers/mamba/ops/ssd_combined.py"],
             "vllm": ["vllm/__init__.py", "vllm/entrypoints/llm.py",
                      "vllm/model_executor/layers/mamba/ops/ssd_combined.py"]}
    for name in names:
        for rel in files[name]:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(RAISE)


@pytest.fixture
def site(tmp_path, monkeypatch):
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.setenv("PATH", f"{tmp_path / 'nobin'}{os.pathsep}/usr/bin:/bin")  # no GPU yet
    importlib.invalidate_caches()
    yield d
    importlib.invalidate_caches()


def test_vllm_where_vllm_and_a_gpu_are(site, tmp_path, monkeypatch):
    _fake_packages(site, "vllm", "torch")
    _fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA H200, 9.0")
    assert default_driver() == "vllm"
    drv = make_driver(None, None, model="nemotron-h")
    assert drv.name == "vllm" and drv.runs_on_gpu
    drv.preflight()
    assert "vllm" not in sys.modules and "torch" not in sys.modules


def test_kernels_where_torch_and_the_ops_are(site, tmp_path, monkeypatch):
    _fake_packages(site, "vllm-ops", "torch")  # the ops-only slice: no engine
    assert default_driver() == "kernels"
    with pytest.raises(Unsupported, match="--driver kernels cannot run here: it needs a visible GPU"):
        make_driver(None, None, model="nemotron-h").preflight()
    _fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA H200, 9.0")
    assert default_driver() == "kernels"  # no engine: vllm cannot run even with a GPU
    make_driver(None, None, model="nemotron-h").preflight()


def test_vllm_without_a_gpu_falls_to_kernels_which_says_gpu(site):
    _fake_packages(site, "vllm", "torch")
    assert default_driver() == "kernels"
    with pytest.raises(Unsupported, match="visible GPU"):
        make_driver(None, None, model="nemotron-h").preflight()


def test_nothing_here_names_what_to_install(site):
    with pytest.raises(Unsupported, match=r"missing: torch, vLLM, vLLM's Mamba2 ops, a visible "
                                          r"GPU\): install vLLM \(pip install vllm") as exc:
        default_driver()
    assert "\n" not in str(exc.value)


def test_make_driver(monkeypatch):
    assert make_driver(None, ["echo", "hi"]).round_argv() == ["echo", "hi"]
    kernels = make_driver("kernels", None, model="nemotron-h", tp=2,
                          serve_args="--max-num-seqs 64")
    assert kernels.function == "cachebake.vllm.kernels.driver:run_sweep"
    assert kernels.kwargs == {"model": "nemotron-h", "tp": 2, "serve_args": {"max_num_seqs": 64}}
    assert kernels.round_argv()[1:3] == ["-m", "cachebake.drivers.child"]
    assert json.loads(kernels.round_argv()[4])["serve_args"] == {"max_num_seqs": 64}
    # options that do not mix, or a missing one, are usage errors (exit 2); a model that is
    # not there and serve args vLLM refuses are bad input (exit 3)
    for bad, error, match in [(dict(driver=None, cmd=None), UsageError, "nothing to run"),
                              (dict(driver="kernels", cmd=None), UsageError, "nothing to run"),
                              (dict(driver="command", cmd=None), UsageError, "runs the command after --"),
                              (dict(driver="kernels", cmd=["x"]), UsageError, "not both"),
                              (dict(driver="nope", cmd=None, model="nemotron-h"), UsageError, "unknown driver"),
                              (dict(driver="kernels", cmd=None, model="nemotron-hh"), BadInput, "unknown model"),
                              (dict(driver="kernels", cmd=None, model="nemotron-h", model_dir="/m"),
                               UsageError, "--model-dir is for --driver vllm"),
                              (dict(driver="vllm", cmd=None, model="nemotron-h", plan="/p"),
                               UsageError, "is for --driver kernels"),
                              (dict(driver="vllm", cmd=None, model="nemotron-h",
                                    serve_args={"enforce_eager": True}), BadInput, "enforce_eager")]:
        with pytest.raises(error, match=match):
            make_driver(bad.pop("driver"), bad.pop("cmd"), **bad)


def test_a_missing_driver_module_and_a_missing_command(monkeypatch):
    with pytest.raises(Unsupported, match="not available"):
        InProcessDriver(DriverSpec("x", "cachebake.drivers.no_such_driver:run", (), "x-bake.json")).preflight()
    with pytest.raises(BadInput, match="no such command on PATH"):
        CommandDriver(["no-such-warmup-cmd"]).preflight()
    CommandDriver([sys.executable]).preflight()


def test_default_out_names():
    assert default_out("nemotron-h") == "cachebake-nemotron-h"
    assert default_out("nemotron-h:47b") == "cachebake-nemotron-h-47b"
    assert default_out("/models/My Model/") == "cachebake-My-Model"
    assert default_out(None) == "cachebake-artifact"


def _child(tmp_path, function, kwargs="{}"):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}",
           "CACHEBAKE_LOG_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "cachebake.drivers.child", function, kwargs],
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_round_childs_boundary(tmp_path):
    (tmp_path / "drv.py").write_text(
        "from cachebake.errors import BadInput\n"
        "def bug(**kw):\n    {}['missing']\n"
        "def refuse(**kw):\n    raise BadInput('no weights for that model')\n"
        "def fine(**kw):\n    print('ran', kw)\n")
    r = _child(tmp_path, "drv:bug")
    assert r.returncode == 9 and "Traceback" not in r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("cachebake: error: driver drv:bug failed: KeyError: 'missing' (traceback in ")
    log = Path(line.rsplit("(traceback in ", 1)[1].rstrip(")"))
    assert log.parent == tmp_path and "Traceback" in log.read_text()
    r = _child(tmp_path, "drv:refuse")
    assert (r.returncode, r.stderr) == (3, "cachebake: error: no weights for that model\n")
    r = _child(tmp_path, "drv:fine", '{"model": "m"}')
    assert r.returncode == 0 and "ran {'model': 'm'}" in r.stdout
    r = _child(tmp_path, "drv")  # no function named: the child's bug, still one line
    assert r.returncode == 9 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
