"""`cachebake sign`, `verify-signature` and `install --verify-key` against a real registry
(Debian's docker-registry 2.8 on 127.0.0.1, started here in a temp dir) with real skopeo:
right key, wrong key, unsigned, tampered, tag moved; and the bytes against cosign's specs."""

import base64
import hashlib
import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from installkit import baked, cli, tree_state  # noqa: F401
from registrykit import push_image as _push_image
from registrykit import running_registry

from cachebake.distribute import keys as keyring
from cachebake.distribute import sign
from cachebake.distribute.registry import RegistryOptions, RegistryRef
from cachebake.errors import ExitCode, SignatureRefused

pytest.importorskip("cryptography")


# ------------------------------------------------------------------ the bytes, against the specs

def test_simple_signing_payload_is_cosigns_form():
    digest = "sha256:" + "ab" * 32
    raw = sign.simple_signing_payload("127.0.0.1:5000/bakes/x", digest)
    # SIGNATURE_SPEC.md "Simple Signing": critical.identity/image/type, optional; Go's compact JSON
    assert raw == (b'{"critical":{"identity":{"docker-reference":"127.0.0.1:5000/bakes/x"},'
                   b'"image":{"docker-manifest-digest":"' + digest.encode() + b'"},'
                   b'"type":"cosign container image signature"},"optional":null}')
    assert sign.payload_digest(raw) == digest
    assert sign.payload_digest(raw.replace(b"cosign container", b"other")) is None
    assert sign.sig_tag(digest) == "sha256-" + "ab" * 32 + ".sig"
    assert sign.referrers_tag(digest) == "sha256-" + "ab" * 32


def test_bundle_is_a_v03_message_signature_over_the_manifest(tmp_path):
    keyring.generate(str(tmp_path / "k"))
    private = keyring.load_private_key(str(tmp_path / "k.key"))
    public = keyring.load_public_key(str(tmp_path / "k.pub"))
    manifest = b'{"schemaVersion":2}'
    doc = json.loads(sign.bundle_document(private, manifest))
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert doc["verificationMaterial"]["publicKey"]["hint"] == \
        base64.b64encode(hashlib.sha256(public.der).digest()).decode()
    md = doc["messageSignature"]["messageDigest"]
    assert md == {"algorithm": "SHA2_256", "digest": base64.b64encode(hashlib.sha256(manifest).digest()).decode()}
    assert sign.bundle_verifies(json.dumps(doc).encode(), manifest, public)
    assert not sign.bundle_verifies(json.dumps(doc).encode(), manifest + b" ", public)


