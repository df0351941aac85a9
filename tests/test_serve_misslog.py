"""The miss log's writer: whole lines from concurrent processes, never an exception."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import servekit

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
