"""A torch.compile cache made by real torch/Inductor (CPU), installed at another path, loaded
by real torch: it hits; the same cache moved without install fails as vLLM 0.24 did.

The cache is generated and loaded by the vllm venv's interpreter (torch 2.14 + vLLM 0.33;
tests/kit/torch_cache.py), named by CACHEBAKE_VLLM_PYTHON; cachebake itself (pack, install) runs
in this interpreter, as in production.  On CPU, Inductor writes C++ kernels and no Triton ones,
so the path-bearing fields here are vLLM's graph handle, the FX graph's repro script and the
kernels' DWARF; the Triton-specific fields are covered by the H200 files
(tests/test_artifact_torch_paths.py).

    CACHEBAKE_VLLM_PYTHON=/work/venv-vllm/bin/python python3 -m pytest -m vllm tests/test_install_relocate_vllm_torch.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import torchpickle
from installkit import cli
from cachebake.artifact.pack import CacheRoot, pack_artifact

VLLM_PYTHON = os.environ.get("CACHEBAKE_VLLM_PYTHON", "")
TORCH_CACHE = Path(__file__).parent / "kit" / "torch_cache.py"

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not os.access(VLLM_PYTHON or "/nonexistent", os.X_OK),
                                 reason="set CACHEBAKE_VLLM_PYTHON to an interpreter with torch and vLLM")]


def torch_cache(*args, user: int | None = None) -> dict | None:
    cmd = [VLLM_PYTHON, str(TORCH_CACHE), *map(str, args)]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(VLLM_TARGET_DEVICE="cpu", HOME="/tmp")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return None


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, Path]:
    """ROOT/vllm filled by real Inductor at ROOT, and a pristine copy of it."""
    base = tmp_path_factory.mktemp("bake")
    root = base / "bake-root"
    torch_cache("generate", root)
    shutil.copytree(root, base / "pristine", symlinks=True)
    return root, base / "pristine"


def fresh(generated: tuple[Path, Path]) -> Path:
    """The bake root as the builder left it (the cache names this path)."""
    root, pristine = generated
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(pristine, root, symlinks=True)
    return root


def test_installed_at_another_path_the_cache_hits(generated, tmp_path):
    bake_root = fresh(generated)
    art = tmp_path / "art"
    pack_artifact([CacheRoot("vllm", bake_root / "vllm")], art, target="sm_90",
                  layer_root=str(bake_root))
    to = tmp_path / "serving" / "a-root-of-another-length"
    report = json.loads(cli("install", art, "--to", to, "--target", "sm_90", "--json",
                            check=True).stdout)
    assert report["left_out"] == {} and report["relocated"]["vllm"] >= 2
    shutil.rmtree(bake_root)  # the serving node has no bake root
    for handle in ("0.24", "0.33"):
        got = torch_cache("load", to, "--handle", handle)
        assert got["path"].startswith(f"{to}/vllm/"), got
        assert "error" not in got, got
        assert got["matches_eager"] and got["kernel_builds"] == []
        assert got["counters"].get("fxgraph_cache_hit") == 1
        assert not got["counters"].get("fxgraph_cache_miss")
    # The FX graphs Inductor loaded (the one shipped, the one it wrote back) name the install.
    graphs = [p.read_bytes() for p in (to / "vllm").rglob("*") if p.is_file() and "/fxgraph/" in str(p)]
    assert graphs
    for graph in graphs:
        assert not torchpickle.fields(graph, str(bake_root).encode())
        assert ("<CompiledFxGraph>.runnable_graph_str", "str") in torchpickle.fields(graph, str(to).encode())


def test_moved_without_install_vllm_024_cannot_start(generated, tmp_path):
    """The control: the same tree copied elsewhere (plain `cp`, bake root gone).  vLLM 0.24
    opens the handle's absolute path: FileNotFoundError, as on the H200.  0.33 joins its own
    cache dir and loads."""
    bake_root = fresh(generated)
    elsewhere = tmp_path / "copied"
    shutil.copytree(bake_root, elsewhere, symlinks=True)
    shutil.rmtree(bake_root)
    got = torch_cache("load", elsewhere, "--handle", "0.24")
    assert got["error"].startswith("FileNotFoundError") and str(bake_root) in got["error"]
    got = torch_cache("load", elsewhere, "--handle", "0.33")
    assert "error" not in got and got["matches_eager"]


def test_inductor_writes_into_the_vllm_role_on_every_load(generated, tmp_path):
    """What the server needs besides the right paths: Inductor's CompiledArtifact.load writes the
    cache artifacts back into TORCHINDUCTOR_CACHE_DIR (inside VLLM_CACHE_ROOT) on every load, hit
    or not.  Read-only to the serving uid, the load fails (vLLM 0.24 then stops at start-up):
    README asks for a vllm role the server can write."""
    bake_root = fresh(generated)
    art = tmp_path / "art"
    pack_artifact([CacheRoot("vllm", bake_root / "vllm")], art, target="sm_90",
                  layer_root=str(bake_root))
    to = tmp_path / "ro"
    cli("install", art, "--to", to, "--target", "sm_90", check=True)
    for d in (to, *to.parents):  # let uid 65534 reach it (pytest's tmp dirs are 0700)
        d.chmod(d.stat().st_mode | 0o005)
    got = torch_cache("load", to, "--handle", "0.33", user=65534)
    assert got["error"].startswith("PermissionError") and "inductor_cache" in got["error"]
