"""Bakes in an OCI registry: ``cachebake push ART REF`` and ``cachebake install REF``.

The client is skopeo (github.com/containers/skopeo), run as a subprocess:

* it already is the project's reference OCI tool (the tests validate every artifact with it),
  and it copies our images as they are (``--preserve-digests``: it fails rather than
  recompress or convert, so the digests in the bake manifest stay true);
* its registry code (containers/image) verifies every blob's digest as it downloads and does
  every kind of authentication a registry asks for: basic credentials, bearer-token exchange
  (``WWW-Authenticate: Bearer realm=...``), credential helpers (``credHelpers``/``credsStore``),
  read from ``--authfile``, ``REGISTRY_AUTH_FILE``, ``$XDG_RUNTIME_DIR/containers/auth.json`` or
  ``~/.docker/config.json`` (all one format: a Kubernetes ``dockerconfigjson`` Secret mounted
  as a file works as is);
* the Python OCI clients we looked at do less: oras-py reads only the ``auths`` entries of
  docker's config (no credential helpers, so no ECR/GCR/ACR logins), and a client of our
  own would be one more registry client to get right.

The cost is a binary: an init-container image that installs from a registry needs ``skopeo``
(Debian/Ubuntu package ``skopeo``; docker/installer.Dockerfile installs it).  Installing from a
local artifact needs nothing but cachebake.

References: ``docker://HOST[:PORT]/REPO[:TAG|@DIGEST]`` or ``oci://...`` (the same thing, as
Helm and ORAS spell it).  A reference without tag or digest means one tag per GPU target:
``push`` writes ``REPO:sm_90`` (one per bake in the artifact), ``install`` reads the tag of the
serving GPU's target.  As Docker does, registries on a loopback address are spoken to over
plain HTTP unless ``--tls-verify`` says otherwise; every other registry needs TLS unless
``--no-tls-verify``.

Install from a registry fetches the one image into a private temp OCI layout (a 0700 dir,
removed afterwards) and installs from that through cachebake.install, exactly as a local
artifact: every blob is verified again against its digest and every layer entry checked before
anything is written to DIR.  (A streaming path, verifying the blob while it decompresses, waits
for install's layer-stream interface.)
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cachebake.errors import BadInput, CorruptArtifact, Unsupported

SCHEMES = ("docker://", "oci://")
SKOPEO_TIMEOUT_S = 3600.0
# Docker's grammar for a reference's repository path components and tags
# (github.com/distribution/reference, reference.go), without the optional docker.io defaulting:
# a bake's registry is always named.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_REFERENCE = re.compile(rf"^(?P<host>{_HOST})/(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)"
                        rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?\Z", re.ASCII)  # \Z: $ allows a final newline
# An image name as a Pod spec gives it: the registry host is optional there (docker.io).
_IMAGE_NAME = re.compile(rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?"
                         r"(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,})?", re.ASCII)


@dataclass(frozen=True)
class RegistryRef:
    host: str  # with port
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"

    def with_tag(self, tag: str) -> "RegistryRef":
        return RegistryRef(self.host, self.repository, tag, None)

    def skopeo(self) -> str:
        """skopeo's spelling: ``docker://host/repo:tag`` (or ``@digest``)."""
        if self.digest:
            return f"docker://{self.name}@{self.digest}"
        return f"docker://{self.name}:{self.tag or 'latest'}"

    def __str__(self) -> str:
        return self.skopeo()

    @property
    def loopback(self) -> bool:
        host = self.host.rsplit(":", 1)[0] if not self.host.startswith("[") else self.host[1:].split("]")[0]
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def is_image_name(text: str) -> bool:
    """``[HOST[:PORT]/]REPO[:TAG][@DIGEST]``: the form a Pod spec's ``image`` takes."""
    return isinstance(text, str) and len(text) <= 4096 and _IMAGE_NAME.fullmatch(text) is not None


def is_reference(text: str) -> bool:
    return isinstance(text, str) and text.startswith(SCHEMES)


