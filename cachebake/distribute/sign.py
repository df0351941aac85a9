"""Sign a pushed bake, and verify one before anything of it is extracted, offline.

Why: a bake's layer holds code the server runs (Triton's launcher ``.so`` files it dlopens,
Inductor's generated Python, pickled graphs).  Install checks every digest against the
manifest, but the manifest travels with the artifact: whoever can write to the registry
chooses both.  A signature made with a key the registry never sees closes that: install
refuses an image no trusted key signed (``install --verify-key``, exit 13).

Two forms, both what stock verifiers read (docs/trust.md):

* cosign's signature (sigstore/cosign specs/SIGNATURE_SPEC.md): the Simple Signing payload
  (``critical.image.docker-manifest-digest`` names the signed digest) as a layer of media type
  ``application/vnd.dev.cosign.simplesigning.v1+json`` in an OCI image manifest tagged
  ``sha256-<hex>.sig`` in the image's repository, the base64 DER ECDSA-P256-SHA256 signature
  over the payload bytes in the layer's ``dev.cosignproject.cosign/signature`` annotation.
  ``cosign verify --key``, Kyverno (``publicKeys``) and policy-controller (``key.data``) read
  it.  A signature manifest that exists is appended to, never replaced: two reproducible bakes
  share a digest, so two signers can sign the same image.  (The append reads, adds, writes:
  two signers at the same instant can lose one signature, as cosign's own tag scheme can --
  the spec says "racy".)
* the Sigstore bundle (sigstore/cosign specs/BUNDLE_SPEC.md; protobuf-specs' Bundle, media
  type ``application/vnd.dev.sigstore.bundle.v0.3+json``): a ``messageSignature`` over the
  signed manifest's own bytes (its ``messageDigest`` is therefore the image digest), the key
  named by ``verificationMaterial.publicKey.hint``; stored as an OCI 1.1 referrer of the image
  (``subject``), found through the registry's referrers API, or where the registry has none
  (Debian's docker-registry 2.8), through the referrers tag schema: the tag ``sha256-<hex>``
  holding an image index of the referrers, which this module appends to.

An image index is signed together with each image it lists.

Registry I/O is skopeo's (registry.py says why): blobs and manifests go up as an OCI layout
built here (``skopeo copy --preserve-digests``: the bytes signed are the bytes pushed), except
the referrers-tag index, which skopeo 1.9 cannot push as it is (``put_manifest`` says why),
and come
down into a private ``dir:`` copy (skopeo checks every blob's digest; the copy is bounded by
the sizes the manifest declares, as a bake pull is).  The referrers API
(``GET /v2/<name>/referrers/<digest>``) has no skopeo verb: that one request goes through the
standard library's HTTP client (``referrers_api``), anonymously; a registry that wants a login
for it, or has no such API, is read and written through the tag schema instead.

What verification checks, and only that: a signature by a trusted key over a claim that names
this exact manifest digest.  Not who pushed, not when, not that the bake is any good; no
transparency log, no expiry, no revocation (docs/trust.md)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cachebake.distribute import keys as keyring
from cachebake.distribute.registry import (PullBudget, RegistryOptions, RegistryRef, _run_skopeo,
                                           parse_reference, pull_bounded, skopeo_binary, skopeo_error)
from cachebake.errors import BadInput, CorruptArtifact, SignatureRefused, Stalled, from_os_error

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
COSIGN_TYPE = "cosign container image signature"
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
BUNDLE_CONTENT = "dev.sigstore.bundle.content"
CREATED = "org.opencontainers.image.created"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
EMPTY = b"{}"
EMPTY_DESCRIPTOR = {"mediaType": "application/vnd.oci.empty.v1+json",
                    "digest": "sha256:" + hashlib.sha256(EMPTY).hexdigest(), "size": len(EMPTY)}
# Bounds on what a hostile registry can make a verifier read.
MAX_MANIFEST = 4 << 20  # containers/image's own cap on a manifest
MAX_SIGNATURES = 256  # layers of one .sig manifest, entries of one referrers index
MAX_PAYLOAD = 64 << 10  # a Simple Signing payload is ~250 bytes; a bundle ~600
MAX_CHILDREN = 64  # images of one index signed with it
ZERO_TIME = "0001-01-01T00:00:00Z"  # go-containerregistry's empty image config, as cosign writes it


def sig_tag(digest: str) -> str:
    """cosign's tag-based discovery: ``sha256:<hex>`` -> ``sha256-<hex>.sig``."""
    return digest.replace(":", "-", 1) + ".sig"


