"""Stock verifiers, not ours, check what `cachebake sign` and `push --sign-key` write, against
Debian's docker-registry 2.8 on 127.0.0.1:

* cosign's signature form (tag ``sha256-<hex>.sig``, Simple Signing payload, annotation
  ``dev.cosignproject.cosign/signature``): containers/image's ``sigstoreSigned`` policy
  requirement with a PEM key (``keyPath``/``keyData``), the code `skopeo copy` and podman run
  on pull, with a registries.d file saying ``use-sigstore-attachments: true``.  Debian 12's
  skopeo was built with sigstore turned off; ``$CACHEBAKE_SIGSTORE_SKOPEO`` names one that has
  it (.ci/newer-skopeo.sh: Debian 13's skopeo 1.18; found without the export where .ci/run put it).
* the Sigstore bundle form (an OCI 1.1 referrer, found through the referrers tag schema):
  sigstore-js (@sigstore/bundle + @sigstore/verify, pinned in tests/verifiers/package-lock.json)
  verifies the bundle over the image manifest's bytes with the PEM key, through
  tests/verifiers/verify-bundle.js.  ``$CACHEBAKE_SIGSTORE_JS`` names its node_modules (else
  .ci/run's, .ci/sigstore-js.sh, else tests/verifiers/node_modules: ``npm ci --prefix tests/verifiers``).

Without either the tests skip and say why; with ``$CACHEBAKE_REQUIRE_STOCK_VERIFIERS`` set
(.ci/run sets it) they fail instead.  sigstore-python is not used: its verifier takes only
Fulcio certificates, no plain public key."""

import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from installkit import baked, cli  # noqa: F401
from registrykit import push_image, raw_manifest, running_registry

from cachebake.distribute import sign
from cachebake.distribute.registry import RegistryOptions, RegistryRef

pytest.importorskip("cryptography")

SKOPEO_ENV = "CACHEBAKE_SIGSTORE_SKOPEO"
SIGSTORE_JS_ENV = "CACHEBAKE_SIGSTORE_JS"
REQUIRE_ENV = "CACHEBAKE_REQUIRE_STOCK_VERIFIERS"
VERIFIERS = Path(__file__).parent / "verifiers"
# Where .ci/run puts them (CI_DIR=${CACHEBAKE_CI_DIR:-/opt/cachebake-ci}): the fast lane, run in
# .ci/run's environment without its exports, finds them there (test_ci_puts_the_verifiers_here).
CI_DIR = Path(os.environ.get("CACHEBAKE_CI_DIR") or "/opt/cachebake-ci")
CI_SKOPEO = CI_DIR / "skopeo-trixie" / "bin" / "skopeo"
CI_SIGSTORE_JS = CI_DIR / "sigstore-js" / "node_modules"
REJECTED = "Source image rejected"  # containers/image's policy refusal, as skopeo prints it
# cosign's payload names the repository without tag or digest (its docker-reference), ours too:
# containers/image's default rule for sigstoreSigned (matchRepoDigestOrExact) wants a tag or
# digest there, so a policy for cosign-form signatures says matchRepository (containers-policy.json(5)).
MATCH_REPOSITORY = {"type": "matchRepository"}


def _unavailable(reason: str):
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{reason} (and ${REQUIRE_ENV} is set)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("registry")) as host:
        yield host


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    for name in ("right", "other", "third"):
        assert cli("keygen", d / name).returncode == 0
    return d


