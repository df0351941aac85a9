"""The miss log's writer: whole lines from concurrent processes, never an exception."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import servekit
from conftest import NOBODY

from cachebake.serve import misslog

WRITER = r"""
import os, sys, time
sys.path.insert(0, {repo!r})
from cachebake.serve import misslog
name, n = sys.argv[1], int(sys.argv[2])
while not os.path.exists({go!r}):  # start together
    time.sleep(0.001)
pad = "x" * 3000  # lines of ~3 KB: well past a pipe's atomic size, as records with long signatures are
for i in range(n):
    misslog.write(misslog.make_entry("kernel", name, "KEY", 0.1, "overlay", seq=i, pad=pad))
    if i % 100 == 99:
        time.sleep(0.002)  # let the other writer run even on a loaded machine: they must overlap
"""


def test_two_processes_lose_no_line(tmp_path):
    log = tmp_path / "overlay" / "misses.jsonl"  # the dir does not exist yet: the writer makes it
    go = tmp_path / "go"
    code = WRITER.format(repo=str(servekit.REPO), go=str(go))
    env = {**os.environ, "CACHEBAKE_MISS_LOG": str(log)}
    n = 3000
    procs = [subprocess.Popen([sys.executable, "-c", code, name, str(n)], env=env)
             for name in ("replica-a", "replica-b")]
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    lines = log.read_bytes().splitlines()
    assert len(lines) == 2 * n
    entries = [json.loads(line) for line in lines]  # every line whole
    for name in ("replica-a", "replica-b"):
        assert sorted(e["seq"] for e in entries if e["kernel"] == name) == list(range(n))
    assert {e["pid"] for e in entries} == {p.pid for p in procs}
    # Both writers really interleaved (otherwise this test proves nothing about concurrency).
    kernels = [e["kernel"] for e in entries]
    assert sum(a != b for a, b in zip(kernels, kernels[1:])) > 10


def test_unwritable_log_goes_to_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CACHEBAKE_MISS_LOG", "/proc/no/such/misses.jsonl")
    monkeypatch.setattr(misslog, "_writer", misslog._Writer())
    misslog.write({"cachebake_miss": 1, "kind": "kernel", "kernel": "k"})
    misslog.write({"cachebake_miss": 1, "kind": "kernel", "kernel": "k2"})
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("cachebake: the miss log /proc/no/such/misses.jsonl cannot be written")
    assert [json.loads(e.split("miss: ", 1)[1])["kernel"] for e in err[1:]] == ["k", "k2"]


def test_identity_from_the_downward_api(monkeypatch):
    monkeypatch.setenv("POD_NAME", "vllm-7f9c")
    monkeypatch.setenv("POD_NAMESPACE", "serving")
    monkeypatch.setenv("NODE_NAME", "gpu-node-3")
    e = misslog.make_entry("kernel", "k", "KEY", 1.5, "overlay")
    assert (e["pod"], e["namespace"], e["node"], e["pid"]) == ("vllm-7f9c", "serving", "gpu-node-3", os.getpid())
    assert e["time"].endswith("Z") and e["cachebake_miss"] == misslog.FORMAT


def test_miss_without_the_listener_still_logged(installed, tmp_path):
    """A program that replaces Triton's compilation listener after start-up: the miss is still
    logged (at the next miss or at exit), without its compile record, and says why."""
    from test_serve_layered import ALSO_NOT_IN_BAKE, IN_BAKE, NOT_IN_BAKE

    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE, ALSO_NOT_IN_BAKE],
                              servekit.serve_env(installed, tmp_path / "ovl"), replace_listener=True)
    assert out["rc"] == 0 and out["error"] is None, out["stderr"]
    lines = servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")
    assert sorted(m["kernel"] for m in lines) == ["add_kernel", "rowsum_kernel"]
    assert all(m["record"] is None and "listener did not run" in m["record_error"] for m in lines)


def _planted_log(tmp_path: Path, log: Path, plant: str) -> tuple[Path, str]:
    """Put ``plant`` where the log goes; the root-only file it may lead to, and the reason the
    writer must give."""
    secret = tmp_path / "root-only"
    secret.write_text("root's own\n")
    secret.chmod(0o600)
    if plant == "symlink":
        os.symlink(secret, log)
        return secret, "it is a symbolic link"
    if plant == "hard link":
        os.link(secret, log)
        return secret, "it has 2 hard links"
    if plant == "FIFO":
        os.mkfifo(log)  # no reader: a blocking open for writing would wait forever
        return secret, "it is a FIFO"
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file of another uid")
    log.write_text("")
    os.chown(log, NOBODY, NOBODY)
    return secret, f"it is owned by uid {NOBODY}, not this process's uid 0"


@pytest.mark.parametrize("where", ["overlay", "elsewhere"])
@pytest.mark.parametrize("plant", ["symlink", "hard link", "FIFO", "another uid's file"])
def test_planted_log_is_refused(tmp_path, monkeypatch, capsys, where, plant):
    """misses.jsonl in an overlay of ours (the default) or CACHEBAKE_MISS_LOG elsewhere,
    planted as a link to a root-only file, a hard link to it, a FIFO, or a file of another
    uid: refused in one line, the misses on stderr, the file it leads to untouched, no hang
    (an alarm fails the test)."""
    import signal

    overlay = tmp_path / "ovl"
    overlay.mkdir(mode=0o700)
    log = overlay / "misses.jsonl" if where == "overlay" else tmp_path / "logs" / "misses.jsonl"
    log.parent.mkdir(exist_ok=True)
    secret, why = _planted_log(tmp_path, log, plant)
    monkeypatch.setenv("CACHEBAKE_OVERLAY_DIR", str(overlay))
    if where == "overlay":
        monkeypatch.delenv("CACHEBAKE_MISS_LOG", raising=False)
    else:
        monkeypatch.setenv("CACHEBAKE_MISS_LOG", str(log))
    monkeypatch.setattr(misslog, "_writer", misslog._Writer())

    def hung(*_):
        raise TimeoutError("the miss log writer blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        for kernel in ("k1", "k2"):
            misslog.write(misslog.make_entry("kernel", kernel, "KEY", 0.1, "overlay"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"cachebake: the miss log {log} is refused: {why}; misses go to stderr"
    assert [json.loads(e.split("miss: ", 1)[1])["kernel"] for e in err[1:]] == ["k1", "k2"]
    assert secret.read_text() == "root's own\n"
    if plant == "another uid's file":
        assert log.read_text() == ""


def test_log_in_a_refused_overlay_goes_to_stderr(tmp_path, monkeypatch, capsys):
    """The default log lives in the overlay: when the overlay is refused (here world-writable),
    nothing is written in it and the overlay's own line is the only explanation."""
    overlay = tmp_path / "ovl"
    overlay.mkdir()
    overlay.chmod(0o777)
    monkeypatch.setenv("CACHEBAKE_OVERLAY_DIR", str(overlay))
    monkeypatch.delenv("CACHEBAKE_MISS_LOG", raising=False)
    monkeypatch.setattr(misslog, "_writer", misslog._Writer())
    misslog.write(misslog.make_entry("kernel", "k1", "KEY", 0.1, "spill"))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"cachebake: the overlay {overlay} is refused: it is group- or "
                             "world-writable (mode 0777);")
    assert len(err) == 2 and json.loads(err[1].split("miss: ", 1)[1])["kernel"] == "k1"
    assert list(overlay.iterdir()) == []