def referrers_tag(digest: str) -> str:
    """The OCI distribution spec's referrers tag schema: ``<alg>-<ref>``, truncated to 128."""
    return digest.replace(":", "-", 1)[:128]


def simple_signing_payload(docker_reference: str, digest: str) -> bytes:
    """The bytes cosign signs (sigstore/sigstore pkg/signature/payload: Go's json.Marshal of the
    Simple Signing document, no optional claims): field order and spacing as Go writes them."""
    doc = {"critical": {"identity": {"docker-reference": docker_reference},
                        "image": {"docker-manifest-digest": digest},
                        "type": COSIGN_TYPE},
           "optional": None}
    return json.dumps(doc, separators=(",", ":")).encode()


def payload_digest(raw: bytes) -> str | None:
    """The digest a Simple Signing payload claims, or None where it is no cosign payload.
    (``docker-reference`` is ignored, as the spec says: a copy in a mirror still verifies.)"""
    from cachebake.jsonio import parse_json

    try:
        doc = parse_json(raw, "signature payload")
    except CorruptArtifact:
        return None
    crit = doc.get("critical") if isinstance(doc, dict) else None
    image = crit.get("image") if isinstance(crit, dict) else None
    if not isinstance(image, dict) or crit.get("type") != COSIGN_TYPE:
        return None
    digest = image.get("docker-manifest-digest")
    return digest if isinstance(digest, str) else None


def bundle_document(private_key, signed: bytes) -> bytes:
    """A Sigstore bundle v0.3 (protobuf-specs ``Bundle`` in its JSON form: camelCase, bytes as
    standard base64) holding a message signature over ``signed`` (a manifest's bytes)."""
    public = keyring.public_of(private_key)
    doc = {"mediaType": BUNDLE,
           "verificationMaterial": {"publicKey": {"hint": public.hint}},
           "messageSignature": {"messageDigest": {"algorithm": "SHA2_256",
                                                  "digest": base64.b64encode(hashlib.sha256(signed).digest()).decode()},
                                "signature": keyring.sign_bytes(private_key, signed)}}
    return json.dumps(doc, separators=(",", ":")).encode()


def bundle_verifies(raw: bytes, signed: bytes, key: keyring.PublicKey) -> bool:
    """Whether the bundle ``raw`` is a message signature over ``signed`` by ``key``."""
    from cachebake.jsonio import parse_json

    try:
        doc = parse_json(raw, "sigstore bundle")
    except CorruptArtifact:
        return False
    if not isinstance(doc, dict) or not str(doc.get("mediaType", "")).startswith("application/vnd.dev.sigstore.bundle"):
        return False
    msg = doc.get("messageSignature")
    md = msg.get("messageDigest") if isinstance(msg, dict) else None
    if not isinstance(md, dict) or md.get("algorithm") != "SHA2_256" \
            or md.get("digest") != base64.b64encode(hashlib.sha256(signed).digest()).decode():
        return False
    signature = msg.get("signature")
    return isinstance(signature, str) and key.verifies(signature, signed)


# ------------------------------------------------------------------------ registry, skopeo