def _sign(ref: str, key: Path) -> dict:
    r = cli("sign", ref, "--key", key, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_ci_puts_the_verifiers_here():
    """.ci/run fetches both and requires them; the paths this module falls back to are its."""
    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert 'newer-skopeo.sh trixie "$CI_DIR/skopeo-trixie")' in ci and 'sigstore-js.sh "$CI_DIR")' in ci
    assert "CACHEBAKE_REQUIRE_STOCK_VERIFIERS=1" in ci
    script = (Path(__file__).parents[1] / ".ci" / "sigstore-js.sh").read_text()
    assert 'echo "$dest/sigstore-js/node_modules"' in script


# ------------------------------------------------------------------ skopeo: cosign's form


class Skopeo:
    """skopeo with a policy of one ``sigstoreSigned`` requirement for the test registry."""

    def __init__(self, exe: str, registry: str, root: Path):
        self.exe, self.registry, self.root = exe, registry, root
        (root / "registries.d").mkdir(parents=True, exist_ok=True)
        # registries.d is YAML; JSON is YAML
        (root / "registries.d" / "loopback.yaml").write_text(
            json.dumps({"docker": {registry: {"use-sigstore-attachments": True}}}))
        self.n = 0

    def policy(self, key: Path, *, inline=False, identity: dict | None = MATCH_REPOSITORY) -> Path:
        req = {"type": "sigstoreSigned"}
        if inline:  # keyData: the PEM bytes, base64 as JSON carries []byte
            req["keyData"] = base64.b64encode(key.read_bytes()).decode()
        else:
            req["keyPath"] = str(key)
        if identity:
            req["signedIdentity"] = identity
        self.n += 1
        path = self.root / f"policy-{self.n}.json"
        path.write_text(json.dumps({"default": [{"type": "reject"}],
                                    "transports": {"docker": {self.registry: [req]}}}))
        return path

    def copy(self, src: str, key: Path, *extra, **policy) -> subprocess.CompletedProcess:
        """``skopeo copy`` of ``src`` (a docker:// reference) into a fresh ``dir:``."""
        self.n += 1
        dest = self.root / f"copy-{self.n}"
        r = subprocess.run([self.exe, "--policy", str(self.policy(key, **policy)),
                            "--registries.d", str(self.root / "registries.d"), "copy", "--quiet",
                            "--src-tls-verify=false", *extra, src, f"dir:{dest}"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        r.dest = dest
        return r

    def accepts(self, src: str, key: Path, *extra, **policy) -> Path:
        r = self.copy(src, key, *extra, **policy)
        assert r.returncode == 0, f"skopeo refused {src}: {r.stderr}"
        return r.dest

    def refuses(self, src: str, key: Path, why: str, **policy) -> None:
        r = self.copy(src, key, **policy)
        assert r.returncode != 0 and REJECTED in r.stderr and why in r.stderr, r.stderr
        assert not (r.dest / "manifest.json").exists()


@pytest.fixture(scope="module")
def skopeo(registry, keys, tmp_path_factory) -> Skopeo:
    """A skopeo whose containers/image verifies ``sigstoreSigned``, probed on a signed image."""
    exe = os.environ.get(SKOPEO_ENV) or (str(CI_SKOPEO) if os.access(CI_SKOPEO, os.X_OK) else shutil.which("skopeo"))
    if not exe:
        _unavailable(f"no skopeo (set ${SKOPEO_ENV}; .ci/newer-skopeo.sh fetches one)")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    s = Skopeo(exe, registry, tmp_path_factory.mktemp("skopeo"))
    digest = push_image(registry, "bakes/probe", "p", b"probe", s.root)
    _sign(f"docker://{registry}/bakes/probe:p", keys / "right.key")
    r = s.copy(f"docker://{registry}/bakes/probe@{digest}", keys / "right.pub")
    if "sigstore disabled" in r.stderr or "Unknown policy requirement type" in r.stderr:
        _unavailable(f"{exe} ({version}) cannot verify sigstoreSigned (Debian 12's skopeo and podman are "
                     f"built with it turned off); set ${SKOPEO_ENV} to one that can: "
                     ".ci/newer-skopeo.sh fetches Debian 13's")
    assert r.returncode == 0, f"{version} refused a signed image: {r.stderr}"  # a bug in our signing
    return s


def _sig_manifest(registry: str, repo: str, digest: str) -> dict:
    return json.loads(raw_manifest(f"docker://{registry}/{repo}:{sign.sig_tag(digest)}"))


def _put_sig_manifest(registry: str, repo: str, digest: str, layers: list[tuple[bytes, str]], tmp: Path):
    """Write ``repo:sha256-<digest>.sig`` holding these (payload, signature) layers, as cosign lays
    it out, replacing whatever is there: an attacker with write access to the registry."""
    layout = sign.Layout(tmp)
    descs = [layout.blob(payload, sign.SIMPLE_SIGNING, annotations={sign.SIGNATURE_ANNOTATION: sig})
             for payload, sig in layers]
    config = layout.blob(json.dumps({"rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]}}).encode(),
                         sign.OCI_CONFIG)
    layout.manifest({"schemaVersion": 2, "mediaType": sign.OCI_MANIFEST, "config": config, "layers": descs}, "s")
    layout.push("s", RegistryRef(registry, repo, sign.sig_tag(digest)), RegistryOptions())


def _signed_layers(registry: str, repo: str, digest: str, tmp: Path) -> list[tuple[bytes, str]]:
    """The (payload, signature) pairs of ``digest``'s .sig manifest, payloads pulled by skopeo."""
    sig = f"docker://{registry}/{repo}:{sign.sig_tag(digest)}"
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", sig, f"dir:{tmp}"],
                   check=True, capture_output=True)
    return [((tmp / lay["digest"][7:]).read_bytes(), lay["annotations"][sign.SIGNATURE_ANNOTATION])
            for lay in _sig_manifest(registry, repo, digest)["layers"]]


def test_skopeo_accepts_the_signed_digest_with_its_key_only(skopeo, registry, keys, tmp_path):
    repo = f"docker://{registry}/bakes/a"
    digest = push_image(registry, "bakes/a", "sm_90", b"layer-a", tmp_path)
    skopeo.refuses(f"{repo}@{digest}", keys / "right.pub", "A signature was required, but no signature exists")
    _sign(f"{repo}:sm_90", keys / "right.key")
    copied = skopeo.accepts(f"{repo}@{digest}", keys / "right.pub")
    assert "sha256:" + hashlib.sha256((copied / "manifest.json").read_bytes()).hexdigest() == digest
    skopeo.accepts(f"{repo}@{digest}", keys / "right.pub", inline=True)  # keyData, as a policy embeds it
    skopeo.accepts(f"{repo}:sm_90", keys / "right.pub")  # by tag
    # the default identity rule refuses a repository-only identity, cosign's as ours
    skopeo.refuses(f"{repo}@{digest}", keys / "right.pub", "is not accepted", identity=None)
    skopeo.refuses(f"{repo}@{digest}", keys / "other.pub", "cryptographic signature verification failed")
    skopeo.refuses(f"{repo}@{digest}", keys / "other.pub", "cryptographic signature verification failed",
                   inline=True)
    # a second signer appends: either key is accepted, a third is not
    assert _sign(f"{repo}:sm_90", keys / "other.key")["signed"][0]["signatures"] == 2
    skopeo.accepts(f"{repo}@{digest}", keys / "other.pub")
    skopeo.accepts(f"{repo}@{digest}", keys / "right.pub")
    skopeo.refuses(f"{repo}@{digest}", keys / "third.pub", "cryptographic signature verification failed")


def test_skopeo_refuses_a_tampered_payload_another_digests_signature_and_a_moved_tag(
        skopeo, registry, keys, tmp_path):
    repo = f"docker://{registry}/bakes/b"
    good = push_image(registry, "bakes/b", "good", b"layer-good", tmp_path / "good")
    _sign(f"{repo}:good", keys / "right.key")
    skopeo.accepts(f"{repo}:good", keys / "right.pub")
    (payload, signature), = _signed_layers(registry, "bakes/b", good, tmp_path / "sig-good")

    # another digest's signature: the good image's .sig manifest copied to an unsigned image's tag
    evil = push_image(registry, "bakes/b", "evil", b"layer-evil", tmp_path / "evil")
    _put_sig_manifest(registry, "bakes/b", evil, [(payload, signature)], tmp_path / "copied")
    skopeo.refuses(f"{repo}@{evil}", keys / "right.pub", "does not match")
    # a payload rewritten to name the evil digest, the signature kept: it no longer verifies
    forged = payload.replace(good.encode(), evil.encode())
    assert forged != payload and sign.payload_digest(forged) == evil
    _put_sig_manifest(registry, "bakes/b", evil, [(forged, signature)], tmp_path / "forged")
    skopeo.refuses(f"{repo}@{evil}", keys / "right.pub", "cryptographic signature verification failed")
    # a signature with one bit changed, over the good payload
    sig = bytearray(base64.b64decode(signature))
    sig[-1] ^= 1
    _put_sig_manifest(registry, "bakes/b", good, [(payload, base64.b64encode(bytes(sig)).decode())],
                      tmp_path / "flipped")
    skopeo.refuses(f"{repo}@{good}", keys / "right.pub", "cryptographic signature verification failed")

    # the tag moved: signed while it named one image, it now names another nobody signed
    first = push_image(registry, "bakes/b", "sm_90", b"layer-first", tmp_path / "first")
    _sign(f"{repo}:sm_90", keys / "right.key")
    skopeo.accepts(f"{repo}:sm_90", keys / "right.pub")
    moved = push_image(registry, "bakes/b", "sm_90", b"layer-moved", tmp_path / "moved")
    assert moved != first
    skopeo.refuses(f"{repo}:sm_90", keys / "right.pub", "A signature was required, but no signature exists")
    skopeo.accepts(f"{repo}@{first}", keys / "right.pub")  # the signed digest itself still is


def _index(registry: str, repo: str, tmp: Path) -> tuple[str, list[str]]:
    children = [push_image(registry, repo, t, t.encode(), tmp / t) for t in ("sm_90", "sm_100")]
    sizes = [len(raw_manifest(f"docker://{registry}/{repo}@{d}")) for d in children]
    raw = json.dumps({"schemaVersion": 2, "mediaType": sign.OCI_INDEX, "manifests": [
        {"mediaType": sign.OCI_MANIFEST, "digest": d, "size": s,
         "platform": {"architecture": "amd64", "os": "linux"}} for d, s in zip(children, sizes)]}).encode()
    sign.put_manifest(RegistryRef(registry, repo, "all"), raw, sign.OCI_INDEX, RegistryOptions())
    return f"sha256:{hashlib.sha256(raw).hexdigest()}", children


def test_skopeo_accepts_an_index_and_each_child(skopeo, registry, keys, tmp_path):
    index, children = _index(registry, "bakes/d", tmp_path)
    repo = f"docker://{registry}/bakes/d"
    skopeo.refuses(f"{repo}@{index}", keys / "right.pub", "A signature was required, but no signature exists")
    out = _sign(f"{repo}:all", keys / "right.key")
    assert [s["digest"] for s in out["signed"]] == [index, *children]
    skopeo.accepts(f"{repo}@{index}", keys / "right.pub", "--all")
    skopeo.refuses(f"{repo}@{index}", keys / "other.pub", "cryptographic signature verification failed")
    for child in children:
        skopeo.accepts(f"{repo}@{child}", keys / "right.pub")
        skopeo.refuses(f"{repo}@{child}", keys / "other.pub", "cryptographic signature verification failed")


# ------------------------------------------------------------ sigstore-js: the bundle form


class SigstoreJS:
    def __init__(self, node: str, modules: Path, root: Path):
        self.node, self.modules, self.root = node, modules, root
        self.n = 0

    def verify(self, bundle: bytes, artifact: bytes, key: Path, by_hint=False) -> subprocess.CompletedProcess:
        self.n += 1
        (self.root / f"b{self.n}.json").write_bytes(bundle)
        (self.root / f"a{self.n}").write_bytes(artifact)
        return subprocess.run([self.node, str(VERIFIERS / "verify-bundle.js"), str(self.root / f"b{self.n}.json"),
                               str(self.root / f"a{self.n}"), str(key), *(["--by-hint"] if by_hint else [])],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
                              env={**os.environ, "NODE_PATH": str(self.modules)})

    def accepts(self, bundle: bytes, artifact: bytes, key: Path, by_hint=False) -> None:
        r = self.verify(bundle, artifact, key, by_hint)
        assert r.returncode == 0 and r.stdout == "verified\n", r.stderr

    def refuses(self, bundle: bytes, artifact: bytes, key: Path, why: str, by_hint=False) -> None:
        r = self.verify(bundle, artifact, key, by_hint)
        assert r.returncode == 1 and r.stderr.startswith(why), (r.stdout, r.stderr)


@pytest.fixture(scope="module")
def sigstore_js(tmp_path_factory) -> SigstoreJS:
    node = shutil.which("node") or shutil.which("nodejs")
    modules = Path(os.environ.get(SIGSTORE_JS_ENV) or (CI_SIGSTORE_JS if CI_SIGSTORE_JS.is_dir() else
                                                       VERIFIERS / "node_modules"))
    if not node:
        _unavailable("no node (apt-get install nodejs npm; .ci/run does)")
    if not (modules / "@sigstore" / "verify" / "package.json").is_file():
        _unavailable(f"no sigstore-js in {modules} (npm ci --prefix tests/verifiers, or set ${SIGSTORE_JS_ENV})")
    locked = json.loads((VERIFIERS / "package-lock.json").read_text())["packages"]
    for name in ("@sigstore/verify", "@sigstore/bundle"):
        installed = json.loads((modules / name / "package.json").read_text())["version"]
        assert installed == locked[f"node_modules/{name}"]["version"], f"{name} {installed} is not the pinned one"
    return SigstoreJS(node, modules, tmp_path_factory.mktemp("sigstore-js"))


def _bundles(registry: str, repo: str, digest: str, tmp: Path) -> list[bytes]:
    """The bundles the referrers tag schema lists for ``digest`` (OCI distribution spec), each
    pulled by skopeo: the discovery cosign does, by the spec's steps."""
    index = json.loads(raw_manifest(f"docker://{registry}/{repo}:{sign.referrers_tag(digest)}"))
    tmp.mkdir(parents=True, exist_ok=True)
    out = []
    for i, entry in enumerate(e for e in index["manifests"] if e.get("artifactType") == sign.BUNDLE):
        dest = tmp / f"bundle-{digest[7:19]}-{i}"
        subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                        f"docker://{registry}/{repo}@{entry['digest']}", f"dir:{dest}"], check=True, capture_output=True)
        manifest = json.loads((dest / "manifest.json").read_bytes())
        assert manifest["subject"]["digest"] == digest and manifest["artifactType"] == sign.BUNDLE
        (layer,) = manifest["layers"]
        assert layer["mediaType"] == sign.BUNDLE
        out.append((dest / layer["digest"][7:]).read_bytes())
    return out


def _artifact(registry: str, repo: str, digest: str) -> bytes:
    """The image manifest's bytes: what the bundle's message signature is over."""
    raw = raw_manifest(f"docker://{registry}/{repo}@{digest}")
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest
    return raw


def _message_digest_names(bundle: bytes, artifact: bytes) -> bool:
    """sigstore-js compares messageDigest only against a transparency-log entry (there is none
    here); a verifier given the digest (cosign, sigstore-go) compares it to that: so do we."""
    md = json.loads(bundle)["messageSignature"]["messageDigest"]
    return md == {"algorithm": "SHA2_256", "digest": base64.b64encode(hashlib.sha256(artifact).digest()).decode()}


def test_sigstore_js_verifies_the_bundle_with_its_key_only(sigstore_js, registry, keys, tmp_path):
    repo = f"docker://{registry}/bakes/e"
    digest = push_image(registry, "bakes/e", "sm_90", b"layer-e", tmp_path)
    other_image = _artifact(registry, "bakes/e",
                            push_image(registry, "bakes/e", "other", b"layer-e2", tmp_path / "other"))
    _sign(f"{repo}:sm_90", keys / "right.key")
    (bundle,) = _bundles(registry, "bakes/e", digest, tmp_path)
    artifact = _artifact(registry, "bakes/e", digest)
    assert _message_digest_names(bundle, artifact) and not _message_digest_names(bundle, other_image)
    sigstore_js.accepts(bundle, artifact, keys / "right.pub")
    sigstore_js.accepts(bundle, artifact, keys / "right.pub", by_hint=True)  # our hint is the key's
    sigstore_js.refuses(bundle, artifact, keys / "other.pub", "SIGNATURE_ERROR")
    sigstore_js.refuses(bundle, artifact, keys / "other.pub", "PUBLIC_KEY_ERROR", by_hint=True)
    sigstore_js.refuses(bundle, other_image, keys / "right.pub", "SIGNATURE_ERROR")  # another digest
    sigstore_js.refuses(bundle, artifact + b" ", keys / "right.pub", "SIGNATURE_ERROR")  # tampered
    doc = json.loads(bundle)
    sig = bytearray(base64.b64decode(doc["messageSignature"]["signature"]))
    sig[-1] ^= 1
    doc["messageSignature"]["signature"] = base64.b64encode(bytes(sig)).decode()
    sigstore_js.refuses(json.dumps(doc).encode(), artifact, keys / "right.pub", "SIGNATURE_ERROR")
    # a second signer's bundle joins the referrers list; each verifies with its own key
    _sign(f"{repo}:sm_90", keys / "other.key")
    first, second = _bundles(registry, "bakes/e", digest, tmp_path / "two")
    assert first == bundle
    sigstore_js.accepts(second, artifact, keys / "other.pub", by_hint=True)
    sigstore_js.refuses(second, artifact, keys / "right.pub", "SIGNATURE_ERROR")


def test_sigstore_js_verifies_an_index_and_each_child(sigstore_js, registry, keys, tmp_path):
    index, children = _index(registry, "bakes/f", tmp_path)
    _sign(f"docker://{registry}/bakes/f:all", keys / "right.key")
    for digest in (index, *children):
        (bundle,) = _bundles(registry, "bakes/f", digest, tmp_path)
        artifact = _artifact(registry, "bakes/f", digest)
        assert _message_digest_names(bundle, artifact)
        sigstore_js.accepts(bundle, artifact, keys / "right.pub", by_hint=True)
        sigstore_js.refuses(bundle, artifact, keys / "other.pub", "SIGNATURE_ERROR")


# ----------------------------------------------------------------- a real bake, both forms


def test_a_signed_push_of_a_real_bake_passes_both_stock_verifiers(skopeo, sigstore_js, registry, keys,
                                                                   baked, tmp_path):
    ref = f"docker://{registry}/bakes/real:sm_90"
    r = cli("push", baked["artifact"], ref, "--sign-key", keys / "right.key", "--json")
    assert r.returncode == 0, r.stderr
    pushed = json.loads(r.stdout)
    digest = pushed["pushed"][0]["manifest_digest"]
    assert [s["digest"] for s in pushed["signed"][0]["signed"]] == [digest]
    copied = skopeo.accepts(f"docker://{registry}/bakes/real@{digest}", keys / "right.pub")
    layers = json.loads((copied / "manifest.json").read_bytes())["layers"]
    assert layers and all((copied / lay["digest"][7:]).is_file() for lay in layers)  # the bake came through
    skopeo.refuses(f"docker://{registry}/bakes/real@{digest}", keys / "other.pub",
                   "cryptographic signature verification failed")
    (bundle,) = _bundles(registry, "bakes/real", digest, tmp_path)
    artifact = _artifact(registry, "bakes/real", digest)
    assert _message_digest_names(bundle, artifact)
    sigstore_js.accepts(bundle, artifact, keys / "right.pub", by_hint=True)
    sigstore_js.refuses(bundle, artifact, keys / "other.pub", "SIGNATURE_ERROR")