def test_log_made_private_in_the_overlay(tmp_path, monkeypatch):
    overlay = tmp_path / "new" / "ovl"
    monkeypatch.setenv("CACHEBAKE_OVERLAY_DIR", str(overlay))
    monkeypatch.setenv("CACHEBAKE_MISS_LOG", str(overlay / "logs" / "misses.jsonl"))
    monkeypatch.setattr(misslog, "_writer", misslog._Writer())
    misslog.write(misslog.make_entry("kernel", "k1", "KEY", 0.1, "overlay"))
    for d in (overlay, overlay / "logs"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert [m["kernel"] for m in servekit.miss_lines(overlay / "logs" / "misses.jsonl")] == ["k1"]


def test_a_failed_autotune_candidate_is_logged_as_strict_json(tmp_path, monkeypatch):
    """Triton times a config that fails to run as inf and writes its result file with
    json.dumps (``Infinity``); the miss line must still be strict JSON, or the strict readers
    (`cachebake misses`, fold-back) drop the line and the carried result with it."""
    from cachebake import jsonio
    from cachebake.roles import MISS_LOG_ENV

    log = tmp_path / "misses.jsonl"
    monkeypatch.setenv(MISS_LOG_ENV, str(log))
    result = b'{"key": [8192, "torch.float16"], "configs_timings": [[{"BLOCK": 1}, [Infinity, 1.0]]]}'
    misslog.note_file_miss("0" * 64, "scale_kernel.autotune.json", result, 0.5, "overlay")
    (line,) = log.read_bytes().splitlines()
    entry = jsonio.parse_json(line, "miss line")
    assert entry["kind"] == "autotune" and entry["timings"][0][1] == ["inf", 1.0]