def _digest(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _pinned(ref: RegistryRef, digest: str) -> RegistryRef:
    return RegistryRef(ref.host, ref.repository, None, digest)


def inspect_raw(ref: RegistryRef, options: RegistryOptions) -> bytes | None:
    """The manifest ``ref`` names, as the registry sent it, or None where there is none."""
    try:
        r = subprocess.run([skopeo_binary(), "inspect", "--raw", *options.flags(ref, ""), ref.skopeo()],
                           capture_output=True, stdin=subprocess.DEVNULL, timeout=options.stall_timeout)
    except subprocess.TimeoutExpired:
        raise Stalled(f"read {ref}: the registry sent no manifest in {options.stall_timeout:g} s") from None
    if r.returncode != 0:
        err = r.stderr.decode("utf-8", "replace")
        if "manifest unknown" in err or "not found" in err.lower():
            return None
        raise skopeo_error(f"read {ref}", err)
    if len(r.stdout) > MAX_MANIFEST:
        raise CorruptArtifact(f"{ref}: a manifest over {MAX_MANIFEST} bytes")
    if ref.digest and _digest(r.stdout) != ref.digest:
        raise CorruptArtifact(f"{ref}: the registry sent a manifest of digest {_digest(r.stdout)}")
    return r.stdout


def _parse(raw: bytes, what: str) -> dict | None:
    from cachebake.jsonio import parse_json

    try:
        doc = parse_json(raw, what)
    except CorruptArtifact:
        return None
    return doc if isinstance(doc, dict) else None


def _descriptors(doc: dict | None, key: str) -> list[dict]:
    """``doc[key]`` where it is a list of well-formed descriptors (digest, size), else []."""
    items = doc.get(key) if doc else None
    if not isinstance(items, list):
        return []
    out = []
    for d in items[:MAX_SIGNATURES]:
        if isinstance(d, dict) and isinstance(d.get("digest"), str) and d["digest"].startswith("sha256:") \
                and len(d["digest"]) == 71 and isinstance(d.get("size"), int) and 0 <= d["size"]:
            out.append(d)
    return out


def pull_small(ref: RegistryRef, raw: bytes, dest: Path, options: RegistryOptions) -> dict[str, bytes]:
    """The blobs of the manifest ``raw`` (pinned: ``ref`` by its digest), each at most
    MAX_PAYLOAD, copied by skopeo into ``dest`` (a ``dir:`` copy, no format conversion) and
    read back checked against their digests: digest -> bytes."""
    doc = _parse(raw, f"{ref}: manifest") or {}
    blobs = ([doc["config"]] if isinstance(doc.get("config"), dict) else []) + _descriptors(doc, "layers")
    if any(b.get("size", MAX_PAYLOAD + 1) > MAX_PAYLOAD for b in blobs):
        raise CorruptArtifact(f"{ref}: a signature blob over {MAX_PAYLOAD} bytes")
    budget = PullBudget(raw, tuple(b["size"] for b in blobs) or (0,))
    pinned = _pinned(ref, _digest(raw))
    dest.mkdir()
    pull_bounded(["copy", "--quiet", "--preserve-digests", *options.flags(ref, "src"), pinned.skopeo(),
                  f"dir:{dest}"], f"read {pinned}", layout=dest, budget=budget,
                 stall_timeout=options.stall_timeout, log=dest.parent / f"{dest.name}.log")
    out = {}
    for b in blobs:
        try:
            data = (dest / b["digest"][7:]).read_bytes()
        except OSError:
            continue
        if _digest(data) == b["digest"]:
            out[b["digest"]] = data
    return out


class Layout:
    """An OCI image layout being built, to push with ``skopeo copy oci:DIR:NAME``."""

    def __init__(self, root: Path):
        self.root = root
        (root / "blobs" / "sha256").mkdir(parents=True)
        (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        self.index: list[dict] = []

    def blob(self, data: bytes, media_type: str, **extra) -> dict:
        digest = _digest(data)
        (self.root / "blobs" / "sha256" / digest[7:]).write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}

    def manifest(self, doc: dict, name: str) -> tuple[bytes, dict]:
        raw = json.dumps(doc, separators=(",", ":")).encode()
        desc = self.blob(raw, doc["mediaType"])
        self.index.append({**desc, "annotations": {"org.opencontainers.image.ref.name": name}})
        (self.root / "index.json").write_text(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                          "manifests": self.index}))
        return raw, desc

    def push(self, name: str, dest: RegistryRef, options: RegistryOptions) -> None:
        if ":" in str(self.root):
            raise BadInput(f"{self.root}: skopeo cannot read an OCI layout whose path contains ':' (set TMPDIR)")
        args = ["copy", "--quiet", "--preserve-digests", "--retry-times", "3"]
        _run_skopeo([*args, *options.flags(dest, "dest"), f"oci:{self.root}:{name}", dest.skopeo()],
                    f"push {dest}")


