"""inspect: every blob verified (exit 5 on a corrupted or missing one), every source install
reads, full digests and never "None", one JSON envelope."""

import json
import re
import shutil

import aot
import badlayers
import pytest
from click.testing import CliRunner

from cachebake.artifact.pack import pack_artifact, parse_root
from cachebake.cli import main
from cachebake.errors import ExitCode


@pytest.fixture
def artifact(triton_cache, tmp_path):
    out = tmp_path / "art"
    pack_artifact([parse_root(f"triton={triton_cache}")], out, target="sm_90")
    return out


def inspect(*args):
    return CliRunner().invoke(main, ["inspect", *map(str, args)])


def test_text_shows_full_digests_and_no_none(artifact):
    r = inspect(artifact)
    assert r.exit_code == 0, r.output
    summary = json.loads((artifact / "cachebake.json").read_text())["bakes"]["cuda:90"]
    assert summary["manifest_digest"] in r.stdout and summary["layer"]["digest"] in r.stdout
    assert "None" not in r.stdout
    assert all(len(d) == 64 for d in re.findall(r"sha256:([0-9a-f]+)", r.stdout))  # never cut
    assert "every blob verified" in r.stdout and "add_kernel" in r.stdout and "3.6.0" in r.stdout


def test_json_is_the_envelope(artifact):
    r = inspect(artifact, "--json")
    doc = json.loads(r.stdout)
    assert (doc["cachebake"], doc["command"], doc["ok"], doc["kind"]) == (1, "inspect", True, "oci-layout")
    [bake] = doc["bakes"]
    assert bake["target"] == "cuda:90" and bake["verified"] is True
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", bake["manifest_digest"])
    assert bake["layer_digest"] == bake["manifest"]["layer"]["digest"]
    assert bake["summary"]["kernels"] == len(aot.SPECS) and bake["summary"]["autotune"] == 1


@pytest.mark.parametrize("damage", ["flip_a_byte", "truncate", "remove", "remove_config"])
def test_a_damaged_blob_is_exit_5(artifact, damage):
    layer = badlayers.layer_blob(artifact)
    if damage == "flip_a_byte":
        data = bytearray(layer.read_bytes())
        data[len(data) // 2] ^= 1
        layer.write_bytes(bytes(data))
    elif damage == "truncate":
        layer.write_bytes(layer.read_bytes()[:-10])
    elif damage == "remove":
        layer.unlink()
    else:
        index = json.loads((artifact / "index.json").read_text())
        image = json.loads((artifact / "blobs/sha256" / index["manifests"][0]["digest"][7:]).read_text())
        (artifact / "blobs/sha256" / image["config"]["digest"][7:]).unlink()
    for args in ([artifact], [artifact, "--json"]):
        r = inspect(*args)
        assert r.exit_code == ExitCode.CORRUPT, r.output
        assert len(r.stderr.splitlines()) == 1 and re.match(r"cachebake: error: (layer )?blob sha256:", r.stderr)
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["error"]["code"] == 5 and doc["error"]["kind"] == "corrupt-artifact"


def test_reads_the_tar_zst_form_install_accepts(artifact, tmp_path):
    layer = tmp_path / "bake.tar.zst"
    shutil.copy(badlayers.layer_blob(artifact), layer)
    shutil.copy(artifact / "cachebake.json", tmp_path / "cachebake.json")
    r = inspect(layer)
    assert r.exit_code == 0, r.output
    assert "(layer-file)" in r.stdout and "None" not in r.stdout
    doc = json.loads(inspect(layer, "--json").stdout)
    assert doc["kind"] == "layer-file" and doc["bakes"][0]["manifest_digest"] is None
    data = bytearray(layer.read_bytes())
    data[100] ^= 1
    layer.write_bytes(bytes(data))
    assert inspect(layer).exit_code == ExitCode.CORRUPT


def test_missing_and_wrong_target(artifact, tmp_path):
    assert inspect(tmp_path / "nope").exit_code == ExitCode.BAD_INPUT
    assert inspect(artifact, "--target", "sm_120").exit_code == ExitCode.UNSUPPORTED
    assert inspect(artifact, "--target", "sm_999").exit_code == ExitCode.USAGE