def test_keys_p256_only_and_policy_files(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    other = ec.generate_private_key(ec.SECP384R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "p384.pub").write_bytes(other)
    r = cli("verify-signature", "docker://127.0.0.1:1/x:t", "--key", tmp_path / "p384.pub")
    assert r.returncode == ExitCode.BAD_INPUT and "P-256" in r.stderr
    keyring.generate(str(tmp_path / "a"))
    pem = (tmp_path / "a.pub").read_text()
    assert keyring.load_public_key(pem).fingerprint == keyring.load_public_key(str(tmp_path / "a.pub")).fingerprint
    (tmp_path / "policy.json").write_text(json.dumps({"keys": [{"name": "ci", "pem": pem}]}))
    assert [k.name for k in keyring.load_policy(str(tmp_path / "policy.json"))] == [f"{tmp_path}/policy.json: ci"]
    (tmp_path / "bad.json").write_text('{"keys": [], "x": 1}')
    r = cli("verify-signature", "docker://127.0.0.1:1/x:t", "--policy", tmp_path / "bad.json")
    assert r.returncode == ExitCode.BAD_INPUT and r.stderr.count("\n") == 1
    with pytest.raises(Exception):
        keyring.generate(str(tmp_path / "a"))  # never over an existing key
    assert (tmp_path / "a.key").stat().st_mode & 0o777 == 0o600


# ------------------------------------------------------------------------- a real registry

@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """Debian's docker-registry on 127.0.0.1 (what .ci/run installs), or a skip."""
    with running_registry(tmp_path_factory.mktemp("registry")) as host:
        yield host


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    for name in ("right", "other"):
        assert cli("keygen", d / name).returncode == 0
    return d


def _sign(ref, key, **kw):
    r = cli("sign", ref, "--key", key, "--json", **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _verify(ref, *keyfiles):
    args = [a for k in keyfiles for a in ("--key", k)]
    return cli("verify-signature", ref, *args, "--json")


def test_signed_verifies_with_its_key_only_and_signatures_append(registry, keys, tmp_path):
    digest = _push_image(registry, "bakes/a", "sm_90", b"layer-a", tmp_path)
    ref = f"docker://{registry}/bakes/a:sm_90"
    assert _verify(ref, keys / "right.pub").returncode == ExitCode.SIGNATURE  # unsigned
    out = _sign(ref, keys / "right.key")
    assert out["signed"][0]["digest"] == digest and out["signed"][0]["signatures"] == 1
    r = _verify(ref, keys / "right.pub")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["digest"] == digest and v["form"] == "cosign-signature"
    assert v["key"] == keyring.load_public_key(str(keys / "right.pub")).fingerprint
    r = _verify(ref, keys / "other.pub")
    # the cosign signature and the bundle: two signatures, neither by this key
    assert r.returncode == ExitCode.SIGNATURE and "none of the 2 signature" in r.stderr
    # a second signer (a reproducible bake shares the digest) appends; re-signing adds nothing
    assert _sign(ref, keys / "other.key")["signed"][0]["signatures"] == 2
    again = _sign(ref, keys / "right.key")["signed"][0]
    assert again["already"] and again["signatures"] == 2
    assert _verify(ref, keys / "other.pub").returncode == 0
    assert _verify(ref, keys / "right.pub").returncode == 0
    # the .sig manifest, as cosign's spec lays it out
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                          f"docker://{registry}/bakes/a:{sign.sig_tag(digest)}"], capture_output=True, check=True).stdout
    m = json.loads(raw)
    assert m["mediaType"] == sign.OCI_MANIFEST and len(m["layers"]) == 2
    assert {lay["mediaType"] for lay in m["layers"]} == {sign.SIMPLE_SIGNING}
    assert all(sign.SIGNATURE_ANNOTATION in lay["annotations"] for lay in m["layers"])


def test_a_moved_tag_and_a_tampered_signature_are_refused(registry, keys, tmp_path):
    repo = f"docker://{registry}/bakes/b"
    _push_image(registry, "bakes/b", "sm_90", b"layer-b", tmp_path)
    _sign(f"{repo}:sm_90", keys / "right.key")
    assert _verify(f"{repo}:sm_90", keys / "right.pub").returncode == 0
    # the tag moved to an image nobody signed: its digest has no signature
    evil = _push_image(registry, "bakes/b", "sm_90", b"layer-evil", tmp_path / "evil")
    r = _verify(f"{repo}:sm_90", keys / "right.pub")
    assert r.returncode == ExitCode.SIGNATURE and evil in r.stderr and "not signed" in r.stderr
    # a signature manifest copied over to the evil digest: the payload names the other digest
    good = _push_image(registry, "bakes/b", "good", b"layer-b", tmp_path / "good")
    subprocess.run(["skopeo", "copy", "--quiet", "--preserve-digests", "--src-tls-verify=false",
                    "--dest-tls-verify=false", f"{repo}:{sign.sig_tag(good)}", f"{repo}:{sign.sig_tag(evil)}"],
                   check=True, capture_output=True)
    r = _verify(f"{repo}:sm_90", keys / "right.pub")
    assert r.returncode == ExitCode.SIGNATURE and "none of the 1 signature" in r.stderr
    # a signature whose bytes were changed: it no longer verifies
    raw = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                     f"{repo}:{sign.sig_tag(good)}"], capture_output=True, check=True).stdout)
    layout = sign.Layout(tmp_path / "tampered")
    sig = bytearray(base64.b64decode(raw["layers"][0]["annotations"][sign.SIGNATURE_ANNOTATION]))
    sig[-1] ^= 1
    payload = sign.simple_signing_payload(f"{registry}/bakes/b", good)
    layer = layout.blob(payload, sign.SIMPLE_SIGNING,
                        annotations={sign.SIGNATURE_ANNOTATION: base64.b64encode(bytes(sig)).decode()})
    config = layout.blob(b"{}", sign.OCI_CONFIG)
    layout.manifest({"schemaVersion": 2, "mediaType": sign.OCI_MANIFEST, "config": config, "layers": [layer]}, "t")
    layout.push("t", RegistryRef(registry, "bakes/b", sign.sig_tag(good)), RegistryOptions())
    # the changed cosign signature is not taken; the bundle, untouched, still is ...
    r = _verify(f"{repo}:good", keys / "right.pub")
    assert r.returncode == 0 and json.loads(r.stdout)["form"] == "sigstore-bundle", r.stderr
    # ... until its referrers list goes too
    index = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                            f"{repo}:{sign.referrers_tag(good)}"], capture_output=True, check=True).stdout
    subprocess.run(["skopeo", "delete", "--tls-verify=false",
                    f"{repo}@sha256:{hashlib.sha256(index).hexdigest()}"], check=True)
    r = _verify(f"{repo}:good", keys / "right.pub")
    assert r.returncode == ExitCode.SIGNATURE and "none of the 1 signature" in r.stderr, r.stderr