# --------------------------------------------------------------------------- referrers API


def referrers_api(ref: RegistryRef, digest: str, options: RegistryOptions) -> list[dict] | None:
    """The registry's referrers of ``digest`` (OCI distribution spec, "Listing Referrers"), or
    None where the registry answers 404 (no referrers API: use the tag schema) or asks for a
    login (this anonymous client cannot give one: the tag schema, read and written by skopeo
    with its logins, is used instead).  skopeo has no verb for this request, so it is the
    standard library's."""
    import http.client

    conn = _connection(ref, options)
    try:
        conn.request("GET", f"/v2/{ref.repository}/referrers/{digest}",
                     headers={"Accept": OCI_INDEX})
        resp = conn.getresponse()
        body = resp.read(MAX_MANIFEST + 1)
    except (OSError, http.client.HTTPException) as e:
        raise BadInput(f"referrers of {ref.name}@{digest}: {e}") from None
    finally:
        conn.close()
    if resp.status in (401, 403, 404, 405):
        return None
    if resp.status != 200 or len(body) > MAX_MANIFEST:
        raise BadInput(f"referrers of {ref.name}@{digest}: HTTP {resp.status}")
    return _descriptors(_parse(body, "referrers index"), "manifests")


def _connection(ref: RegistryRef, options: RegistryOptions):
    import http.client
    import ssl

    verify = options.tls_verify if options.tls_verify is not None else not ref.loopback
    host, _, port = ref.host.rpartition(":") if not ref.host.endswith("]") else (ref.host, "", "")
    if not host or not port.isdigit():
        host, port = ref.host, ""
    cls = http.client.HTTPSConnection if verify else http.client.HTTPConnection
    kw = {"context": ssl.create_default_context()} if verify else {}
    return cls(host.strip("[]"), int(port) if port else None, timeout=options.stall_timeout, **kw)


def put_manifest(ref: RegistryRef, raw: bytes, media_type: str, options: RegistryOptions) -> None:
    """PUT the referrers-tag index as these exact bytes.  Not skopeo: skopeo 1.9
    (containers/image 5.23) re-serializes an image index it copies, dropping ``artifactType``
    and the annotations by which verifiers (cosign included) pick bundles out of the list, and
    with ``--preserve-digests`` it refuses the copy.  Anonymous, as ``referrers_api``: a
    registry that wants a login here is refused with a clear line."""
    import http.client

    conn = _connection(ref, options)
    try:
        conn.request("PUT", f"/v2/{ref.repository}/manifests/{ref.tag}", body=raw,
                     headers={"Content-Type": media_type})
        resp = conn.getresponse()
        resp.read(64 << 10)
    except (OSError, http.client.HTTPException) as e:
        raise BadInput(f"push {ref}: {e}") from None
    finally:
        conn.close()
    if resp.status in (401, 403):
        raise BadInput(f"push {ref}: the registry wants a login for the referrers tag, which this "
                       "client does not give (the cosign signature was written; the bundle is "
                       "there by digest but not listed)")
    if resp.status not in (200, 201):
        raise BadInput(f"push {ref}: HTTP {resp.status}")


def referrers(ref: RegistryRef, digest: str, options: RegistryOptions) -> tuple[list[dict], bool]:
    """(referrers of ``digest``, whether the registry's referrers API answered)."""
    found = referrers_api(ref, digest, options)
    if found is not None:
        return found, True
    raw = inspect_raw(ref.with_tag(referrers_tag(digest)), options)
    return _descriptors(_parse(raw, "referrers tag") if raw else None, "manifests"), False


