"""Install the vllm role (real H200 files, tests/data) anywhere README says one may: it is
relocated, or left out with one warning while the Triton role still hits.  Never a crash."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import torchpickle
from installkit import cli, compile_kernels
from test_artifact_torch_paths import (BACKBONE, CONTAINER, OLD, excerpt, moved, read_container,
                                       relocate_all)

from cachebake.artifact.pack import CacheRoot, pack_artifact
from cachebake.install.atomic import InstallDir

LAYER_ROOT = "/var/cache/cachebake"


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory) -> Path:
    """A real Triton role: the install tests' kernels compiled for sm_90 (installkit)."""
    root = tmp_path_factory.mktemp("triton-role") / "triton"
    assert compile_kernels(root)["misses"] == 3
    return root


def fill(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def bake(tmp_path: Path, triton_cache: Path, layer_root: str = LAYER_ROOT, files=None,
         record: dict | None = None) -> Path:
    """An artifact with a real Triton role and the H200 vllm-role excerpt, packed from a
    temporary directory (as a CI build would) for ``layer_root``; ``record``: its bake section."""
    src = fill(tmp_path / "filled", files or excerpt())
    out = tmp_path / f"art-{abs(hash(layer_root))}"
    pack_artifact([CacheRoot("triton", triton_cache), CacheRoot("vllm", src / "vllm")], out,
                  target="sm_90", layer_root=layer_root, bake=record)
    return out


# what the H200 bake recorded (tests/data, test_serve_compile_check.py): the factors that follow HOME
PATH_FACTORS = {"VLLM_CONFIG_ROOT": "/root/.config/vllm", "VLLM_XLA_CACHE_PATH": "/root/.cache/vllm/xla_cache"}


def identity_record(path_factors: dict) -> dict:
    return {"driver": "vllm", "compile_identity": {"schema": 1, "env_factors": dict(path_factors),
                                                   "path_factors": dict(path_factors)}}


def handles(vllm_root: Path) -> set[str]:
    text = (vllm_root / BACKBONE.split("/", 1)[1] / "vllm_compile_cache.py").read_text()
    return {v["graph_handle"][1] for v in ast.literal_eval(text).values()}


def test_installed_elsewhere_the_vllm_role_names_the_install(tmp_path, triton_cache):
    art = bake(tmp_path, triton_cache)
    to = tmp_path / "serve" / "cache"
    report = json.loads(cli("install", art, "--to", to, "--target", "sm_90", "--json", check=True).stdout)
    assert report["left_out"] == {} and report["warnings"] == []
    assert report["roles"] == ["triton", "vllm"]
    assert report["env"]["VLLM_CACHE_ROOT"] == str(to / "vllm")
    assert report["relocated"]["vllm"] == 4 and report["groups_relocated"] == report["relocated"]["triton"]
    assert all(h.startswith(f"{to}/vllm/torch_compile_cache/") for h in handles(to / "vllm"))
    _, inner = read_container((to / CONTAINER).read_bytes())
    (_, graph), = inner["inductor"]
    assert any(p.endswith("<CachingAutotuner>.filename")
               for p, _ in torchpickle.fields(graph, f"{to}/vllm/".encode()))
    assert compile_kernels(report["env"]["TRITON_CACHE_DIR"])["misses"] == 0


def test_install_prints_the_compile_identity_the_server_must_keep(tmp_path, triton_cache):
    """vLLM hashes its HOME-derived paths into the torch.compile dirs: install prints the bake's
    values beside the roles' variables (as serve-args does), shell-quoted; a role left out takes
    them with it; a record naming any other variable is refused, nothing installed."""
    art = bake(tmp_path, triton_cache, record=identity_record({**PATH_FACTORS, "VLLM_CONFIG_ROOT": "/root/my vllm"}))
    to = tmp_path / "serve"
    r = cli("install", art, "--to", to, "--target", "sm_90", check=True)
    assert "VLLM_CONFIG_ROOT='/root/my vllm'" in r.stdout.splitlines()
    assert "VLLM_XLA_CACHE_PATH=/root/.cache/vllm/xla_cache" in r.stdout.splitlines()
    report = json.loads(cli("install", art, "--to", to, "--target", "sm_90", "--json", check=True).stdout)
    assert report["identity_env"] == {**PATH_FACTORS, "VLLM_CONFIG_ROOT": "/root/my vllm"}
    assert report["env"] == {**report["identity_env"], "TRITON_CACHE_DIR": f"{to}/triton",
                             "VLLM_CACHE_ROOT": f"{to}/vllm", "TRITON_CACHE_AUTOTUNING": "1"}

    left = bake(tmp_path / "left", triton_cache, layer_root=str(tmp_path / "elsewhere"),
                record=identity_record(PATH_FACTORS))
    report = json.loads(cli("install", left, "--to", tmp_path / "left-to", "--target", "sm_90", "--json",
                            check=True).stdout)
    assert "vllm" in report["left_out"] and report["identity_env"] == {}
    assert not {"VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH", "VLLM_CACHE_ROOT"} & set(report["env"])

    forged = bake(tmp_path / "forged", triton_cache, record=identity_record({"LD_PRELOAD": "/tmp/x.so"}))
    r = cli("install", forged, "--to", tmp_path / "forged-to", "--target", "sm_90")
    assert r.returncode == 5 and "which is no vLLM variable" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "forged-to").exists()


