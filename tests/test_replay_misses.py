"""``cachebake misses``: two replicas' real miss logs merged."""

from __future__ import annotations

import json

import pytest
import servekit
from click.testing import CliRunner
from test_serve_layered import ALSO_NOT_IN_BAKE, IN_BAKE, NOT_IN_BAKE

from cachebake.cli import main
from cachebake.errors import BadInput
from cachebake.replay.misses import merge


@pytest.fixture
def two_replicas(installed, tmp_path):
    """Replica a misses two kernels, replica b one of them; b's log ends with a torn line
    (a pod killed mid-write) and holds a line that is not a miss."""
    logs = tmp_path / "collected"
    for pod, specs in (("vllm-a", [IN_BAKE, NOT_IN_BAKE, ALSO_NOT_IN_BAKE]),
                       ("vllm-b", [IN_BAKE, ALSO_NOT_IN_BAKE])):
        overlay = tmp_path / pod
        out = servekit.run_server(specs, servekit.serve_env(installed, overlay, POD_NAME=pod))
        assert out["error"] is None, out["stderr"]
        (logs / pod).mkdir(parents=True)
        (logs / pod / "misses.jsonl").write_bytes((overlay / "misses.jsonl").read_bytes())
    with open(logs / "vllm-b" / "misses.jsonl", "a") as f:
        f.write('{"other": "tool"}\n{"cachebake_miss": 1, "kind": "ker')
    return logs


def test_merge_two_replicas(two_replicas):
    report = merge([str(two_replicas)])
    assert len(report.logs) == 2 and report.lines == 5
    assert report.unreadable == 1 and report.foreign == 1
    assert report.misses == 3 and report.replicas == ["vllm-a", "vllm-b"]
    first, second = report.groups
    assert (first.kernel, first.count, first.replicas) == ("rowsum_kernel", 2, ["vllm-a", "vllm-b"])
    assert first.first_seen < first.last_seen and "N=256" in first.specialization
    assert (second.kernel, second.count, second.replicas) == ("add_kernel", 1, ["vllm-a"])
    assert second.specialization == "*fp32,*fp32,*fp32,i32 BLOCK=2048 num_warps=4 num_stages=3"
    assert second.first_seen == second.last_seen and second.seconds > 0


