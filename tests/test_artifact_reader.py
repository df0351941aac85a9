"""Install inputs and layouts beyond the single-role OCI artifact: a bare .tar.zst layer with
its manifest, several roles (and a role dropped by the next bake), a held lock."""

import fcntl
import json
import os
import shutil
import tarfile

import badlayers
import pytest
from badlayers import Entry
from installkit import (baked, cli, compile_kernels, current_fingerprint_dict,  # noqa: F401
                        tree_state)

from cachebake.errors import ExitCode


def test_bare_tar_zst_with_its_manifest(baked, tmp_path):
    layer = tmp_path / "bake.tar.zst"
    shutil.copy(badlayers.layer_blob(baked["artifact"]), layer)
    r = cli("install", layer, "--to", tmp_path / "c", "--target", "sm_90")
    assert r.returncode == ExitCode.BAD_INPUT and "needs its manifest" in r.stderr
    shutil.copy(baked["artifact"] / "cachebake.json", tmp_path / "cachebake.json")
    r = cli("install", layer, "--to", tmp_path / "c", "--target", "sm_90", "--json", check=True)
    assert json.loads(r.stdout)["groups_relocated"] == 3
    result = compile_kernels(tmp_path / "c" / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)
    # the manifest beside it is the root of trust: a changed layer is refused
    data = bytearray(layer.read_bytes())
    data[100] ^= 1
    layer.write_bytes(bytes(data))
    r = cli("install", layer, "--to", tmp_path / "d", "--target", "sm_90")
    assert r.returncode == ExitCode.CORRUPT and "does not match its digest" in r.stderr
    assert not (tmp_path / "d").exists()


def _two_role_artifact(path, fp, roles):
    entries = [Entry("triton", tarfile.DIRTYPE), Entry("triton/" + "K" * 52, tarfile.DIRTYPE),
               Entry("triton/" + "K" * 52 + "/k.cubin", data=b"cubin")]
    if "vllm" in roles:
        entries += [Entry("vllm", tarfile.DIRTYPE), Entry("vllm/torch_compile_cache", tarfile.DIRTYPE),
                    Entry("vllm/torch_compile_cache/x.py", data=b"print(1)\n")]
    return badlayers.artifact_from_entries(path, entries, fp, roles=roles)


def test_roles_get_links_and_env_and_a_dropped_role_goes(tmp_path):
    fp = current_fingerprint_dict()
    both = _two_role_artifact(tmp_path / "both", fp, ("triton", "vllm"))
    only = _two_role_artifact(tmp_path / "only", fp, ("triton",))
    to = tmp_path / "c"
    report = json.loads(cli("install", both, "--to", to, "--target", "sm_90", "--json", check=True).stdout)
    assert report["env"]["VLLM_CACHE_ROOT"] == str(to / "vllm")
    assert (to / "vllm" / "torch_compile_cache" / "x.py").read_text() == "print(1)\n"
    assert os.readlink(to / "vllm") == ".cachebake/current/vllm"
    cli("install", only, "--to", to, "--target", "sm_90", check=True)
    assert not os.path.lexists(to / "vllm") and (to / "triton").is_dir()


def test_a_held_lock_times_out_with_its_own_code(tmp_path):
    fp = current_fingerprint_dict()
    art = _two_role_artifact(tmp_path / "a", fp, ("triton",))
    to = tmp_path / "c"
    (to / ".cachebake").mkdir(parents=True)
    fd = os.open(to / ".cachebake" / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        before = tree_state(to)
        r = cli("install", art, "--to", to, "--target", "sm_90", "--lock-timeout", "0.3")
        assert r.returncode == ExitCode.LOCKED and "holds" in r.stderr
        assert tree_state(to) == before
    finally:
        os.close(fd)
    cli("install", art, "--to", to, "--target", "sm_90", check=True)


def test_install_picks_the_index_entry_for_the_target(baked, tmp_path):
    """Two bakes in one artifact (the real packer adds an index entry per target)."""
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    art = tmp_path / "multi"
    shutil.copytree(baked["artifact"], art)
    other = tmp_path / "cache120" / "triton" / ("B" * 52)
    other.mkdir(parents=True)
    (other / "k.cubin").write_bytes(b"sm_120 cubin")
    (other / "k.json").write_text('{"name": "k"}')
    pack_artifact([CacheRoot("triton", other.parent)], art, target="sm_120")
    r = cli("install", art, "--to", tmp_path / "c120", "--target", "sm_120", "--json", check=True)
    assert json.loads(r.stdout)["target"] == "cuda:120"
    assert [p.name for p in (tmp_path / "c120" / "triton").iterdir()] == ["B" * 52]
    r = cli("install", art, "--to", tmp_path / "c90", "--target", "sm_90", "--json", check=True)
    assert json.loads(r.stdout)["target"] == "cuda:90"
    assert len(list((tmp_path / "c90" / "triton").iterdir())) == 3


@pytest.mark.skipif(not shutil.which("skopeo"), reason="needs skopeo")
def test_a_layout_copied_by_skopeo_installs(baked, tmp_path):
    """What a registry round trip gives: `skopeo copy` to and from a registry rewrites index.json."""
    import subprocess

    copy = tmp_path / "copy"
    subprocess.run(["skopeo", "copy", "-q", f"oci:{baked['artifact']}:sm_90", f"oci:{copy}:sm_90"], check=True)
    r = cli("install", copy, "--to", tmp_path / "c", "--target", "sm_90", "--json")
    assert r.returncode == 0, r.stderr
    result = compile_kernels(tmp_path / "c" / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)


def test_a_registry_reference_without_its_scheme_says_how_to_write_it(tmp_path):
    r = cli("install", "ghcr.io/acme/bakes:sm_90", "--to", tmp_path / "c", "--target", "sm_90")
    assert r.returncode == ExitCode.BAD_INPUT and "docker://ghcr.io/acme/bakes:sm_90" in r.stderr
