"""The fingerprint: what is read from this process, and how differences are reported."""

from __future__ import annotations

import pytest

from cachebake.artifact.fingerprint import Fingerprint, compare_fingerprints, current_fingerprint
from cachebake.errors import BadInput


def test_each_difference_is_one_line_with_its_consequence():
    baked = current_fingerprint("sm_90")
    same = Fingerprint.from_dict(baked.to_dict())
    assert compare_fingerprints(baked, same) == []
    other = Fingerprint.from_dict({**baked.to_dict(), "triton_key": "3.5.1-abc", "gpu_name": "NVIDIA H100",
                                   "env": {"TRITON_DEFAULT_FP_FUSION": "true"}, "bake_paths": {"triton": "/x"}})
    fields = {m.field: str(m) for m in compare_fingerprints(baked, other)}
    assert set(fields) == {"triton_key", "env"}  # the name is unknown on the baked side (no GPU here)
    assert "every kernel recompiles" in fields["triton_key"] and "\n" not in fields["triton_key"]
    named = Fingerprint.from_dict({**baked.to_dict(), "gpu_name": "NVIDIA H200"})
    assert [m.field for m in compare_fingerprints(named, other)] == ["triton_key", "env", "gpu_name"]


def test_unknown_fields_from_a_newer_cachebake_are_ignored():
    fp = Fingerprint.from_dict({"target": "cuda:90", "future_field": 1})
    assert fp.target == "cuda:90"
    with pytest.raises(BadInput):
        Fingerprint.from_dict({"triton_version": "3.6.0"})


