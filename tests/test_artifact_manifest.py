"""The bake manifest's typed parts: the bake section (BakeRecord) read once, checked, and
written back as the same document; a forged section is refused by field, never rendered."""

from __future__ import annotations

import json
import tarfile

import pytest

import badlayers
from badlayers import Entry
from installkit import cli, current_fingerprint_dict

from cachebake.artifact.manifest import BakeRecord
from cachebake.artifact.oci import open_artifact
from cachebake.artifact.pack import pack_artifact, parse_root
from cachebake.errors import ExitCode, InvalidDocument

KEY = "A" * 52
ENTRIES = [Entry("triton", tarfile.DIRTYPE), Entry(f"triton/{KEY}", tarfile.DIRTYPE),
           Entry(f"triton/{KEY}/k.cubin", data=b"\x7fELF" + b"x" * 100),
           Entry(f"triton/{KEY}/k.json", data=b'{"name": "k"}')]

# What a vllm-driver build writes (bake/build.py: describe + env + rounds + the driver's record),
# trimmed: known fields of every type, and keys only the driver knows.
SECTION = {
    "driver": "vllm", "function": "cachebake.vllm.engine:run",
    "model": {"path": "/models/nemotron-h-8b", "mamba": {"heads": 128}},
    "serve_args": {"max_model_len": 4096}, "serve_env": {"VLLM_USE_V2_MODEL_RUNNER": "1"},
    "env": {"root": "/var/cache/cachebake", "roles": ["triton", "vllm"],
            "pinned": {"VLLM_CACHE_ROOT": "/var/cache/cachebake/vllm"}, "invalidating_env_vars": {}},
    "stable": True, "until_stable": True, "quiet_rounds": 2, "max_rounds": 8, "rounds": 3,
    "per_round": [{"round": 1, "compiles": 4}], "compiles": 4, "compile_seconds_moved": 12.5,
    "autotune_seconds_moved": "nan", "events": [{"kind": "compile", "kernel": "k", "step": "warmup"}],
    "plan_digest": "sha256:" + "0" * 64, "model_runner": "v2",
}


def test_a_section_reads_typed_and_writes_back_the_same_document():
    rec = BakeRecord.from_json(SECTION)
    assert (rec.driver, rec.stable, rec.rounds, rec.quiet_rounds) == ("vllm", True, 3, 2)
    assert rec.env["pinned"]["VLLM_CACHE_ROOT"] == "/var/cache/cachebake/vllm"
    assert rec.events[0]["step"] == "warmup" and rec.unverified_on_target is None
    assert set(rec.extra) == {"function", "until_stable", "max_rounds", "per_round", "plan_digest",
                              "model_runner"}
    assert rec.to_json() == SECTION
    assert BakeRecord.from_json({}).to_json() == {}  # a bake packed without one


def test_pack_keeps_the_section_and_inspect_shows_it(triton_cache, tmp_path):
    art = tmp_path / "art"
    pack_artifact([parse_root(f"triton={triton_cache}")], art, target="sm_90", bake=SECTION)
    manifest = open_artifact(art).select().manifest
    assert manifest.bake == BakeRecord.from_json(SECTION)
    r = cli("inspect", art, "--json", check=True)
    assert json.loads(r.stdout)["bakes"][0]["manifest"]["bake"] == SECTION
    r = cli("inspect", art, check=True)
    assert "3 (stable, 2 quiet in a row required)" in r.stdout


@pytest.mark.parametrize("field, value", [
    ("rounds", "3"), ("rounds", True), ("stable", "yes"), ("driver", ["vllm"]),
    ("compile_seconds_moved", "12 s"), ("events", [1]), ("events", {"kind": "compile"}),
    ("env", {"pinned": {"VLLM_CACHE_ROOT": 1}}), ("unverified_on_target", "replay"),
    ("unverified_on_target", {"how": 3}), ("serve_env", {"A": None}), ("folded", "x"),
])
def test_a_field_of_the_wrong_type_is_refused_by_name(field, value):
    with pytest.raises(InvalidDocument) as e:
        BakeRecord.from_json({**SECTION, field: value}, "m.json", "bake")
    assert e.value.field.startswith(f"bake.{field}"), e.value.field


def test_a_forged_section_is_exit_5_for_inspect_and_install(tmp_path):
    """Every digest agrees; only the bake section lies about a field's type.  inspect (which
    renders it) and install (which relocates with its env) refuse it by name, exit 5."""
    forged = badlayers.artifact_from_entries(tmp_path / "art", ENTRIES, current_fingerprint_dict(),
                                             manifest_overrides={"bake": {**SECTION, "rounds": {"n": 3}}})
    for args in (["inspect", forged], ["install", forged, "--to", tmp_path / "c", "--target", "sm_90", "--allow-mismatch"]):
        r = cli(*args)
        assert r.returncode == ExitCode.CORRUPT, r.stderr
        assert "bake.rounds: must be an integer" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "c").exists()
