"""install.json as a typed document (InstallMarker): what install writes reads back equal; a
marker with a field of the wrong type is refused by name to readers (serve-args, verify: exit
5, never taken for no install) and is damage that the next install repairs."""

from __future__ import annotations

import json

import pytest
from installkit import baked  # noqa: F401

from cachebake.errors import InvalidDocument
from cachebake.install import install_artifact
from cachebake.install.atomic import InstallDir
from cachebake.install.inventory import InstallMarker


@pytest.fixture
def install_dir(baked, tmp_path):
    to = tmp_path / "c"
    report = install_artifact(baked["artifact"], to, target="sm_90")
    return to, report


def _marker_file(to):
    return to / ".cachebake" / "current" / "install.json"


def test_what_install_writes_is_the_marker_and_reads_back_equal(install_dir):
    to, report = install_dir
    doc = json.loads(_marker_file(to).read_text())
    marker = InstallMarker.from_json(doc)
    assert marker.to_json() == doc
    assert InstallDir(to).installed() == marker
    assert (marker.layer_digest, list(marker.roles), marker.serve_at) == \
        (report.layer_digest, report.roles, report.serve_at)
    assert len(marker.files) == report.files and marker.sealed_ctime_ns > 0


@pytest.mark.parametrize("field, value", [("left_out", {"vllm": 3}), ("left_out", {"../etc": "x"}), ("roles", ["triton", "nope"]),
                                          ("files", {"triton/x": "12"}), ("layer_digest", "sha256:xyz"),
                                          ("sealed_ctime_ns", True), ("relocated", []),
                                          # names check_tree stats and messages print (a forged marker)
                                          ("files", {"triton/../../../etc/passwd": 1}), ("files", {"/etc/passwd": 1}),
                                          ("files", {"vllm/x": 1}), ("files", {"triton/a\x00b": 1}),
                                          ("files", {"triton/\x9b2Jx": 1}), ("dirs", ["triton/.."]),
                                          ("dirs", ["triton//x"])])
def test_a_wrong_field_is_refused_by_name_and_the_next_install_repairs(install_dir, baked, field, value):
    to, report = install_dir
    path = _marker_file(to)
    doc = json.loads(path.read_text())
    with pytest.raises(InvalidDocument) as e:
        InstallMarker.from_json({**doc, field: value})
    assert e.value.field.startswith(field)
    path.chmod(0o644)
    path.write_text(json.dumps({**doc, field: value}))
    with pytest.raises(InvalidDocument):  # readers (serve-args, verify): a damaged install, not none
        InstallDir(to).installed()
    again = install_artifact(baked["artifact"], to, target="sm_90")
    assert again.status == "replaced" and InstallDir(to).installed().to_json()["layer_digest"] == report.layer_digest