# ---------------------------------------------------------------------------------- signing


@dataclass
class Signed:
    digest: str
    media_type: str
    signature_tag: str  # host/repo:sha256-<hex>.sig
    signatures: int  # in that manifest, ours included
    bundle: str  # host/repo@sha256:... of the bundle referrer
    referrers: str  # "api" or the fallback tag written
    already: bool = False  # this key had signed it already: the .sig manifest was left as it was


@dataclass
class SignReport:
    reference: str
    key: str  # the public key's fingerprint
    signed: list[Signed] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"reference": self.reference, "key": self.key, "signed": [asdict(s) for s in self.signed]}

    def render(self, console) -> None:
        for s in self.signed:
            how = "already signed by this key" if s.already else f"signed ({s.signatures} signature(s) there)"
            console.print(f"{s.digest}: {how}: {s.signature_tag}", markup=False, soft_wrap=True)
            console.print(f"  bundle: {s.bundle} (referrers: {s.referrers})", markup=False, soft_wrap=True)


def _media_type(doc: dict | None) -> str:
    if doc and isinstance(doc.get("mediaType"), str):
        return doc["mediaType"]
    return OCI_INDEX if doc and "manifests" in doc else OCI_MANIFEST


def resolve(ref: RegistryRef, options: RegistryOptions) -> tuple[bytes, str]:
    """(the manifest ``ref`` names, its digest); BadInput where the registry has none."""
    raw = inspect_raw(ref, options)
    if raw is None:
        raise BadInput(f"{ref}: no such image in the registry (manifest unknown)")
    return raw, _digest(raw)