def test_the_bundle_referrer_through_the_tag_schema(registry, keys, tmp_path):
    digest = _push_image(registry, "bakes/c", "sm_90", b"layer-c", tmp_path)
    ref = f"docker://{registry}/bakes/c:sm_90"
    out = _sign(ref, keys / "right.key")["signed"][0]
    assert out["referrers"] == sign.referrers_tag(digest)  # docker-registry 2.8: no referrers API
    index = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                       f"docker://{registry}/bakes/c:{sign.referrers_tag(digest)}"],
                                      capture_output=True, check=True).stdout)
    (entry,) = index["manifests"]
    assert entry["artifactType"] == sign.BUNDLE and entry["digest"] == out["bundle"].split("@")[1]
    assert entry["annotations"][sign.BUNDLE_CONTENT] == "message-signature"
    # take the cosign signature away: the bundle alone verifies, with the right key only
    sig_manifest = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                   f"docker://{registry}/bakes/c:{sign.sig_tag(digest)}"],
                                  capture_output=True, check=True).stdout
    subprocess.run(["skopeo", "delete", "--tls-verify=false",
                    f"docker://{registry}/bakes/c@sha256:{hashlib.sha256(sig_manifest).hexdigest()}"], check=True)
    r = _verify(ref, keys / "right.pub")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["form"] == "sigstore-bundle"
    assert _verify(ref, keys / "other.pub").returncode == ExitCode.SIGNATURE


def test_an_index_and_each_child_are_signed(registry, keys, tmp_path):
    children = [_push_image(registry, "bakes/d", t, t.encode(), tmp_path / t) for t in ("sm_90", "sm_100")]
    # the children are in the registry already: push the index alone, as its bytes
    sizes = [len(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                 f"docker://{registry}/bakes/d@{d}"], capture_output=True, check=True).stdout)
             for d in children]
    raw = json.dumps({"schemaVersion": 2, "mediaType": sign.OCI_INDEX, "manifests": [
        {"mediaType": sign.OCI_MANIFEST, "digest": d, "size": s} for d, s in zip(children, sizes)]}).encode()
    sign.put_manifest(RegistryRef(registry, "bakes/d", "all"), raw, sign.OCI_INDEX, RegistryOptions())
    out = _sign(f"docker://{registry}/bakes/d:all", keys / "right.key")
    assert [s["digest"] for s in out["signed"]] == [f"sha256:{hashlib.sha256(raw).hexdigest()}", *children]
    for d in children:
        assert _verify(f"docker://{registry}/bakes/d@{d}", keys / "right.pub").returncode == 0


def test_install_verify_key_refuses_before_writing_and_records_the_key(registry, keys, baked, tmp_path):
    repo = f"docker://{registry}/bakes/install"
    pushed = json.loads(cli("push", baked["artifact"], f"{repo}:sm_90", "--json").stdout)["pushed"][0]
    signed_push = json.loads(cli("push", baked["artifact"], f"docker://{registry}/bakes/signed:sm_90",
                                 "--sign-key", keys / "right.key", "--json").stdout)
    assert signed_push["signed"][0]["signed"][0]["digest"] == pushed["manifest_digest"]
    assert _verify(f"docker://{registry}/bakes/signed:sm_90", keys / "right.pub").returncode == 0
    dest = tmp_path / "c"
    for _ in ("unsigned", "signed by another key only"):
        r = cli("install", f"{repo}:sm_90", "--to", dest, "--target", "sm_90", "--verify-key", keys / "right.pub")
        assert r.returncode == ExitCode.SIGNATURE and r.stderr.count("\n") == 1, r.stderr
        assert not dest.exists()
        _sign(f"{repo}:sm_90", keys / "other.key")
    _sign(f"{repo}:sm_90", keys / "right.key")
    # the PEM text itself, as a Pod passes it
    r = cli("install", f"{repo}:sm_90", "--to", dest, "--target", "sm_90", "--json",
            "--verify-key", (keys / "right.pub").read_text())
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    marker = json.loads((Path(report["version_dir"]) / "install.json").read_text())
    fp = keyring.load_public_key(str(keys / "right.pub")).fingerprint
    assert marker["signature"] == {"digest": pushed["manifest_digest"], "key": fp, "form": "cosign-signature"}
    assert marker["artifact"].endswith("@" + pushed["manifest_digest"])  # pulled by the verified digest
    # a local artifact has no signatures to check
    r = cli("install", baked["artifact"], "--to", tmp_path / "d", "--verify-key", keys / "right.pub")
    assert r.returncode == ExitCode.BAD_INPUT and not (tmp_path / "d").exists()
    assert tree_state(dest)


