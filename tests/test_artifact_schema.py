"""cachebake.artifact.schema: bounded reads and strict parsing of an artifact's documents."""

import json
import os
import threading

import pytest

from cachebake import jsonio
from cachebake.artifact import schema
from cachebake.errors import CorruptArtifact, InvalidDocument, Unsupported


def test_reads_only_regular_files_and_never_blocks_on_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def read():
        with pytest.raises(InvalidDocument, match="not a regular file \\(a FIFO\\)"):
            jsonio.read_document(fifo, "index.json", 1024)
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert done.wait(10), "reading a FIFO blocked"
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    (tmp_path / "elsewhere").write_text("{}")
    with pytest.raises(InvalidDocument, match="symbolic link"):
        jsonio.read_document(tmp_path / "link", "d", 1024)
    with pytest.raises(CorruptArtifact, match="is missing"):
        jsonio.read_document(tmp_path / "absent", "d", 1024)


def test_size_cap_is_checked_before_reading(tmp_path):
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(1 << 40)  # sparse: refused from fstat, never read
    with pytest.raises(InvalidDocument, match="over the 4096"):
        jsonio.read_document(big, "d", 4096)


@pytest.mark.parametrize("text,reason", [
    ('{"a": 1, "a": 2}', "appears twice"),
    ('{"a": NaN}', "holds NaN"),
    ("[" * 33 + "]" * 33, "nests deeper than 32"),
    ('{"a": "' + "[" * 100 + '"}', None),  # brackets inside a string are not nesting
    (b'{"a": "\xff"}', "is not UTF-8"),
    ('{"a": 1', "is not valid JSON"),
])
def test_strict_parsing(text, reason):
    if reason is None:
        assert jsonio.parse_json(text, "d")["a"].startswith("[")
        return
    with pytest.raises(InvalidDocument, match=reason):
        jsonio.parse_json(text, "d")


def test_integer_fields_refuse_booleans_and_floats():
    c = schema.Checker("doc")
    assert c.integer(3, "n") == 3
    for bad in (True, 3.0, "3", None):
        with pytest.raises(InvalidDocument, match="doc: n: must be an integer"):
            c.integer(bad, "n")


def _bake(**over) -> dict:
    layer = {"media_type": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": "sha256:" + "a" * 64,
             "diff_id": "sha256:" + "b" * 64, "size": 100, "tar_size": 10240, "uncompressed_size": 10,
             "entries": 3, "files": 1, "compression": "zstd-19"}
    doc = {"format_version": 1, "target": "cuda:90", "fingerprint": {"target": "cuda:90"}, "roles": ["triton"],
           "layer_root": "/var/cache/cachebake", "layer": layer,
           "inventory": {"kernels": [], "autotune": [], "helpers": [], "dropped": [], "other_files": {}}}
    doc.update(over)
    return doc


@pytest.mark.parametrize("over,error,field", [
    ({"format_version": True}, InvalidDocument, "format_version"),
    ({"format_version": 2}, Unsupported, None),
    ({"roles": "triton"}, InvalidDocument, "roles"),
    ({"roles": [".cachebake"]}, InvalidDocument, "roles[0]"),
    ({"roles": ["triton", "triton"]}, InvalidDocument, "roles"),
    ({"roles": []}, InvalidDocument, "roles"),
    ({"target": "cuda:90/../x"}, InvalidDocument, "target"),
    ({"layer_root": "relative"}, InvalidDocument, "layer_root"),
    ({"inventory": []}, InvalidDocument, "inventory"),
])
def test_bake_manifest_fields(over, error, field):
    with pytest.raises(error) as e:
        schema.check_bake_manifest(_bake(**over), "label")
    if field is not None:
        assert e.value.field == field


@pytest.mark.parametrize("key,value", [("tar_size", 10241), ("tar_size", -1), ("entries", 21),
                                       ("files", 4), ("uncompressed_size", 20000), ("size", "100")])
def test_layer_facts_ranges(key, value):
    bake = _bake()
    bake["layer"][key] = value
    with pytest.raises(InvalidDocument, match=f"layer.{key}"):
        schema.check_bake_manifest(bake, "label")


def test_a_good_bake_manifest_and_summary_pass():
    schema.check_bake_manifest(_bake(), "label")
    bakes = schema.check_summary({"format_version": 1, "bakes": {"cuda:90": _bake()}})
    assert list(bakes) == ["cuda:90"]
    with pytest.raises(InvalidDocument, match="filed under"):
        schema.check_summary({"format_version": 1, "bakes": {"cuda:120": _bake()}})
    assert json.loads(json.dumps(bakes))