def parse_reference(text: str) -> RegistryRef:
    """``docker://HOST/REPO[:TAG][@DIGEST]`` (or ``oci://``) into its parts; BadInput otherwise."""
    scheme = next((s for s in SCHEMES if text.startswith(s)), None)
    if scheme is None:
        raise BadInput(f"{text}: not a registry reference (use docker://HOST/REPO[:TAG] or oci://...)")
    m = _REFERENCE.match(text[len(scheme):])
    if not m:
        raise BadInput(f"{text}: not a valid image reference (HOST[:PORT]/REPO[:TAG][@sha256:...], "
                       "lower-case repository)")
    return RegistryRef(m["host"], m["repo"], m["tag"], m["digest"])


@dataclass
class RegistryOptions:
    """How to talk to the registry: TLS (None: off for loopback registries only, as Docker
    does) and where credentials are (None: skopeo's own search, see the module docstring)."""

    tls_verify: bool | None = None
    authfile: str | None = None

    def flags(self, ref: RegistryRef, direction: str) -> list[str]:
        verify = self.tls_verify if self.tls_verify is not None else not ref.loopback
        out = [f"--{direction}-tls-verify={'true' if verify else 'false'}"]
        if self.authfile:
            if not os.path.isfile(self.authfile):
                raise BadInput(f"{self.authfile}: no such credentials file (--authfile)")
            out.append(f"--{direction}-authfile={self.authfile}")
        return out


def skopeo_binary() -> str:
    path = os.environ.get("CACHEBAKE_SKOPEO") or shutil.which("skopeo")
    if not path:
        raise Unsupported("registry references need skopeo, which is not installed here "
                          "(Debian/Ubuntu: apt-get install skopeo)")
    return path