# --------------------------------------------------------------- the referrers API code path

class ReferrersRegistry:
    """A registry that has the referrers API (OCI distribution spec, "Listing Referrers"): it
    answers GET /v2/<name>/referrers/<digest> with an image index; 404 for any other subject."""

    def __init__(self, subject: str, index: dict):
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                owner.paths.append(self.path)
                if self.path == f"/v2/bakes/x/referrers/{subject}":
                    body = json.dumps(index).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", sign.OCI_INDEX)
                else:
                    body = b'{"errors":[{"code":"NOT_FOUND"}]}'
                    self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.paths = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"


def test_referrers_api_lists_and_404_means_none():
    subject = "sha256:" + "1" * 64
    entry = {"mediaType": sign.OCI_MANIFEST, "digest": "sha256:" + "2" * 64, "size": 700,
             "artifactType": sign.BUNDLE}
    reg = ReferrersRegistry(subject, {"schemaVersion": 2, "mediaType": sign.OCI_INDEX,
                                      "manifests": [entry, {"digest": "bad"}]})
    ref = RegistryRef(reg.host, "bakes/x")
    assert sign.referrers_api(ref, subject, RegistryOptions()) == [entry]  # the malformed one dropped
    assert sign.referrers_api(ref, "sha256:" + "3" * 64, RegistryOptions()) is None
    reg.server.shutdown()


def test_verify_refusal_is_its_own_exit_code():
    assert ExitCode.SIGNATURE == 13 and SignatureRefused("x").code == 13


# ------------------------------------------------------------------------ admission policies

def _policy(tmp_path, engine, keys):
    r = cli("k8s-policy", "--engine", engine, "--key", keys / "right.pub", "--key", keys / "other.pub",
            "--image", "registry.example/bakes/*", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_policy_controller_policy_is_keyed_and_offline(keys, tmp_path):
    doc = _policy(tmp_path, "policy-controller", keys)
    assert (doc["apiVersion"], doc["kind"]) == ("policy.sigstore.dev/v1beta1", "ClusterImagePolicy")
    assert doc["spec"]["images"] == [{"glob": "registry.example/bakes/*"}]
    pems = [a["key"]["data"] for a in doc["spec"]["authorities"]]
    assert pems == [(keys / "right.pub").read_text(), (keys / "other.pub").read_text()]
    assert all("ctlog" not in a and a["signatureFormat"] == "legacy" for a in doc["spec"]["authorities"])


def test_kyverno_policy_extracts_image_volumes(keys, tmp_path):
    doc = _policy(tmp_path, "kyverno", keys)
    assert (doc["apiVersion"], doc["kind"]) == ("policies.kyverno.io/v1beta1", "ImageValidatingPolicy")
    spec = doc["spec"]
    assert "v.image.reference" in spec["images"][0]["expression"]
    assert [a["cosign"]["key"]["data"] for a in spec["attestors"]] == \
        [(keys / "right.pub").read_text(), (keys / "other.pub").read_text()]
    assert "[attestors.key0, attestors.key1]" in spec["validations"][0]["expression"]


# The engines' published CRDs, trimmed to the version the policies use (tests/data/crds/README.md:
# repositories, paths, commits, licenses).  $CACHEBAKE_TEST_POLICY_CRDS may name a directory of
# upstream CRD files (YAML, as published) to validate against too, e.g. newer ones.
CRDS = Path(__file__).parent / "data" / "crds"
CRD_ENV = "CACHEBAKE_TEST_POLICY_CRDS"
CRD_FILES = {"policy-controller": ("clusterimagepolicies.policy.sigstore.dev.v1beta1.json",
                                   "300-clusterimagepolicy.yaml"),
             "kyverno": ("imagevalidatingpolicies.policies.kyverno.io.v1beta1.json",
                         "policies.kyverno.io_imagevalidatingpolicies.yaml")}


def _crd_validator(engine: str, doc: dict, upstream_dir: str | None = None):
    """A Draft 4 validator (OpenAPI 3.0's schema dialect) for the CRD's openAPIV3Schema of the
    version ``doc`` names, with every object that lists its properties closed
    (``additionalProperties: false``) unless it says ``x-kubernetes-preserve-unknown-fields``:
    the API server drops an unknown field (kubectl apply's default, --validate=strict, refuses
    it), so a misspelt field would be a policy that silently checks less."""
    jsonschema = pytest.importorskip("jsonschema")
    vendored, upstream = CRD_FILES[engine]
    if upstream_dir is None:
        crd = json.loads((CRDS / vendored).read_text())
    else:
        yaml = pytest.importorskip("yaml")
        (crd,) = [d for d in yaml.safe_load_all((Path(upstream_dir) / upstream).read_text()) if d]
    group, version = doc["apiVersion"].split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == doc["kind"]
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]

    def closed(node):
        if isinstance(node, dict):
            node = dict(node)
            for key in ("properties", "patternProperties"):
                if key in node:
                    node[key] = {name: closed(sub) for name, sub in node[key].items()}
            for key in ("items", "additionalProperties"):
                if isinstance(node.get(key), dict):
                    node[key] = closed(node[key])
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
        return node

    root = dict(v["schema"]["openAPIV3Schema"])
    # every object's own fields, which the API server adds to a CRD's schema (a CRD may omit them)
    root["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                          "metadata": {"type": "object"}, **root.get("properties", {})}
    schema = closed(root)
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def _errors(validator, doc) -> list[str]:
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc))


