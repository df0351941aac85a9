"""Light commands stay light: pack, inspect, install, fingerprint, recipes and serve-args never
import torch or vllm (seconds of start-up and torch's warnings, for commands that never touch a
GPU tensor).  As click's own tests/test_imports.py does: a fresh interpreter per command, here
with a stand-in torch and vllm first on sys.path that record being imported and then raise."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachebake.artifact.pack import pack_artifact, parse_root

REPO = Path(__file__).resolve().parent.parent
TRAP = """import os
open(os.environ["CACHEBAKE_TEST_IMPORT_TRAP"], "a").write(__name__ + "\\n")
raise RuntimeError(__name__ + " was imported by a light command")
"""


@pytest.fixture
def trap(tmp_path):
    site = tmp_path / "trap"
    for pkg in ("torch", "vllm", "numpy"):
        (site / pkg).mkdir(parents=True)
        (site / pkg / "__init__.py").write_text(TRAP)
    return site


def run(trap, tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{trap}",
           "CACHEBAKE_TEST_IMPORT_TRAP": str(tmp_path / "imported.txt")}
    env.pop("CACHEBAKE_MONITOR_LOG", None)
    return subprocess.run([sys.executable, "-m", "cachebake.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_light_commands_import_neither_torch_nor_vllm(trap, triton_cache, tmp_path):
    art = tmp_path / "art"
    pack_artifact([parse_root(f"triton={triton_cache}")], art, target="sm_90",
                  bake={"driver": "vllm", "model": "nemotron-h"})
    commands = [
        ["pack", triton_cache, "--out", tmp_path / "art2", "--target", "sm_90"],
        ["pack", triton_cache, "--out", tmp_path / "art3"],  # target from the cache itself
        ["inspect", art],
        ["fingerprint", "--target", "sm_90", "--out", tmp_path / "fp.json"],
        ["install", art, "--to", tmp_path / "c1", "--target", "sm_90"],
        ["install", art, "--to", tmp_path / "c2", "--fingerprint", tmp_path / "fp.json"],
        ["recipes"],
        ["recipes", "--json"],
        ["serve-args", art],
    ]
    for args in commands:
        r = run(trap, tmp_path, *args)
        assert r.returncode == 0, (args, r.stderr)
        assert not (tmp_path / "imported.txt").exists(), (args, (tmp_path / "imported.txt").read_text())
        assert "Traceback" not in r.stderr
    assert json.loads((tmp_path / "fp.json").read_text())["target"] == "cuda:90"


def test_the_trap_springs(trap, tmp_path):
    """The control: the stand-in is what `import torch` finds here, and it is noticed."""
    env = {**os.environ, "PYTHONPATH": str(trap),
           "CACHEBAKE_TEST_IMPORT_TRAP": str(tmp_path / "imported.txt")}
    r = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and (tmp_path / "imported.txt").read_text() == "torch\n"
