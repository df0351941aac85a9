"""README's "Quick start on a CPU", as written: each line of its block runs and does what the
README says it does (exit codes from the line's `# exit N`, else 0; the counts and lines the
prose quotes).  The fast test runs the cachebake lines with this interpreter's cachebake; the
slow one runs the whole block, pip line included, in a fresh venv in a fresh copy of the
checkout, as a newcomer would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from installkit import REPO

README = (REPO / "README.md").read_text()
SECTION = README.split("\n## Quick start on a CPU\n", 1)[1].split("\n## ", 1)[0]
(BLOCK,) = re.findall(r"```sh\n(.*?)```", SECTION, re.S)
LINES = [ln for ln in BLOCK.strip().splitlines() if ln.strip()]


def _expected_exit(line: str) -> int:
    m = re.search(r"#\s*exit (\d+)\s*$", line)
    return int(m[1]) if m else 0


def _clean_env(home: Path, path_first: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRITON_", "CACHEBAKE_", "VIRTUAL_ENV", "PYTHON", "VLLM_"))}
    env["HOME"] = str(home)
    if path_first:
        env["PATH"] = f"{path_first}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _run_lines(lines, cwd: Path, env: dict, prefix: str = "") -> list[subprocess.CompletedProcess]:
    done = []
    for line in lines:
        r = subprocess.run(["bash", "-c", prefix + line], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == _expected_exit(line), (line, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
        done.append(r)
    return done


def _check_what_readme_says(results, cwd: Path) -> None:
    build, inspect, install, verify_ok, verify_miss = results[-5:]
    rounds = build.stderr
    assert re.search(r"bake round 2: quiet -- 0 compiles \(0\.0 s\), 8 hits", rounds), rounds
    assert "bake round 1: compiled -- 8 compiles" in rounds
    assert "3 rounds (stable)" in build.stdout, build.stdout
    assert (cwd / "qs" / "bake" / "index.json").is_file()
    assert not any((cwd / "qs" / "root").rglob("*.json"))  # the root was emptied
    assert "8 kernels (2 names)" in inspect.stdout and "triton_key" in inspect.stdout
    assert "ptxas" in inspect.stdout and "python_tag" in inspect.stdout
    assert f"TRITON_CACHE_DIR={cwd}/qs/serve/triton" in install.stdout, install.stdout
    assert any((cwd / "qs" / "serve" / ".cachebake" / "versions").iterdir())
    assert "0 compiles, 8 cache hits" in verify_ok.stdout, verify_ok.stdout
    compiled = [ln for ln in verify_miss.stdout.splitlines() if ln.startswith("compile ")]
    assert len(compiled) == 4 and all("[BLOCK=64]" in ln for ln in compiled), verify_miss.stdout


def test_the_block_is_pip_then_the_walk_through():
    assert LINES[0] == "python3 -m pip install '.[triton]'"
    assert [ln.split()[1] for ln in LINES[1:]] == ["build", "inspect", "install", "verify", "verify"]
    assert [_expected_exit(ln) for ln in LINES] == [0, 0, 0, 0, 0, 8]


def test_the_walk_through_as_written(tmp_path):
    """The cachebake lines, verbatim, with this interpreter's cachebake (and its Triton)."""
    env = _clean_env(tmp_path, path_first=os.path.dirname(sys.executable))
    if not shutil.which("cachebake", path=env["PATH"]):
        pytest.fail(f"no cachebake script beside {sys.executable}: install this checkout (pip install -e .)")
    results = _run_lines(LINES[1:], tmp_path, env)
    _check_what_readme_says(results, tmp_path)


@pytest.mark.slow
def test_the_whole_block_in_a_fresh_venv(tmp_path):
    """A fresh copy of the checkout and a fresh venv (as README's Start here makes one), then
    every line of the block, pip install '.[triton]' included."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, checkout / name)
    shutil.copytree(REPO / "cachebake", checkout / "cachebake", ignore=shutil.ignore_patterns("__pycache__"))
    env = _clean_env(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", str(checkout / ".venv")], check=True, env=env)
    results = _run_lines(LINES, checkout, env, prefix=". .venv/bin/activate && ")
    assert (checkout / ".venv" / "bin" / "cachebake").exists()
    _check_what_readme_says(results, checkout)
