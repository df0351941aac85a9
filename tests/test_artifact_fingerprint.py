"""The fingerprint: what is read from this process, how differences are reported, and its one
JSON form (the manifest's section and the file `fingerprint --out` writes are the same object)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cachebake.artifact.fingerprint import Fingerprint, compare_fingerprints, current_fingerprint
from cachebake.errors import BadInput, InvalidDocument


def test_each_difference_is_one_line_with_its_consequence():
    baked = current_fingerprint("sm_90")
    same = Fingerprint.from_json(baked.to_json())
    assert same == baked and compare_fingerprints(baked, same) == []
    other = Fingerprint.from_json({**baked.to_json(), "triton_key": "3.5.1-abc", "gpu_name": "NVIDIA H100",
                                   "env": {"TRITON_DEFAULT_FP_FUSION": "true"}, "bake_paths": {"triton": "/x"}})
    fields = {m.field: str(m) for m in compare_fingerprints(baked, other)}
    assert set(fields) == {"triton_key", "env"}  # the name is unknown on the baked side (no GPU here)
    assert "every kernel recompiles" in fields["triton_key"] and "\n" not in fields["triton_key"]
    named = Fingerprint.from_json({**baked.to_json(), "gpu_name": "NVIDIA H200"})
    assert [m.field for m in compare_fingerprints(named, other)] == ["triton_key", "env", "gpu_name"]


def test_a_long_value_is_cut_where_the_two_differ_not_at_their_shared_prefix():
    # triton_key is the version, then hashes; two builds of one version share a long prefix
    baked = current_fingerprint("sm_90")
    key = baked.triton_key
    assert key and len(key) > 200
    changed = key[:150] + ("0" if key[150] != "0" else "1") + key[151:]
    other = Fingerprint.from_json({**baked.to_json(), "triton_key": changed})
    line = str(compare_fingerprints(baked, other)[0])
    before, after = line.split(", here ")
    shown_baked, shown_here = before.split("baked ", 1)[1], after.split(" -> ", 1)[0]
    assert shown_baked != shown_here  # the difference is on the line
    assert shown_baked.startswith("...") and key[130:151] in shown_baked and changed[130:151] in shown_here
    assert len(shown_baked) <= 90 and len(shown_here) <= 90 and "\n" not in line
    # short values stay whole
    short = Fingerprint.from_json({**baked.to_json(), "triton_key": "3.5.1-abc"})
    assert "here 3.5.1-abc -> " in str(compare_fingerprints(baked, short)[0])


def test_unknown_fields_from_a_newer_cachebake_are_ignored():
    fp = Fingerprint.from_json({"target": "cuda:90", "future_field": 1})
    assert fp.target == "cuda:90"
    with pytest.raises(InvalidDocument, match="target: is missing"):
        Fingerprint.from_json({"triton_version": "3.6.0"})


@pytest.mark.parametrize("field, value", [("triton_key", 3), ("env", {"A": 1}), ("env", ["A"]),
                                          ("target", "sm_90"), ("gpu_name", "x" * 70000)])
def test_a_field_of_the_wrong_type_is_refused_by_name(field, value):
    with pytest.raises(InvalidDocument) as e:
        Fingerprint.from_json({"target": "cuda:90", field: value}, "fingerprint file f.json")
    assert e.value.document == "fingerprint file f.json" and e.value.field.startswith(field)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cachebake.cli", *map(str, args)], capture_output=True,
                          text=True, cwd="/", env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_the_file_fingerprint_out_writes_is_the_fingerprint_itself(tmp_path):
    """One writer, one format: the file is ``Fingerprint.to_json()``, 0644 whatever the umask,
    and reads back equal; the JSON envelope of the command carries the same object."""
    out = tmp_path / "fp.json"
    old = os.umask(0o077)
    try:
        r = _cli("fingerprint", "--target", "sm_90", "--out", out, "--json")
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    written = json.loads(out.read_text())
    assert written == current_fingerprint("sm_90").to_json()
    assert json.loads(r.stdout)["fingerprint"] == written
    assert out.stat().st_mode & 0o777 == 0o644
    assert Fingerprint.read(out) == Fingerprint.from_json(written)


def test_the_envelope_older_cachebakes_wrote_still_reads(tmp_path):
    """Before 0.2, `fingerprint --out` wrote the command's JSON envelope: still read."""
    fp = current_fingerprint("sm_90")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"cachebake": 1, "command": "fingerprint", "ok": True, "target": fp.target,
                               "fingerprint": fp.to_json(), "out": str(old)}))
    assert Fingerprint.read(old) == fp


@pytest.mark.parametrize("content", [b"", b"{", b'{"target": "cuda:90", "env": {"A": 1}}', b"[]",
                                     b'{"target": "cuda:90", "target": "cuda:80"}'])
def test_a_malformed_file_is_bad_input_naming_it(tmp_path, content):
    f = tmp_path / "fp.json"
    f.write_bytes(content)
    with pytest.raises(BadInput, match=f"fingerprint file {f}"):
        Fingerprint.read(f)
    with pytest.raises(BadInput, match="is missing"):
        Fingerprint.read(tmp_path / "absent.json")
