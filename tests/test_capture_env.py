"""capture.env: the pinned environment shared by build, verify and serve."""

import os
import warnings

import pytest

from cachebake import roles
from cachebake.capture.env import AUTOLOAD_DIR, InvalidatingEnvWarning, bake_env


def test_role_dirs_are_absolute_and_match_serving_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    benv = bake_env("rel/root", ("triton", "vllm"), base_env={})
    assert benv.root == str(tmp_path / "rel" / "root")
    assert benv.env["TRITON_CACHE_DIR"] == str(tmp_path / "rel/root/triton")
    assert benv.env["VLLM_CACHE_ROOT"] == str(tmp_path / "rel/root/vllm")
    assert "FLASHINFER_WORKSPACE_BASE" not in benv.env
    # what install hands the server is exactly what the bake ran under
    for k, v in roles.serving_env(benv.root, ["triton", "vllm"]).items():
        assert benv.env[k] == v
    assert benv.env["TRITON_CACHE_AUTOTUNING"] == "1"


def test_default_roles_cover_every_role(tmp_path):
    benv = bake_env(tmp_path, base_env={})
    assert set(benv.role_dirs()) == set(roles.ROLE_ENV)
    benv.make_dirs()
    assert all(os.path.isdir(d) for d in benv.role_dirs().values())


def test_monitor_activation_goes_first_on_pythonpath(tmp_path):
    benv = bake_env(tmp_path, ("triton",), monitor_log=tmp_path / "ev.jsonl",
                    base_env={"PYTHONPATH": "/opt/a:/opt/b", "HOME": "/h"})
    assert benv.env["CACHEBAKE_MONITOR_LOG"] == str(tmp_path / "ev.jsonl")
    assert benv.env["PYTHONPATH"].split(":") == [AUTOLOAD_DIR, "/opt/a", "/opt/b"]
    assert benv.env["HOME"] == "/h"  # the rest of the environment passes through
    assert os.path.isfile(os.path.join(AUTOLOAD_DIR, "sitecustomize.py"))
    assert "PYTHONPATH" not in benv.to_dict()["pinned"]


def test_no_monitor_no_pythonpath(tmp_path):
    benv = bake_env(tmp_path, ("triton",), base_env={})
    assert "PYTHONPATH" not in benv.env and "CACHEBAKE_MONITOR_LOG" not in benv.env


def test_invalidating_vars_are_recorded_and_warned(tmp_path):
    before = dict(os.environ)
    with pytest.warns(InvalidatingEnvWarning, match="TRITON_DEFAULT_FP_FUSION"):
        benv = bake_env(tmp_path, ("triton",), base_env={"TRITON_DEFAULT_FP_FUSION": "0"})
    assert "TRITON_DEFAULT_FP_FUSION" in benv.invalidating
    assert benv.to_dict()["invalidating_env_vars"] == benv.invalidating
    assert benv.warnings
    assert dict(os.environ) == before  # checking another env leaves ours alone


def test_invalidating_vars_allowed_without_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        benv = bake_env(tmp_path, ("triton",), base_env={"MLIR_ENABLE_TIMING": "1"},
                        allow_invalidating=True)
    assert "MLIR_ENABLE_TIMING" in benv.invalidating
    assert not benv.warnings


def test_clean_env_has_no_invalidating_vars(tmp_path):
    assert bake_env(tmp_path, ("triton",), base_env={"PATH": "/bin"}).invalidating == {}
