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


# ---- every VLLM_* variable present at bake (issue 29) ----------------------------------------

def test_vllm_variables_are_recorded_credentials_by_presence_only():
    from cachebake.artifact.fingerprint import PRESENT_ONLY, vllm_environment

    env = {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_API_KEY": "s3cret", "VLLM_HF_TOKEN": "hf_x",
           "VLLM_CACHE_ROOT": "/var/cache/cachebake/vllm", "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
           "TRITON_CACHE_DIR": "/x", "vllm_lower": "1", "VLLM_TOKENIZER_POOL": "2"}
    got = vllm_environment(env)
    assert got == {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_API_KEY": PRESENT_ONLY,
                   "VLLM_HF_TOKEN": PRESENT_ONLY, "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
                   "VLLM_TOKENIZER_POOL": "2"}  # TOKENIZER is no TOKEN; the role dir is install's
    assert "s3cret" not in json.dumps(got) and "hf_x" not in json.dumps(got)


def _with_vllm_env(fp, env):
    return Fingerprint.from_json({**fp.to_json(), "vllm_env": env})


def test_a_hashed_variable_set_otherwise_refuses_an_unhashed_one_warns():
    from cachebake.errors import PreflightMismatch
    from cachebake.install import preflight

    base = current_fingerprint("sm_90")
    baked = _with_vllm_env(base, {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_MOE_ROUTE": "a"})
    hashed = {"VLLM_USE_V2_MODEL_RUNNER": True, "VLLM_CONFIG_ROOT": "/root/.config/vllm"}
    # the route variable differs (not hashed: one warning line); the runner as baked
    here = _with_vllm_env(base, {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_MOE_ROUTE": "b"})
    lines = preflight.check(baked, here, allow_mismatch=False, hashed=hashed)
    assert len(lines) == 1 and lines[0].startswith("env VLLM_MOE_ROUTE: baked a, here b")
    assert "does not hash it" in lines[0]
    # a hashed variable set here only, to another value than vLLM hashed: refused
    moved = _with_vllm_env(base, {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_MOE_ROUTE": "a",
                                  "VLLM_CONFIG_ROOT": "/home/srv/.config/vllm"})
    with pytest.raises(PreflightMismatch, match="env VLLM_CONFIG_ROOT: baked \\(unset\\), here /home/srv"):
        preflight.check(baked, moved, allow_mismatch=False, hashed=hashed)
    assert len(preflight.check(baked, moved, allow_mismatch=True, hashed=hashed)) == 1
    # ... exported with the value vLLM hashed at bake (serve-args' pin): the same hash
    pinned = _with_vllm_env(base, {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_MOE_ROUTE": "a",
                                   "VLLM_CONFIG_ROOT": "/root/.config/vllm"})
    assert preflight.check(baked, pinned, allow_mismatch=False, hashed=hashed) == []
    # unset here: the runner variable is hashed
    unset = _with_vllm_env(base, {"VLLM_MOE_ROUTE": "a"})
    with pytest.raises(PreflightMismatch, match="VLLM_USE_V2_MODEL_RUNNER: baked 1, here \\(unset\\)"):
        preflight.check(baked, unset, allow_mismatch=False, hashed=hashed)


def test_the_kept_vllm_024_artifact_records_no_variables_and_is_still_read(tmp_path):
    """tests/data's H200 bake predates the field: read as None, compared as nothing, written
    back in its own form."""
    import tarfile
    from pathlib import Path

    from cachebake.artifact.reader import open_source
    from cachebake.install import preflight

    art = Path(__file__).parent / "data" / "nemotron-h-8b-vllm-0.24-sm_90-2026-12-01.artifact.tar"
    with tarfile.open(art) as tar:
        for m in tar.getmembers():
            assert not m.name.startswith("/") and ".." not in m.name.split("/")
        tar.extractall(tmp_path)
    manifest = open_source(str(tmp_path / "cachebake-nemotron-h")).select("cuda:90").manifest
    fp = manifest.fingerprint
    assert fp.vllm_version == "0.24.0" and fp.vllm_env is None and "vllm_env" not in fp.to_json()
    hashed = preflight.hashed_vllm_variables(manifest.bake.to_json())
    assert "VLLM_CONFIG_ROOT" in hashed  # vLLM 0.24 hashed it
    here = _with_vllm_env(fp, {"VLLM_CONFIG_ROOT": "/elsewhere"})
    assert preflight.check(fp, here, allow_mismatch=False, hashed=hashed) == []


def test_a_vllm_env_that_is_not_vllm_variables_is_refused():
    with pytest.raises(InvalidDocument, match="vllm_env"):
        Fingerprint.from_json({"target": "cuda:90", "vllm_env": {"LD_PRELOAD": "/x.so"}})
    with pytest.raises(InvalidDocument, match="vllm_env"):
        Fingerprint.from_json({"target": "cuda:90", "vllm_env": {"VLLM_X": 1}})
