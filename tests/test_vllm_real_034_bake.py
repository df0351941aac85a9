"""The bake README's first command made with vLLM 0.34.0 on the H200 (2026-12-03,
bench/results/gpu-2026-12-03-v034/), read on a CPU: its documents as today's strict reader sees
them, and what serve-args and install give a server at another path."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REAL_034 = REPO / "tests" / "data" / "nemotron-h-8b-vllm-0.34-sm_90-2026-12-03.artifact.tar"


@pytest.fixture(scope="module")
def bake034(tmp_path_factory):
    d = tmp_path_factory.mktemp("real034")
    with tarfile.open(REAL_034) as tar:
        for m in tar.getmembers():  # Debian 12's tarfile has no filter=; the archive is ours
            assert not m.name.startswith("/") and ".." not in m.name.split("/")
            assert m.isfile() or m.isdir(), m.name
        tar.extractall(d)
    from cachebake.artifact.reader import open_source

    art = d / "cachebake-nemotron-h"
    return art, open_source(str(art)).select("cuda:90").manifest


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cachebake.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_the_034_bake_records_what_the_h200_ran(bake034):
    _, manifest = bake034
    bake = manifest.bake.to_json()
    identity = bake["compile_identity"]
    assert identity["vllm_version"] == "0.34.0"
    # vLLM 0.34 hashes no HOME-derived path (envs.py compile_factors, PR #47573): nothing to pin
    assert identity["path_factors"] == {}
    assert bake["torch_compile"]["aot"] == "loaded" and bake["torch_compile"]["graphs_compiled"] == 0
    assert [r["compiles"] for r in bake["per_round"]] == [155, 0, 0]
    plans = bake["startup_plan"]["plans"]
    assert len(plans) == 1 and plans[0]["file"].startswith("startup_plan_")
    assert bake["serve_args"]["gpu_memory_utilization"] == 0.9  # the run's recipe edit (README there)


def test_serve_args_at_another_path_gives_the_roles_there_and_no_path_pins(bake034):
    art, _ = bake034
    r = cli("serve-args", art, "--root", "/srv/cb", "--json")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["env"]
    assert env["VLLM_CACHE_ROOT"] == "/srv/cb/vllm" and env["TRITON_CACHE_DIR"] == "/srv/cb/triton"
    assert env["VLLM_ENABLE_STARTUP_PLAN"] == "1"
    assert "VLLM_CONFIG_ROOT" not in env and "VLLM_XLA_CACHE_PATH" not in env


def test_inspect_reads_it(bake034):
    art, _ = bake034
    r = cli("inspect", art, "--json")
    assert r.returncode == 0, r.stderr
    assert "cuda:90" in r.stdout


def test_install_does_not_warn_about_the_startup_plan_variable_the_rounds_set(bake034):
    """The fingerprint records the bake process's VLLM_* variables (none here); the driver set
    VLLM_ENABLE_STARTUP_PLAN=1 in its rounds and serve-args exports it: the same route, no
    warning (the H200 Pods' installer warned on it, 2026-12-03)."""
    import dataclasses

    from cachebake.artifact.fingerprint import compare_vllm_env
    from cachebake.install import preflight

    _, manifest = bake034
    baked, bake = manifest.fingerprint, manifest.bake.to_json()
    assert "VLLM_ENABLE_STARTUP_PLAN" not in baked.vllm_env and bake["startup_plan"]["enabled"] is True
    serving = dataclasses.replace(baked, vllm_env={**baked.vllm_env, "VLLM_ENABLE_STARTUP_PLAN": "1"})
    assert [m.field for m in compare_vllm_env(baked, serving)[1]] == ["env VLLM_ENABLE_STARTUP_PLAN"]
    assert compare_vllm_env(preflight.as_rounds_ran(baked, bake), serving) == ([], [])
    # a server that turns it off still differs from what the rounds ran
    off = dataclasses.replace(baked, vllm_env={**baked.vllm_env, "VLLM_ENABLE_STARTUP_PLAN": "0"})
    assert len(compare_vllm_env(preflight.as_rounds_ran(baked, bake), off)[1]) == 1
    # a bake without a startup plan record is left as recorded
    assert preflight.as_rounds_ran(baked, {}) is baked
