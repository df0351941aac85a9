"""Ctrl-C during ``cachebake replay``, as a terminal sends it: SIGINT to the whole process
group (cachebake and its compile workers).  Whenever it lands, while the workers are still
starting or while they compile, the command exits 130 with one line that says how far the
replay got and what it removed, no worker prints a traceback, no worker outlives it, and
nothing is left beside --out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_replay_engine import ALLOW_KERNELS, REPO, TESTS, jit_warmup  # noqa: F401
from test_replay_engine import recorded  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow
START_TICKS = 5  # CPU ticks: Python is running (its SIGINT handler set), still importing


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _is_worker(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _replay(recorded, out: Path) -> subprocess.Popen:  # noqa: F811
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    return subprocess.Popen([sys.executable, "-m", "cachebake.cli", "replay",
                             str(recorded / "events.record.jsonl"), "--target", "sm_120", "--out",
                             str(out), "--jobs", "2", "--json", *ALLOW_KERNELS],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group: the test is the terminal


def _wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 240) -> None:
    """Poll without sleeping: a worker's start (its interpreter importing multiprocessing's
    spawn code) is the window to hit."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"replay ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"


@pytest.mark.parametrize("when", ["workers starting", "compiling"])
def test_ctrl_c_says_what_replay_left_and_no_worker_prints_a_traceback(recorded, tmp_path, when):  # noqa: F811
    out = tmp_path / "art"
    proc = _replay(recorded, out)
    workers: list[int] = []
    if when == "workers starting":
        def ready():
            # started, and its interpreter running Python (its own SIGINT handler installed):
            # importing what the pool's initializer names
            workers[:] = [c for c in _children(proc.pid) if _is_worker(c)]
            return any(_cpu_ticks(w) >= START_TICKS for w in workers)
    else:
        def ready():
            workers[:] = [c for c in _children(proc.pid) if _is_worker(c)]
            return any(tmp_path.glob(".art.*/triton/*/__grp__*.json"))
    _wait_for(proc, ready, when)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert len(stderr.splitlines()) == 1, stderr
    (line,) = stderr.splitlines()
    assert line.startswith("cachebake: error: interrupted: replay for cuda:120 stopped after "), line
    assert "entries compiled" in line and "removed" in line and f"nothing written: {out} is as it was" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    for pid in workers:
        assert not _alive(pid), f"worker {pid} outlived the replay"


def test_a_killed_replays_work_dir_is_removed_by_the_next_run(recorded, tmp_path):  # noqa: F811
    """SIGKILL leaves the work dir beside --out (nothing can run then); the next replay into
    that --out removes it (pack's clean-up: its name, its owner, no live holder of its lock)."""
    out = tmp_path / "art"
    proc = _replay(recorded, out)
    _wait_for(proc, lambda: any(tmp_path.glob(".art.*/triton/*/__grp__*.json")), "a compiled entry")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    (left,) = [p.name for p in tmp_path.iterdir()]
    assert left.startswith(".art.tmp-replay-")
    again = _replay(recorded, out)
    _, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]