def _run_skopeo(args: list[str], what: str) -> None:
    try:
        r = subprocess.run([skopeo_binary(), *args], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=SKOPEO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BadInput(f"{what}: skopeo gave no answer in {SKOPEO_TIMEOUT_S:.0f} s") from None
    if r.returncode != 0:
        raise skopeo_error(what, r.stderr)


def skopeo_error(what: str, stderr: str):
    """skopeo's last error line as one of our errors: a digest mismatch is a corrupt
    artifact (5); everything else (no such tag, refused credentials, no route) is bad input
    (3) naming the reference."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "skopeo failed"
    last = re.sub(r'^time="[^"]*" level=\w+ msg="?', "", last).rstrip('"')
    if re.search(r"digest|checksum", last, re.I) and re.search(r"match|verif|invalid", last, re.I):
        return CorruptArtifact(f"{what}: the registry sent a blob that does not match its digest "
                               f"(nothing installed): {last}")
    return BadInput(f"{what}: {last}")


# ------------------------------------------------------------------------------------- push


@dataclass
class PushedImage:
    target: str
    reference: str  # as pushed: docker://host/repo:tag
    pinned: str  # docker://host/repo@sha256:... : what a Pod spec should name
    manifest_digest: str
    layer_digest: str


@dataclass
class PushReport:
    artifact: str
    pushed: list[PushedImage] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"artifact": self.artifact, "pushed": [asdict(p) for p in self.pushed]}

    def render(self, console) -> None:
        for p in self.pushed:
            console.print(f"pushed {p.target} to {p.reference}", markup=False, soft_wrap=True)
            console.print(f"  pinned: {p.pinned}", markup=False, soft_wrap=True)


def _oci_source(layout: Path, ref_name: str) -> str:
    if ":" in str(layout):
        # skopeo's oci: transport splits PATH:REF at the first colon of the whole string
        raise BadInput(f"{layout}: skopeo cannot read an OCI layout whose path contains ':'")
    return f"oci:{layout}:{ref_name}"


def push_artifact(artifact: os.PathLike | str, reference: str, *, target: str | None = None,
                  options: RegistryOptions | None = None) -> PushReport:
    """Push the artifact's bake(s) as OCI images: every target to ``REPO:<ref name>`` when
    ``reference`` has no tag, else the one bake (``target``, or the only one) to that tag."""
    from cachebake.artifact.oci import open_artifact
    from cachebake.gpu import GPUTargetSpec

    options = options or RegistryOptions()
    ref = parse_reference(reference)
    if ref.digest:
        raise BadInput(f"{reference}: push to a tag, not a digest (the digest is the result)")
    art = open_artifact(artifact)
    layout = Path(artifact).resolve()
    targets = [GPUTargetSpec.parse(target).key] if target else art.targets()
    if ref.tag and len(targets) > 1:
        raise BadInput(f"{artifact} holds bakes for {', '.join(targets)}: pass --target, or "
                       "push to a reference without a tag (one tag per target)")
    report = PushReport(str(artifact))
    for key in targets:
        bake = art.select(key)  # verifies manifest, config and the layer descriptor
        dest = ref.with_tag(ref.tag or GPUTargetSpec.parse(key).ref_name)
        entry = art.entries_by_target()[key]
        ref_name = (entry.get("annotations") or {}).get("org.opencontainers.image.ref.name")
        if not ref_name:
            raise CorruptArtifact(f"{artifact}: the index entry for {key} has no ref name")
        with tempfile.TemporaryDirectory(prefix="cachebake-push-") as tmp:
            digestfile = Path(tmp) / "digest"
            _run_skopeo(["copy", "--quiet", "--preserve-digests", "--retry-times", "3",
                         f"--digestfile={digestfile}", *options.flags(dest, "dest"),
                         _oci_source(layout, ref_name), dest.skopeo()],
                        f"push {key} to {dest}")
            pushed = digestfile.read_text().strip()
        if pushed != bake.manifest_digest:
            raise CorruptArtifact(f"push {key} to {dest}: the registry holds {pushed}, not the "
                                  f"artifact's image {bake.manifest_digest}")
        report.pushed.append(PushedImage(key, str(dest), f"docker://{dest.name}@{pushed}",
                                         pushed, bake.layer_digest))
    return report


# ---------------------------------------------------------------------------------- install


def tag_for(target: str | None, fingerprint_file: str | None) -> str:
    """The tag a reference without one means: the ref name of ``target``, else of the serving
    fingerprint's target, else of the visible GPU."""
    from cachebake.artifact.fingerprint import Fingerprint
    from cachebake.gpu import GPUTargetSpec, resolve_target

    if target:
        return GPUTargetSpec.parse(target).ref_name
    if fingerprint_file:
        return GPUTargetSpec.parse(Fingerprint.load(fingerprint_file).target).ref_name
    return resolve_target(None)[0].ref_name


def fetch(reference: str, dest: Path, *, target: str | None = None,
          fingerprint_file: str | None = None, options: RegistryOptions | None = None) -> RegistryRef:
    """Copy one image from the registry into a new OCI layout at ``dest`` (skopeo verifies
    every blob's digest on the way in).  Returns the reference actually read."""
    options = options or RegistryOptions()
    ref = parse_reference(reference)
    # The layout names the image by its target (sm_90) whatever the registry calls it, so
    # the artifact reader finds it; it then checks the image's own manifest says that target.
    local_name = tag_for(target, fingerprint_file)
    if not ref.tag and not ref.digest:
        ref = ref.with_tag(local_name)
    _run_skopeo(["copy", "--quiet", "--preserve-digests", "--retry-times", "3",
                 *options.flags(ref, "src"), ref.skopeo(), f"oci:{dest}:{local_name}"],
                f"pull {ref}")
    return ref


def install_reference(reference: str, to: os.PathLike | str, *, target: str | None = None,
                      fingerprint_file: str | None = None, options: RegistryOptions | None = None,
                      **install_options):
    """``cachebake install docker://...``: fetch into a private temp layout, then install it
    with cachebake.install (every check of a local install; nothing in DIR before they pass)."""
    from cachebake.install import install_artifact

    ref = parse_reference(reference)  # a bad reference fails before any preflight work
    tmp = Path(tempfile.mkdtemp(prefix="cachebake-pull-"))  # 0700: private until removed
    try:
        layout = tmp / "layout"
        pulled = fetch(reference, layout, target=target, fingerprint_file=fingerprint_file,
                       options=options)
        # install.json and the report name the reference, not the temp layout removed below
        return install_artifact(layout, to, target=target, fingerprint_file=fingerprint_file,
                                artifact_name=str(pulled) if not ref.digest else reference,
                                **install_options)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