def test_serve_at_names_the_serving_mount(tmp_path, triton_cache):
    art = bake(tmp_path, triton_cache)
    init_view, serve_view = tmp_path / "init", tmp_path / "served-elsewhere"
    cli("install", art, "--to", init_view, "--target", "sm_90", "--serve-at", serve_view, check=True)
    assert all(h.startswith(f"{serve_view}/vllm/") for h in handles(init_view / "vllm"))


def test_installed_at_the_layer_root_nothing_is_rewritten(tmp_path, triton_cache):
    """The image-volume layout: the layer mounted at its root reads the packed bytes as they are."""
    layer_root = tmp_path / "layer-root"
    art = bake(tmp_path, triton_cache, layer_root=str(layer_root),
               files=relocate_all(excerpt(), moved(str(layer_root)), str(layer_root)))
    report = json.loads(cli("install", art, "--to", layer_root, "--target", "sm_90", "--json",
                            check=True).stdout)
    assert report["relocated"].get("vllm", 0) == 0 and report["left_out"] == {}
    assert all(h.startswith(f"{layer_root}/vllm/") for h in handles(layer_root / "vllm"))


def test_pack_moves_the_vllm_role_to_the_layer_root(tmp_path, triton_cache):
    """A bake filled at one path and packed for another layer root: pack rewrites the vllm
    role as it does Triton's group files, so a volume mounted at the layer root hits as is."""
    filled = tmp_path / "filled"
    files = relocate_all(excerpt(), moved(str(filled)), str(filled))  # as if vLLM ran there
    layer_root = tmp_path / "layer"
    art = bake(tmp_path, triton_cache, layer_root=str(layer_root), files=files)
    report = json.loads(cli("install", art, "--to", layer_root, "--target", "sm_90", "--json",
                            check=True).stdout)
    assert report["relocated"].get("vllm", 0) == 0  # already right in the layer
    assert all(h.startswith(f"{layer_root}/vllm/") for h in handles(layer_root / "vllm"))
    assert f"{filled}/vllm".encode() not in (layer_root / CONTAINER).read_bytes()


def test_unknown_root_leaves_the_role_out_and_triton_still_hits(tmp_path, triton_cache):
    """The excerpt names /var/cache/cachebake/vllm; packed for another layer root from a copy,
    nothing in the manifest accounts for that root: install leaves the role out, warns once,
    installs Triton's, and says so in its report, its marker and to verify."""
    art = bake(tmp_path, triton_cache, layer_root=str(tmp_path / "elsewhere"))
    to = tmp_path / "serve"
    r = cli("install", art, "--to", to, "--target", "sm_90", "--json", check=True)
    report = json.loads(r.stdout)
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("cachebake: warning:")]
    assert len(warnings) == 1 and "left the vllm role out" in warnings[0]
    assert "/var/cache/cachebake/vllm, a root this bake does not record" in report["left_out"]["vllm"]
    assert report["roles"] == ["triton"] and "VLLM_CACHE_ROOT" not in report["env"]
    assert not os.path.lexists(to / "vllm")
    assert not (to / ".cachebake" / "current" / "vllm").exists()
    assert compile_kernels(report["env"]["TRITON_CACHE_DIR"])["misses"] == 0
    assert InstallDir(to).installed().left_out == report["left_out"]
    again = json.loads(cli("install", art, "--to", to, "--target", "sm_90", "--json", check=True).stdout)
    assert again["status"] == "already installed" and again["left_out"] == report["left_out"]
    assert again["roles"] == ["triton"]

    from cachebake.verify import VerifyReport
    v = VerifyReport(cache=str(to), roles=["triton"], round=None,
                     left_out=InstallDir(to).installed().left_out)
    assert v.warnings() == [f"the vllm role was left out at install ({report['left_out']['vllm']}): "
                            "this round ran without it"]


def test_a_left_out_role_replaces_a_previous_install_cleanly(tmp_path, triton_cache):
    good = bake(tmp_path / "a", triton_cache)
    bad = bake(tmp_path / "b", triton_cache, layer_root=str(tmp_path / "elsewhere"))
    to = tmp_path / "serve"
    cli("install", good, "--to", to, "--target", "sm_90", check=True)
    assert (to / "vllm").is_dir()
    report = json.loads(cli("install", bad, "--to", to, "--target", "sm_90", "--json", check=True).stdout)
    assert report["status"] == "replaced" and "vllm" in report["left_out"]
    assert not os.path.lexists(to / "vllm")  # no link left pointing at nothing


def test_unmoved_files_still_name_the_bake_root():
    """The control for the tests above: without install, the files name the bake root."""
    files = excerpt()
    assert OLD in files[CONTAINER] and OLD in files[f"{BACKBONE}/vllm_compile_cache.py"]
