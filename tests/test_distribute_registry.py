"""`cachebake push` and `cachebake install docker://...` through a real registry (Debian's
docker-registry 2.8 on 127.0.0.1, started by .ci/containers.sh) with skopeo: the round trip
hits, and a registry's blob is held to every check of a local install."""

import json
import os
import tarfile
from pathlib import Path

import pytest

import badlayers
from badlayers import Entry
from containerkit import engines  # noqa: F401
from installkit import baked, cli, compile_kernels, current_fingerprint_dict, tree_state  # noqa: F401

from cachebake.distribute.registry import RegistryOptions, RegistryRef, parse_reference, skopeo_error
from cachebake.errors import BadInput, CorruptArtifact, ExitCode


@pytest.mark.parametrize("text, parts", [
    ("docker://127.0.0.1:5000/bakes/nemotron:sm_90", ("127.0.0.1:5000", "bakes/nemotron", "sm_90", None)),
    ("oci://ghcr.io/acme/bakes", ("ghcr.io", "acme/bakes", None, None)),
    ("docker://localhost/b@sha256:" + "a" * 64, ("localhost", "b", None, "sha256:" + "a" * 64)),
])
def test_references_parse(text, parts):
    ref = parse_reference(text)
    assert (ref.host, ref.repository, ref.tag, ref.digest) == parts


@pytest.mark.parametrize("text", ["docker://h/Bakes", "docker://host", "http://h/x", "docker://h/x:"])
def test_bad_references_are_bad_input(text):
    with pytest.raises(BadInput):
        parse_reference(text)


def test_tls_follows_docker_loopback_rule_unless_told():
    local, remote = RegistryRef("127.0.0.1:5000", "b"), RegistryRef("reg.example", "b")
    assert RegistryOptions().flags(local, "src") == ["--src-tls-verify=false"]
    assert RegistryOptions().flags(remote, "dest") == ["--dest-tls-verify=true"]
    assert RegistryOptions(tls_verify=True).flags(local, "src") == ["--src-tls-verify=true"]


def test_skopeo_errors_become_one_line_with_the_right_code():
    err = skopeo_error("pull x", 'time="t" level=fatal msg="reading blob sha256:ab: Digest did not match, expected sha256:ab, got sha256:cd"\n')
    assert isinstance(err, CorruptArtifact) and "does not match its digest" in str(err)
    assert type(skopeo_error("pull x", "manifest unknown")) is BadInput


def test_install_of_a_bad_reference_or_missing_authfile_is_one_line(tmp_path):
    r = cli("install", "docker://Bad/Ref", "--to", tmp_path / "c")
    assert r.returncode == ExitCode.BAD_INPUT and r.stderr.count("\n") == 1
    r = cli("push", tmp_path, "docker://127.0.0.1:1/x", "--authfile", tmp_path / "none.json")
    assert r.returncode == ExitCode.BAD_INPUT and not (tmp_path / "c").exists()


def _registry_blob(digest: str) -> Path:
    root = Path(os.environ["CACHEBAKE_TEST_REGISTRY_DIR"])
    hexd = digest.split(":")[1]
    return root / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


@pytest.mark.containers
def test_push_then_install_from_the_registry_hits(engines, baked, tmp_path):
    repo = f"docker://{engines.registry}/bakes/roundtrip"
    pushed = json.loads(cli("push", baked["artifact"], repo, "--json").stdout)["pushed"]
    assert [p["reference"] for p in pushed] == [f"{repo}:sm_90"]  # one tag per target
    r = cli("install", repo, "--to", tmp_path / "c", "--target", "sm_90", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["artifact"] == f"{repo}:sm_90" and report["layer_digest"] == pushed[0]["layer_digest"]
    marker = json.loads((Path(report["version_dir"]) / "install.json").read_text())
    assert marker["artifact"] == f"{repo}:sm_90"  # the reference, not the removed temp layout
    result = compile_kernels(tmp_path / "c" / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)
    # pinned by digest, as a Pod spec should name it: the same bake, already installed
    r = cli("install", pushed[0]["pinned"], "--to", tmp_path / "c", "--target", "sm_90", "--json")
    assert json.loads(r.stdout)["status"] == "already installed"


@pytest.mark.containers
def test_a_tag_the_registry_lacks_is_bad_input(engines, tmp_path):
    r = cli("install", f"docker://{engines.registry}/bakes/none-such", "--to", tmp_path / "c", "--target", "sm_90")
    assert r.returncode == ExitCode.BAD_INPUT and "manifest unknown" in r.stderr and not (tmp_path / "c").exists()


@pytest.mark.containers
def test_a_tampered_registry_blob_installs_nothing(engines, baked, tmp_path):
    repo = f"docker://{engines.registry}/bakes/tampered"
    pushed = json.loads(cli("push", baked["artifact"], f"{repo}:sm_90", "--json").stdout)["pushed"][0]
    blob = _registry_blob(pushed["layer_digest"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only the digest can tell
    blob.write_bytes(bytes(data))
    dest = tmp_path / "c"
    dest.mkdir()
    before = tree_state(dest)
    r = cli("install", f"{repo}:sm_90", "--to", dest, "--target", "sm_90")
    assert r.returncode == ExitCode.CORRUPT, r.stderr
    assert "digest" in r.stderr and r.stderr.count("\n") == 1
    assert tree_state(dest) == before


@pytest.mark.containers
def test_a_hostile_layer_from_a_registry_meets_every_local_check(engines, tmp_path):
    entries = [Entry("triton", tarfile.DIRTYPE), Entry("triton/k", tarfile.DIRTYPE),
               Entry("triton/k/x.json", data=b"{}"),
               Entry("triton/k/escape", tarfile.SYMTYPE, linkname="/etc/passwd")]
    art = badlayers.artifact_from_entries(tmp_path / "hostile", entries,
                                          current_fingerprint_dict())
    local = cli("install", art, "--to", tmp_path / "local", "--target", "sm_90")
    repo = f"docker://{engines.registry}/bakes/hostile:sm_90"
    cli("push", art, repo)
    remote = cli("install", repo, "--to", tmp_path / "remote", "--target", "sm_90")
    assert local.returncode == remote.returncode == ExitCode.UNSAFE
    assert local.stderr.split(": ", 2)[-1] == remote.stderr.split(": ", 2)[-1]
    assert not (tmp_path / "remote").exists() or tree_state(tmp_path / "remote") == {}