def test_cli_misses(two_replicas):
    runner = CliRunner()
    res = runner.invoke(main, ["misses", str(two_replicas / "vllm-a" / "misses.jsonl"),
                               str(two_replicas / "vllm-b"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["cachebake"] == 1 and doc["command"] == "misses" and doc["ok"] is True
    assert [(g["kernel"], g["count"]) for g in doc["groups"]] == [("rowsum_kernel", 2), ("add_kernel", 1)]
    assert doc["groups"][0]["record"]["constexprs"] == [[[3], 256]]
    text = runner.invoke(main, ["misses", str(two_replicas)])
    assert text.exit_code == 0 and "3 misses of 2 kernels/specializations from 2 replicas" in text.output
    assert "rowsum_kernel" in text.output


def test_bad_inputs(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["misses", str(tmp_path / "nope")])
    assert res.exit_code == 3 and "no such miss log" in res.output
    with pytest.raises(BadInput, match="no \\*.jsonl miss logs"):
        merge([str(tmp_path)])
    (tmp_path / "empty.jsonl").write_text("")
    assert merge([str(tmp_path)]).misses == 0


HOSTILE_KERNEL = "\x1b]0;owned\x07[/x][link=file:///etc/passwd]k\x1b[2J"


@pytest.fixture
def hostile_logs(two_replicas, tmp_path):
    """A real log plus, in a second pod's file, every kind of bad line a pod could write,
    and files in the directory that are not logs: a FIFO (would block a reader) and a link."""
    import os

    d = two_replicas
    good = json.loads((d / "vllm-a" / "misses.jsonl").read_text().splitlines()[0])
    bad = [
        {**good, "seconds": "12 s"},  # a string seconds
        {**good, "record": ["not", "an", "object"]},
        {**good, "key": ["K"] * 52},  # a list key
        {**good, "kind": "exec"},
        {**good, "cachebake_miss": True},  # not the format number, though True == 1 in Python
        {**good, "seconds": -1},
    ]
    lines = [json.dumps(e) for e in bad]
    lines.append('{"cachebake_miss": 1, "x": ' + "[" * 200_000 + "]" * 200_000 + "}")  # deep
    lines.append('{"cachebake_miss": 1, "pad": "' + "x" * (2 << 20) + '"}')  # over the line bound
    # an unpaired \ud800 escape: no UTF-8 stream can print the str json.loads makes of it
    lines.append(json.dumps({**good, "kernel": "add_kernel"}).replace('"add_kernel"', '"add\\ud800_kernel"'))
    lines.append(json.dumps({**good, "kernel": HOSTILE_KERNEL, "pod": "pod-\x1b[31mred",
                             "time": "2026-11-30T20:02:12.920Z\x1b[2K"}))
    (d / "vllm-c").mkdir()
    (d / "vllm-c" / "misses.jsonl").write_text("\n".join(lines) + "\n")
    os.mkfifo(d / "vllm-c" / "blocked.jsonl")
    (d / "vllm-c" / "link.jsonl").symlink_to("/etc/passwd")
    return d


def test_bad_lines_are_counted_never_fatal(hostile_logs):
    report = merge([str(hostile_logs)])
    assert report.malformed == 5 and report.unreadable == 4 and report.foreign == 2
    assert sorted(p.rsplit("/", 1)[1] for p in report.skipped) == [
        "blocked.jsonl (not a regular file)", "link.jsonl (not a regular file)"]
    assert any(g.kernel == HOSTILE_KERNEL for g in report.groups)  # kept as data, shown escaped


def test_cli_prints_hostile_names_as_text(hostile_logs):
    import subprocess
    import sys

    # a real process on a real stdout (a FIFO that is opened would hang it: the timeout says so)
    run = subprocess.run([sys.executable, "-m", "cachebake.cli", "misses", str(hostile_logs)],
                         capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "COLUMNS": "300"})
    assert run.returncode == 0, run.stderr
    assert "\x1b" not in run.stdout + run.stderr and "\x07" not in run.stdout
    assert "[/x][link=file:///etc/passwd]k" in run.stdout  # markup shown as text, not applied
    assert "lines skipped: 4 unreadable, 2 foreign, 5 malformed" in run.stdout
    assert "Traceback" not in run.stderr and run.stderr == ""
    doc = json.loads(subprocess.run([sys.executable, "-m", "cachebake.cli", "misses", str(hostile_logs),
                                     "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert (doc["malformed_lines"], doc["unreadable_lines"], doc["foreign_lines"]) == (5, 4, 2)


def test_a_fifo_or_link_named_as_a_log(tmp_path):
    import os

    os.mkfifo(tmp_path / "f.jsonl")
    res = CliRunner().invoke(main, ["misses", str(tmp_path / "f.jsonl")])
    assert res.exit_code == 3 and "not a regular file or a directory" in res.output
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nothing")
    res = CliRunner().invoke(main, ["misses", str(tmp_path / "dangling.jsonl")])
    assert res.exit_code == 3 and "a link to nothing" in res.output


def test_a_directory_nested_past_the_recursion_limit_is_walked_without_recursion(two_replicas, tmp_path):
    """os.walk recurses once per level: a pod's tree 1200 deep was an internal error (exit 1).
    Logs within MAX_LOG_DEPTH are found; deeper dirs are skipped and listed."""
    import os

    from cachebake.replay.misses import MAX_LOG_DEPTH

    good = (two_replicas / "vllm-a" / "misses.jsonl").read_bytes()
    top = tmp_path / "deep"
    q = str(top)
    os.mkdir(q)
    for level in range(1, 1201):
        q += "/d"
        os.mkdir(q)
        if level in (2, MAX_LOG_DEPTH + 1):
            with open(q + "/misses.jsonl", "wb") as f:
                f.write(good)
    try:
        report = merge([str(top)])
        assert report.logs == [str(top / "d" / "d" / "misses.jsonl")]
        assert len(report.skipped) == 1 and "over 16 directories deep" in report.skipped[0]
        res = CliRunner().invoke(main, ["misses", str(top) + "/d" * (MAX_LOG_DEPTH + 2)])  # below both logs
        assert res.exit_code == 3 and "Traceback" not in res.output
        assert "no *.jsonl miss logs" in res.output and "directories deep" in res.output
    finally:  # bottom up, without recursion: pytest's own cleanup (shutil.rmtree) would hit the limit
        while q != os.path.dirname(str(top)):
            for name in os.listdir(q):
                if not os.path.isdir(os.path.join(q, name)):
                    os.unlink(os.path.join(q, name))
            os.rmdir(q)
            q = os.path.dirname(q)
