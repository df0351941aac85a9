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


# ------------------------------------------------------------------ a registry that lies
# A Docker Registry HTTP API v2 server on 127.0.0.1 (the endpoints skopeo uses: /v2/,
# manifests, blobs), serving a real bake's image, whose layer it can lie about.  Real skopeo,
# real sockets; only the registry is ours, because the lies are what a real one never tells.

import hashlib  # noqa: E402
import http.server  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

DECLARED = 8192  # the layer size the lying manifests declare


class LyingRegistry:
    """``mode``: honest (the artifact as it is), endless (the layer declared as 8 KB, a body
    that never ends), trickle (8 KB declared and sent, one byte every 2 s), long (8 KB
    declared, 100 KB sent, Content-Length saying so), huge (a layer declared at 1 PiB),
    slow-manifest (the manifest sent a byte every 2 s), endless-manifest (a manifest body that
    never ends)."""

    def __init__(self, artifact: Path, mode: str):
        self.mode, self.requests = mode, []
        index = json.loads((artifact / "index.json").read_text())
        blobs = artifact / "blobs" / "sha256"
        image = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_bytes())
        self.blobs = {d["digest"]: (blobs / d["digest"][7:]).read_bytes()
                      for d in (image["config"], image["layers"][0])}
        if mode not in ("honest", "slow-manifest", "endless-manifest"):
            layer = self.blobs.pop(image["layers"][0]["digest"])
            self.layer = (layer * (DECLARED // len(layer) + 1))[:DECLARED]
            digest = "sha256:" + hashlib.sha256(self.layer).hexdigest()
            image["layers"][0] = dict(image["layers"][0], digest=digest,
                                      size=1 << 50 if mode == "huge" else DECLARED)
            self.layer_digest = digest
        self.manifest = json.dumps(image).encode()
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.do_GET(head=True)

            def do_GET(self, head=False):
                registry.requests.append((self.command, self.path))
                try:
                    registry.answer(self, head)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # skopeo was stopped: what the test wants

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def _send(self, h, body: bytes, media: str, head: bool, **headers):
        h.send_response(200)
        h.send_header("Content-Type", media)
        h.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            h.send_header(k.replace("_", "-"), v)
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def answer(self, h, head: bool):
        path = h.path
        if path == "/v2/":
            return self._send(h, b"{}", "application/json", head)
        if "/manifests/" in path:
            digest = "sha256:" + hashlib.sha256(self.manifest).hexdigest()
            if self.mode == "endless-manifest":  # chunked: no length says where it ends
                h.send_response(200)
                h.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
                h.send_header("Transfer-Encoding", "chunked")
                h.end_headers()
                chunk = b" " * 4096
                while not head:
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                return
            if self.mode == "slow-manifest":  # the headers, then a byte every 2 s
                h.send_response(200)
                h.send_header("Content-Length", str(len(self.manifest)))
                h.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
                h.end_headers()
                for i in range(0 if head else len(self.manifest)):
                    h.wfile.write(self.manifest[i:i + 1])
                    h.wfile.flush()
                    time.sleep(2)
                return
            return self._send(h, self.manifest, "application/vnd.oci.image.manifest.v1+json", head,
                              Docker_Content_Digest=digest)
        digest = path.rpartition("/")[2]
        if digest in self.blobs:
            return self._send(h, self.blobs[digest], "application/octet-stream", head)
        if self.mode in ("honest", "slow-manifest", "endless-manifest") or digest != self.layer_digest:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            return h.end_headers()
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        if self.mode == "endless":  # chunked, so no length ever says where it ends
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            chunk = self.layer[:4096]
            while not head:
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        elif self.mode == "trickle":
            h.send_header("Content-Length", str(DECLARED))
            h.end_headers()
            for i in range(0 if head else DECLARED):
                h.wfile.write(self.layer[i:i + 1])
                h.wfile.flush()
                time.sleep(2)
        elif self.mode == "long":
            body = self.layer + b"\0" * 100_000
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            if not head:
                h.wfile.write(body)

    def blob_requests(self) -> list[str]:
        return [p for m, p in self.requests if "/blobs/" in p]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def liar(baked):
    made = []

    def start(mode):
        made.append(LyingRegistry(baked["artifact"], mode))
        return made[-1]
    yield start
    for r in made:
        r.close()


def _pull(registry, tmp_path, *extra):
    """`cachebake install` from ``registry`` with a TMPDIR of its own; (result, seconds, TMPDIR)."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    start = time.monotonic()
    r = cli("install", f"docker://{registry.host}/bakes/liar:sm_90", "--to", tmp_path / "c",
            "--target", "sm_90", *extra, env=installkit_env(TMPDIR=tmpdir), timeout=120)
    return r, time.monotonic() - start, tmpdir


def installkit_env(**extra):
    from installkit import env_with

    return env_with(**extra)


def _one_line(r):
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("cachebake: error: "), r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_an_honest_registry_installs_under_every_bound(liar, tmp_path):
    registry = liar("honest")
    r, seconds, tmpdir = _pull(registry, tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["artifact"] == f"docker://{registry.host}/bakes/liar:sm_90"
    result = compile_kernels(tmp_path / "c" / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)
    assert list(tmpdir.iterdir()) == []
    # the copy read the manifest it checked, pinned by digest
    digest = "sha256:" + hashlib.sha256(registry.manifest).hexdigest()
    assert ("GET", f"/v2/bakes/liar/manifests/{digest}") in registry.requests


@pytest.mark.parametrize("mode", ["endless", "long"])
def test_a_layer_longer_than_declared_stops_at_the_declared_size(liar, tmp_path, mode):
    registry = liar(mode)
    r, seconds, tmpdir = _pull(registry, tmp_path)
    assert r.returncode == ExitCode.CORRUPT, r.stderr
    _one_line(r)
    assert "longer than declared" in r.stderr
    assert list(tmpdir.iterdir()) == [] and not (tmp_path / "c").exists()
    assert seconds < 30


def test_a_manifest_that_never_ends_is_a_corrupt_document(liar, tmp_path):
    """skopeo stops reading a manifest at its own 4 MiB limit: that is the registry's document
    being too big (exit 5), not a bad image name, and nothing is asked for after it."""
    registry = liar("endless-manifest")
    r, seconds, tmpdir = _pull(registry, tmp_path, "--stall-timeout", "30")
    assert r.returncode == ExitCode.CORRUPT, r.stderr
    _one_line(r)
    assert "image manifest" in r.stderr and "size limit" in r.stderr
    assert registry.blob_requests() == [] and list(tmpdir.iterdir()) == [] and not (tmp_path / "c").exists()


@pytest.mark.parametrize("mode", ["trickle", "slow-manifest"])
def test_a_registry_sending_a_byte_every_2_s_is_a_stall(liar, tmp_path, mode):
    registry = liar(mode)
    r, seconds, tmpdir = _pull(registry, tmp_path, "--stall-timeout", "3")
    assert r.returncode == ExitCode.STALLED, r.stderr
    _one_line(r)
    assert "--stall-timeout" in r.stderr
    assert list(tmpdir.iterdir()) == [] and not (tmp_path / "c").exists()
    assert 3 <= seconds < 20
    # the layer stalled after the manifest was read, or the manifest itself before any blob
    assert bool(registry.blob_requests()) == (mode == "trickle")


def test_declared_sizes_beyond_tmpdir_fail_before_any_blob_is_asked_for(liar, tmp_path):
    registry = liar("huge")
    r, seconds, tmpdir = _pull(registry, tmp_path)
    assert r.returncode == ExitCode.BAD_INPUT, r.stderr
    _one_line(r)
    assert f"TMPDIR ({tmpdir})" in r.stderr and "free" in r.stderr
    assert registry.blob_requests() == [] and list(tmpdir.iterdir()) == []


def test_a_zero_or_negative_stall_timeout_is_a_usage_error(tmp_path):
    for value in ("0", "-1"):
        r = cli("install", "docker://127.0.0.1:1/x:sm_90", "--to", tmp_path / "c", "--stall-timeout", value)
        assert r.returncode == ExitCode.USAGE and "--stall-timeout" in r.stderr


def test_more_on_disk_than_declared_in_all_stops_the_pull(tmp_path, monkeypatch):
    """The total bound, which skopeo's file size limit leaves to the watch: files each under the
    largest declared blob, more than all the declared blobs together.  A shell stands in for
    skopeo here (skopeo writes one blob at a time; no registry makes it write three at once)."""
    from cachebake.distribute.registry import PullBudget, pull_bounded

    monkeypatch.setenv("CACHEBAKE_SKOPEO", "/bin/sh")
    layout, pidfile = tmp_path / "layout", tmp_path / "pid"
    budget = PullBudget(b"{}", (100_000, 100_000))
    script = (f"echo $$ > {pidfile}; mkdir {layout}; for f in a b c; do "
              f"head -c 99000 /dev/zero > {layout}/$f; done; exec sleep 60")
    start = time.monotonic()
    with pytest.raises(CorruptArtifact, match="more than the 200000 bytes"):
        pull_bounded(["-c", script], "pull x", layout=layout, budget=budget, stall_timeout=30,
                     log=tmp_path / "log")
    assert time.monotonic() - start < 10
    with pytest.raises(ProcessLookupError):  # killed, not left sleeping
        os.kill(int(pidfile.read_text()), 0)


def test_a_reference_with_a_line_break_is_refused():
    for text in ("docker://h/x\n", "docker://h/x:t\n---", "docker://h/x\u2028"):
        with pytest.raises(BadInput):
            parse_reference(text)
