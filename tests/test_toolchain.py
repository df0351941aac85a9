"""toolchain: whether Triton can build its launcher helpers here, found before a run starts,
with the real compiler of this machine (.ci/run installs gcc, libc6-dev and python3-dev)."""

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cachebake.toolchain import c_toolchain_problem


@pytest.fixture(autouse=True)
def fresh_answer():
    c_toolchain_problem.cache_clear()
    yield
    c_toolchain_problem.cache_clear()


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc (.ci/run installs it)")
def test_a_machine_with_gcc_and_headers_can_build(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    assert c_toolchain_problem() is None


def test_no_compiler_is_one_line_naming_the_packages(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # neither gcc nor clang
    problem = c_toolchain_problem()
    assert problem.startswith("no C compiler") and "libc6-dev and python3-dev" in problem
    assert "\n" not in problem


def test_a_compiler_that_cannot_build_an_extension(monkeypatch, tmp_path):
    # a compiler that exists but fails, as gcc does without libc6-dev ("stdio.h: No such file")
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'probe.c:1:10: fatal error: stdio.h: No such file or directory' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    problem = c_toolchain_problem()
    assert "cannot build an extension here" in problem and "stdio.h" in problem


def test_replay_refuses_before_compiling_when_there_is_no_compiler(tmp_path):
    """The CLI: exit 7, one line, nothing written (a record is enough to get that far)."""
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"format_version": 1, "compiles": [], "autotune": []}))
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "replay", str(record), "--target",
                        "sm_90", "--out", str(tmp_path / "out")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 7, r.stderr
    assert r.stderr.startswith("cachebake: error: replay builds Triton's launcher helpers with a C "
                               "compiler: the C compiler") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def _command_bake(tmp_path, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cachebake.cli", "build", "--target", "sm_90",
                           "--root", str(tmp_path / "root"), "--out", str(tmp_path / "art"), "--",
                           sys.executable, "-c", "raise SystemExit(3)"],
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_command_bake_without_a_compiler_warns_before_round_one_where_a_gpu_is(tmp_path, monkeypatch):
    from test_gpu import _fake_nvidia_smi

    _fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA H200, 9.0")  # a GPU a warmup would launch on
    r = _command_bake(tmp_path, {**os.environ, "CC": str(tmp_path / "no-such-cc")})
    assert r.returncode == 9, r.stderr  # the warmup itself failed, after the warning
    first = r.stderr.splitlines()[0]
    assert first.startswith("cachebake: warning: Triton cannot build its launcher helpers here")


def test_without_a_gpu_a_command_bake_does_not_warn_about_launching(tmp_path):
    """Nothing launches where no GPU is visible (README's CPU quick start compiles ahead of
    time): a stock Debian without gcc gets no warning about a launch that cannot happen."""
    if any(Path(d, "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("a GPU machine: this is about one without a GPU")
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "PATH": "/usr/bin:/bin"}
    r = _command_bake(tmp_path, env)
    assert r.returncode == 9, r.stderr
    assert "launcher helpers" not in r.stderr, r.stderr


def test_a_command_out_of_reach_is_named_as_such(tmp_path):
    from cachebake.drivers.command import CommandDriver
    from cachebake.errors import BadInput

    script = tmp_path / "warmup.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)  # exists, not executable
    with pytest.raises(BadInput, match=rf"not executable by uid {os.geteuid()}"):
        CommandDriver([str(script)]).preflight()
    with pytest.raises(BadInput, match="no such command$"):
        CommandDriver([str(tmp_path / "absent")]).preflight()
