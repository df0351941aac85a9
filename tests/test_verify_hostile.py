"""``verify --check-only`` against what it cannot run with or should not trust: no vLLM in
this interpreter is exit 7 in one line naming vllm; a bake record whose compile identity has
the wrong shape (``roots`` a list, not an object) is exit 5 in one line, before vLLM is asked
anything.  The installed tree is the real H200 bake's excerpt (tests/data)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from installkit import cli
from test_artifact_torch_paths import excerpt
from cachebake.errors import ExitCode


def _installed_vllm_role(root):
    """vLLM's own files of the H200 bake, where install puts them (ROOT/vllm/...)."""
    for name, data in excerpt().items():
        if name.startswith("vllm/"):
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return root


def _one_line(r) -> str:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("cachebake: error: ") and "internal error" not in line, line
    return line


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_check_only_without_vllm_is_exit_7_naming_it(tmp_path):
    root = _installed_vllm_role(tmp_path / "cache")
    r = cli("verify", "--check-only", "--cache", root)
    assert r.returncode == ExitCode.UNSUPPORTED == 7, r.stderr
    assert "vllm" in _one_line(r).lower()


@pytest.mark.parametrize("field, value", [("roots", ["/usr/lib/python3/site-packages"]),
                                          ("env_factors", ["VLLM_CONFIG_ROOT"]),
                                          ("config_parts", {"parallel_config": ["tp"]}),
                                          ("model", "nemotron")])
def test_a_bake_record_whose_identity_has_the_wrong_shape_is_exit_5(tmp_path, field, value):
    root = tmp_path / "cache"
    (root / "vllm").mkdir(parents=True)
    identity = {"env_factors": {}, "roots": {"vllm": "/site/vllm"}, "code_hash": "0" * 64,
                "traced_files": [{"path": "/site/vllm/model.py", "sha256": "0" * 64}], field: value}
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"bake": {"driver": "vllm", "compile_identity": identity}}))
    r = cli("verify", "--check-only", "--cache", root, "--artifact", manifest)
    assert r.returncode == ExitCode.CORRUPT == 5, r.stderr
    assert f"compile_identity.{field}" in _one_line(r)


def test_a_bake_records_serve_args_off_the_allowlist_are_exit_6_before_vllm_parses_them(tmp_path):
    """--check-only hands the bake's serve args to vLLM's own argument parser as the server's
    flags (no server argv given): one off the allowlist (trust_remote_code) is refused first."""
    root = tmp_path / "cache"
    (root / "vllm").mkdir(parents=True)
    identity = {"env_factors": {}, "roots": {"vllm": "/site/vllm"}, "code_hash": "0" * 64}
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"bake": {"driver": "vllm", "compile_identity": identity,
                                             "serve_args": {"max_num_seqs": 8, "trust_remote_code": True}}}))
    r = cli("verify", "--check-only", "--cache", root, "--artifact", manifest)
    assert r.returncode == ExitCode.UNSAFE == 6, r.stderr
    assert "bake.serve_args: --trust-remote-code is not one" in _one_line(r)