@pytest.mark.parametrize("engine", ["policy-controller", "kyverno"])
def test_policies_parse_against_the_published_crd_schemas(engine, keys, tmp_path):
    """Two keys; the Kyverno policy carries the image-volume extractor
    (volumes[].image.reference), which must sit where the CRD has a place for it."""
    doc = _policy(tmp_path, engine, keys)
    if engine == "kyverno":
        assert "volumes" in doc["spec"]["images"][0]["expression"]
    assert _errors(_crd_validator(engine, doc), doc) == []
    if os.environ.get(CRD_ENV):
        assert _errors(_crd_validator(engine, doc, os.environ[CRD_ENV]), doc) == []


def _set(doc, path, value):
    *parents, last = path
    for key in parents:
        doc = doc[key]
    if value is KeyError:
        del doc[last]
    else:
        doc[last] = value


# One mutation per kind of mistake the schema catches: a wrong type, a misspelt (unknown) field,
# a value outside an enum, a required field missing.
BROKEN = [
    ("policy-controller", ("spec", "authorities"), "not a list", "spec/authorities"),
    ("policy-controller", ("spec", "authorities", 0, "key", "pem"), "x", "spec/authorities/0/key"),
    ("policy-controller", ("spec", "images", 0, "globs"), "*", "spec/images/0"),
    ("policy-controller", ("spec", "authorities", 0, "key", "data"), ["a"], "spec/authorities/0/key/data"),
    ("kyverno", ("spec", "images"), "not a list", "spec/images"),
    ("kyverno", ("spec", "failurePolicy"), "Deny", "spec/failurePolicy"),
    ("kyverno", ("spec", "validations"), KeyError, "spec"),
    ("kyverno", ("spec", "images", 0, "expression"), KeyError, "spec/images/0"),
    ("kyverno", ("spec", "attestors", 0, "cosign", "key", "pem"), "x", "spec/attestors/0/cosign/key"),
]


@pytest.mark.parametrize("engine, path, value, where", BROKEN,
                         ids=[f"{e}-{'.'.join(map(str, p))}" for e, p, _, _ in BROKEN])
def test_a_broken_policy_fails_the_crd_schema(engine, path, value, where, keys, tmp_path):
    """The validator bites: each mutation of a generated policy is refused, at the place changed."""
    doc = _policy(tmp_path, engine, keys)
    validator = _crd_validator(engine, doc)
    bad = json.loads(json.dumps(doc))
    _set(bad, path, value)
    errors = _errors(validator, bad)
    assert errors and any(e.startswith(where + ":") for e in errors), errors