def sign_reference(reference: str, key_path: str, options: RegistryOptions | None = None) -> SignReport:
    """Sign the image ``reference`` names (a tag is resolved to its digest once, here), and
    each image of it when it is an index: both forms (module docstring)."""
    options = options or RegistryOptions()
    ref = parse_reference(reference)
    if not ref.tag and not ref.digest:
        raise BadInput(f"{reference}: name the image to sign by tag or digest")
    private = keyring.load_private_key(key_path)
    public = keyring.public_of(private, key_path)
    raw, digest = resolve(ref, options)
    doc = _parse(raw, f"{ref}: manifest")
    targets = [(raw, digest, _media_type(doc))]
    if _media_type(doc) in (OCI_INDEX, DOCKER_LIST):
        children = _descriptors(doc, "manifests")
        if len(children) > MAX_CHILDREN:
            raise BadInput(f"{reference}: an index of over {MAX_CHILDREN} images")
        for child in children:
            child_raw = inspect_raw(_pinned(ref, child["digest"]), options)
            if child_raw is None:
                raise BadInput(f"{reference}: the index lists {child['digest']}, which the registry lacks")
            targets.append((child_raw, child["digest"], _media_type(_parse(child_raw, "child manifest"))))
    report = SignReport(str(ref), public.fingerprint)
    try:
        tmp = Path(tempfile.mkdtemp(prefix="cachebake-sign-"))
    except OSError as e:
        raise from_os_error(e, f"TMPDIR ({tempfile.gettempdir()})", "cannot make a private directory") from None
    try:
        for i, (target_raw, target_digest, media) in enumerate(targets):
            work = tmp / str(i)
            work.mkdir()
            tag, count, already = _sign_cosign(ref, target_digest, private, public, work, options)
            bundle, where = _sign_bundle(ref, target_raw, target_digest, media, private, work, options)
            report.signed.append(Signed(target_digest, media, f"{ref.name}:{tag}", count,
                                        f"{ref.name}@{bundle}", where, already))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _sign_cosign(ref, digest, private, public, work: Path, options) -> tuple[str, int, bool]:
    tag = sig_tag(digest)
    sig_ref = ref.with_tag(tag)
    existing = inspect_raw(sig_ref, options)
    layers: list[dict] = []
    blobs: dict[str, bytes] = {}
    if existing is not None:
        doc = _parse(existing, f"{sig_ref}: manifest")
        if doc is None or not isinstance(doc.get("layers"), list):
            raise CorruptArtifact(f"{sig_ref}: not an image manifest: refusing to overwrite it")
        layers = _descriptors(doc, "layers")
        if len(layers) != len(doc["layers"]) or len(layers) >= MAX_SIGNATURES:
            raise CorruptArtifact(f"{sig_ref}: a signature manifest this will not append to "
                                  f"(malformed layers, or {MAX_SIGNATURES} signatures already)")
        blobs = pull_small(ref, existing, work / "existing", options)
        for layer in layers:
            payload = blobs.get(layer["digest"])
            sig = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION)
            if payload is not None and payload_digest(payload) == digest and isinstance(sig, str) \
                    and public.verifies(sig, payload):
                return tag, len(layers), True  # this key's signature is there: nothing to add
            if payload is None:
                raise CorruptArtifact(f"{sig_ref}: layer {layer['digest']} could not be read back")
    payload = simple_signing_payload(ref.name, digest)
    layout = Layout(work / "sig")
    for layer in layers:
        layout.blob(blobs[layer["digest"]], layer.get("mediaType", SIMPLE_SIGNING))
    new = layout.blob(payload, SIMPLE_SIGNING,
                      annotations={SIGNATURE_ANNOTATION: keyring.sign_bytes(private, payload)})
    layers.append(new)
    config = {"architecture": "", "config": {}, "created": ZERO_TIME,
              "history": [{"created": ZERO_TIME} for _ in layers], "os": "",
              "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]}}
    config_desc = layout.blob(json.dumps(config, separators=(",", ":")).encode(), OCI_CONFIG)
    layout.manifest({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc,
                     "layers": layers}, "sig")
    layout.push("sig", sig_ref, options)
    return tag, len(layers), False


def _sign_bundle(ref, signed_raw, digest, media, private, work: Path, options) -> tuple[str, str]:
    layout = Layout(work / "bundle")
    config = layout.blob(EMPTY, EMPTY_DESCRIPTOR["mediaType"])
    bundle = layout.blob(bundle_document(private, signed_raw), BUNDLE)
    annotations = {BUNDLE_CONTENT: "message-signature",
                   CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _, desc = layout.manifest({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": BUNDLE,
                               "config": config, "layers": [bundle],
                               "subject": {"mediaType": media, "digest": digest, "size": len(signed_raw)},
                               "annotations": annotations}, "bundle")
    layout.push("bundle", _pinned(ref, desc["digest"]), options)
    if referrers_api(ref, digest, options) is not None:
        return desc["digest"], "api"  # the registry indexed it by its subject
    # the referrers tag schema: an index of every referrer, this one appended
    tag_ref = ref.with_tag(referrers_tag(digest))
    existing = inspect_raw(tag_ref, options)
    entries = []
    if existing is not None:
        doc = _parse(existing, f"{tag_ref}: referrers index")
        if doc is None or not isinstance(doc.get("manifests"), list):
            raise CorruptArtifact(f"{tag_ref}: not an image index: refusing to overwrite it")
        entries = [d for d in _descriptors(doc, "manifests") if d["digest"] != desc["digest"]]
        if len(entries) >= MAX_SIGNATURES:
            raise CorruptArtifact(f"{tag_ref}: {MAX_SIGNATURES} referrers already")
    entries.append({"mediaType": OCI_MANIFEST, "digest": desc["digest"], "size": desc["size"],
                    "artifactType": BUNDLE, "annotations": annotations})
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries},
                       separators=(",", ":")).encode()
    put_manifest(tag_ref, index, OCI_INDEX, options)
    return desc["digest"], tag_ref.tag


# ----------------------------------------------------------------------------- verification


