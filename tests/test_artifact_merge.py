"""``cachebake merge``: real bakes for two GPU targets (Triton compiles for sm_90 and sm_120 on
CPU) into one artifact; install picks the bake of the GPU it sees; push writes one tag each."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

import aot
from containerkit import engines  # noqa: F401
from installkit import cli, env_with
from cachebake.artifact.merge import merge_artifacts
from cachebake.artifact.oci import open_artifact
from cachebake.artifact.pack import pack_artifact, parse_root
from cachebake.capture.record import CompileRecord
from cachebake.capture.recorder import triton_build
from cachebake.cli import main
from cachebake.errors import BadInput, ExitCode


@pytest.fixture(scope="module")
def two(_built_cache, tmp_path_factory):
    """A real sm_90 bake and a real sm_120 one, both carrying the same compile record."""
    base = tmp_path_factory.mktemp("merge")
    record = CompileRecord(**triton_build())
    c90 = base / "c90" / "triton"
    shutil.copytree(_built_cache, c90)
    c120 = base / "c120" / "triton"
    aot.compile_in_subprocess(c120, target=("cuda", 120, 32))
    pack_artifact([parse_root(f"triton={c90}")], base / "A90", target="sm_90", record=record)
    pack_artifact([parse_root(f"triton={c120}")], base / "B120", target="sm_120", record=record)
    return base


def _blobs(layout: Path) -> set[str]:
    return {p.name for p in (layout / "blobs" / "sha256").iterdir()}


def test_merge_holds_one_bake_per_target_blobs_once(two, tmp_path):
    out = tmp_path / "M"
    r = CliRunner().invoke(main, ["merge", str(two / "A90"), str(two / "B120"), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["targets"] == ["cuda:120", "cuda:90"]
    art = open_artifact(out)
    assert art.targets() == ["cuda:120", "cuda:90"]
    for t, src in (("cuda:90", "A90"), ("cuda:120", "B120")):
        ref = art.select(t)
        assert ref.manifest_digest == open_artifact(two / src).select(t).manifest_digest
    # the layout holds exactly the union of the two, the shared record blob once
    union = _blobs(two / "A90") | _blobs(two / "B120")
    assert _blobs(out) == union
    assert len(union) == len(_blobs(two / "A90")) + len(_blobs(two / "B120")) - 1
    assert doc["shared_blobs"] == 1 and doc["blobs"] == len(union)
    index = json.loads((out / "index.json").read_text())
    names = [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]
    assert sorted(names) == ["sm_120", "sm_90"]
    assert sorted(json.loads((out / "cachebake.json").read_text())["bakes"]) == ["cuda:120", "cuda:90"]


def test_two_bakes_for_one_target_are_refused_nothing_written(two, tmp_path):
    out = tmp_path / "M"
    with pytest.raises(BadInput, match="two bakes for cuda:90"):
        merge_artifacts([two / "A90", two / "A90"], out)
    assert not out.exists()
    r = CliRunner().invoke(main, ["merge", str(two / "A90"), "--out", str(out)])
    assert r.exit_code == ExitCode.BAD_INPUT


def test_a_corrupt_layer_is_refused_before_writing(two, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(two / "B120", bad)
    ref = open_artifact(bad).select()
    layer = bad / "blobs" / "sha256" / ref.layer_digest.split(":")[1]
    layer.write_bytes(layer.read_bytes()[:-7] + b"\0" * 7)
    r = CliRunner().invoke(main, ["merge", str(two / "A90"), str(bad), "--out", str(tmp_path / "M")])
    assert r.exit_code == ExitCode.CORRUPT and not (tmp_path / "M").exists()


def _gpu(tmp_path: Path, line: str) -> dict:
    # No GPU here: a stand-in nvidia-smi answers the one query cachebake makes
    # (`--query-gpu=name,compute_cap --format=csv,noheader`) as the real one prints it.
    bindir = tmp_path / f"bin-{abs(hash(line))}"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{line}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return env_with(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("gpu, target", [("NVIDIA H200, 9.0", "cuda:90"),
                                         ("NVIDIA GeForce RTX 5090, 12.0", "cuda:120")])
def test_install_picks_the_local_gpus_bake(two, tmp_path, gpu, target):
    merged = tmp_path / "M"
    merge_artifacts([two / "A90", two / "B120"], merged)
    r = cli("install", merged, "--to", tmp_path / "c", "--json", env=_gpu(tmp_path, gpu))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["target"] == target
    assert report["layer_digest"] == open_artifact(merged).select(target).layer_digest
    kernels = [json.loads(p.read_text()) for p in (tmp_path / "c" / "triton").glob("*/*.json")
               if not p.name.startswith("__grp__") and "target" in p.read_text()]
    assert kernels and {f"cuda:{k['target']['arch']}" for k in kernels} == {target}


@pytest.mark.containers
def test_push_of_a_merged_artifact_tags_each_target(engines, two, tmp_path):
    merged = tmp_path / "M"
    merge_artifacts([two / "A90", two / "B120"], merged)
    repo = f"docker://{engines.registry}/bakes/merged"
    r = cli("push", merged, repo, "--json")
    assert r.returncode == 0, r.stderr
    pushed = json.loads(r.stdout)["pushed"]
    assert sorted(p["reference"] for p in pushed) == [f"{repo}:sm_120", f"{repo}:sm_90"]
    # each tag is one image (what an image volume mounts), the bake of its target
    for p in pushed:
        r = cli("install", p["reference"], "--to", tmp_path / p["reference"][-6:], "--target",
                p["reference"].rsplit(":", 1)[1], "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["layer_digest"] == p["layer_digest"]
    # and back: the two tags merged into one artifact again, image for image
    again = tmp_path / "M2"
    r = cli("merge", *(p["reference"] for p in pushed), "--out", again, "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(r.stdout)["targets"]) == ["cuda:120", "cuda:90"]
    for t in ("cuda:90", "cuda:120"):
        assert open_artifact(again).select(t).layer_digest == open_artifact(merged).select(t).layer_digest


def test_a_blob_that_is_a_link_is_not_followed(two, tmp_path):
    """A layout whose layer blob is a symlink to the real bytes elsewhere: the reader opens
    blobs without following links, so the merge refuses it and writes nothing."""
    bad = tmp_path / "bad"
    shutil.copytree(two / "B120", bad)
    ref = open_artifact(bad).select()
    layer = bad / "blobs" / "sha256" / ref.layer_digest.split(":")[1]
    elsewhere = tmp_path / "elsewhere"
    layer.rename(elsewhere)
    layer.symlink_to(elsewhere)
    r = CliRunner().invoke(main, ["merge", str(two / "A90"), str(bad), "--out", str(tmp_path / "M")])
    assert r.exit_code in (ExitCode.CORRUPT, ExitCode.UNSAFE, ExitCode.BAD_INPUT), r.output
    assert not (tmp_path / "M").exists() and "Traceback" not in r.output


@pytest.mark.parametrize("at", ["blob", "written", "swapped", "old-removed"])
def test_ctrl_c_at_a_step_leaves_the_old_artifact_or_the_merged_one(two, tmp_path, at):
    """merge writes --out through pack's destination (cachebake.artifact.destination): a Ctrl-C
    at any step leaves --out whole, says which, and leaves nothing beside it."""
    from cachebake.errors import Interrupted

    out = tmp_path / "M"
    shutil.copytree(two / "A90", out)

    def interrupt(what: str) -> None:
        if what == at:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as e:
        merge_artifacts([two / "A90", two / "B120"], out, checkpoint=interrupt)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".M.")) == []
    if at in ("blob", "written"):
        assert e.value.state == f"nothing written: {out} is as it was"
        assert open_artifact(out).targets() == ["cuda:90"]
    else:
        assert e.value.state == f"{out} holds the new artifact: the merge had finished"
        assert open_artifact(out).targets() == ["cuda:120", "cuda:90"]
