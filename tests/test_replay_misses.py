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