@dataclass
class Verified:
    reference: str
    digest: str  # the manifest digest that was verified: what install then pulls, pinned
    key: str  # the verifying key's fingerprint (sha256 of its DER)
    key_name: str
    form: str  # "cosign-signature" or "sigstore-bundle"

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self, console) -> None:
        console.print(f"{self.reference}: verified {self.digest} ({self.form}) with {self.key_name} "
                      f"({self.key})", markup=False, soft_wrap=True)

    def record(self) -> dict[str, str]:
        """What install.json records."""
        return {"digest": self.digest, "key": self.key, "form": self.form}


def verify_reference(reference: str, trusted: list[keyring.PublicKey],
                     options: RegistryOptions | None = None) -> Verified:
    """The digest ``reference`` names now, verified: a signature over it by one of ``trusted``
    in either form; SignatureRefused (exit 13) otherwise.  Reads only signatures and manifests."""
    options = options or RegistryOptions()
    ref = parse_reference(reference)
    if not trusted:
        raise BadInput("no trusted key to verify with")
    raw, digest = resolve(ref, options)
    try:
        tmp = Path(tempfile.mkdtemp(prefix="cachebake-verify-"))
    except OSError as e:
        raise from_os_error(e, f"TMPDIR ({tempfile.gettempdir()})", "cannot make a private directory") from None
    seen = []
    try:
        found = _verify_cosign(ref, digest, trusted, tmp, options, seen) \
            or _verify_bundles(ref, raw, digest, trusted, tmp, options, seen)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if found:
        key, form = found
        return Verified(str(ref), digest, key.fingerprint, key.name, form)
    names = ", ".join(k.name for k in trusted[:3]) + (" ..." if len(trusted) > 3 else "")
    if not seen:
        raise SignatureRefused(f"{ref}: {digest} is not signed (no {sig_tag(digest)} signature, no "
                               "bundle referrer): nothing installed")
    raise SignatureRefused(f"{ref}: none of the {len(seen)} signature(s) of {digest} verifies with "
                           f"the trusted key(s) ({names}): nothing installed")


def _verify_cosign(ref, digest, trusted, tmp: Path, options, seen: list):
    sig_ref = ref.with_tag(sig_tag(digest))
    existing = inspect_raw(sig_ref, options)
    if existing is None:
        return None
    layers = [d for d in _descriptors(_parse(existing, "signature manifest"), "layers")
              if d.get("mediaType") == SIMPLE_SIGNING]
    if not layers:
        return None
    blobs = pull_small(ref, existing, tmp / "cosign", options)
    for layer in layers:
        seen.append(layer["digest"])
        payload = blobs.get(layer["digest"])
        sig = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION)
        if payload is None or not isinstance(sig, str) or payload_digest(payload) != digest:
            continue
        for key in trusted:
            if key.verifies(sig, payload):
                return key, "cosign-signature"
    return None


def _verify_bundles(ref, raw, digest, trusted, tmp: Path, options, seen: list):
    entries, _ = referrers(ref, digest, options)
    for i, entry in enumerate(e for e in entries if e.get("artifactType") == BUNDLE):
        manifest_raw = inspect_raw(_pinned(ref, entry["digest"]), options)
        doc = _parse(manifest_raw, "bundle manifest") if manifest_raw else None
        subject = doc.get("subject") if doc else None
        if not isinstance(subject, dict) or subject.get("digest") != digest:
            continue
        blobs = pull_small(ref, manifest_raw, tmp / f"bundle-{i}", options)
        for layer in _descriptors(doc, "layers"):
            bundle = blobs.get(layer["digest"])
            if layer.get("mediaType") != BUNDLE or bundle is None:
                continue
            seen.append(layer["digest"])
            for key in trusted:
                if bundle_verifies(bundle, raw, key):
                    return key, "sigstore-bundle"
    return None


def trusted_keys(verify_keys: tuple[str, ...] | list[str], policy: str | None) -> list[keyring.PublicKey]:
    """The keys ``--verify-key`` (files or PEM text) and ``--verify-policy`` name, together."""
    out = [keyring.load_public_key(k) for k in verify_keys]
    if policy:
        out += keyring.load_policy(policy)
    return out

