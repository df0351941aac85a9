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

A pull is bounded by what the image manifest declares, because a registry is hostile input too
(one that sends an endless body, or one byte every few seconds).  skopeo alone is not: it reads
a blob until the connection ends (containers/image checks the digest at EOF, which an endless
body never reaches), so it writes until TMPDIR is full, and it has no stall timeout.  The pull:

1. reads the manifest first (``skopeo inspect --raw``: containers/image caps a manifest at
   4 MiB), parses it strictly (cachebake.jsonio) and checks it as install does
   (``check_image_manifest``), then copies *that* manifest, pinned by its digest, so the
   registry cannot answer the copy with another one;
2. checks the declared sizes against TMPDIR's free space before any blob is requested (exit 3);
3. runs ``skopeo copy`` with ``RLIMIT_FSIZE`` at the largest declared blob: the kernel refuses
   any write past it (EFBIG: Go ignores SIGXFSZ, so skopeo fails with "file too large" and
   stops reading), so no blob can be written past the largest declared size, however long
   its body;
4. watches the layout's files while skopeo writes them (skopeo names its temp blob files
   ``oci-put-blob*`` in the layout): more bytes on disk than the manifest declares in all is
   "longer than declared" (exit 5), and fewer than ``STALL_MIN_BYTES`` within
   ``--stall-timeout`` seconds is a stalled registry (exit 12, ``Stalled``); either way skopeo
   is killed and the private layout removed.

Watching skopeo, rather than a blob reader of our own, keeps what skopeo is here for (every
login a registry asks for, TLS settings, digest checks on the way in); the cost is that the
bound on a single blob is the largest declared blob, not that blob's own size (a config blob
could grow to the layer's size before the total check sees it), and a stall is seen between
polls (``POLL_S``), not at the socket.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cachebake.errors import BadInput, CorruptArtifact, Stalled, Unsupported, from_os_error

SCHEMES = ("docker://", "oci://")
SKOPEO_TIMEOUT_S = 3600.0  # push, and the outer bound of any one pull
# A pull that gains fewer than STALL_MIN_BYTES (or all it still lacks, if less) within the stall
# timeout has stalled: curl's --speed-limit/--speed-time rule, at about 1 KiB/s by default.
STALL_TIMEOUT_S = 60.0
STALL_MIN_BYTES = 64 << 10
POLL_S = 0.1
# Room for what skopeo writes besides the declared blobs: index.json and oci-layout.
LAYOUT_SLACK = 64 << 10
# Docker's grammar for a reference's repository path components and tags
# (github.com/distribution/reference, reference.go), without the optional docker.io defaulting:
# a bake's registry is always named.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
# \Z, not $: $ also matches before a final newline, which would pass "docker://h/r\n" through.
_REFERENCE = re.compile(rf"^(?P<host>{_HOST})/(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)"
                        rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?\Z", re.ASCII)
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
    stall_timeout: float = STALL_TIMEOUT_S  # a pull: see the module docstring

    def flags(self, ref: RegistryRef, direction: str) -> list[str]:
        """skopeo's flags for one side of a copy (``src``/``dest``), or for ``inspect`` (``""``)."""
        prefix = f"--{direction}-" if direction else "--"
        verify = self.tls_verify if self.tls_verify is not None else not ref.loopback
        out = [f"{prefix}tls-verify={'true' if verify else 'false'}"]
        if self.authfile:
            if not os.path.isfile(self.authfile):
                raise BadInput(f"{self.authfile}: no such credentials file (--authfile)")
            out.append(f"{prefix}authfile={self.authfile}")
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
    """skopeo's last error line as one of our errors: a digest mismatch, a blob longer than
    declared and a document over skopeo's size limit are a corrupt artifact (5); everything else (no such tag, refused credentials, no route) is bad input
    (3) naming the reference."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "skopeo failed"
    last = re.sub(r'^time="[^"]*" level=\w+ msg="?', "", last).rstrip('"')
    if re.search(r"digest|checksum", last, re.I) and re.search(r"match|verif|invalid", last, re.I):
        return CorruptArtifact(f"{what}: the registry sent a blob that does not match its digest "
                               f"(nothing installed): {last}")
    limit = re.search(r"exceeded maximum allowed size of (\d+) bytes", last)
    if limit:  # skopeo's own bound on a document it reads whole (a manifest, a config)
        return CorruptArtifact(f"{what}: the registry sent an image manifest or config over skopeo's "
                               f"size limit ({int(limit.group(1))} bytes): nothing installed")
    if re.search(r"file too large", last, re.I):  # EFBIG: RLIMIT_FSIZE stopped it (see fetch)
        return CorruptArtifact(f"{what}: the registry sent a blob longer than declared: stopped "
                               "at the manifest's largest blob size (nothing installed)")
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
    signed: list[dict] = field(default_factory=list)  # push --sign-key: each sign report

    def to_dict(self) -> dict:
        out = {"artifact": self.artifact, "pushed": [asdict(p) for p in self.pushed]}
        if self.signed:
            out["signed"] = self.signed
        return out

    def render(self, console) -> None:
        for p in self.pushed:
            console.print(f"pushed {p.target} to {p.reference}", markup=False, soft_wrap=True)
            console.print(f"  pinned: {p.pinned}", markup=False, soft_wrap=True)
        for report in self.signed:
            for s in report["signed"]:
                console.print(f"  signed {s['digest']} with {report['key']}", markup=False, soft_wrap=True)


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


@dataclass(frozen=True)
class PullBudget:
    """What an image manifest declares a pull will write: its blobs' sizes."""

    manifest: bytes  # the raw manifest, as the registry sent it (pinned by its digest)
    blob_sizes: tuple[int, ...]  # config, then the layer

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    @property
    def blobs(self) -> int:
        return sum(self.blob_sizes)

    @property
    def total(self) -> int:
        """The most the layout may hold: every declared blob, the manifest, index.json."""
        return self.blobs + len(self.manifest) + LAYOUT_SLACK

    @property
    def file_limit(self) -> int:
        """RLIMIT_FSIZE for skopeo: no file it writes may outgrow the largest declared blob."""
        return max(*self.blob_sizes, len(self.manifest), LAYOUT_SLACK)


def read_image_manifest(ref: RegistryRef, options: RegistryOptions, what: str) -> PullBudget:
    """The image manifest ``ref`` names, checked as install checks a local one: strict JSON,
    one config and one layer, sizes in range.  Bounded in time by the stall timeout (a manifest
    is a few hundred bytes: a registry that cannot send it in that time has stalled)."""
    from cachebake.artifact.schema import CAP_IMAGE_MANIFEST, check_image_manifest
    from cachebake.jsonio import parse_json

    try:
        r = subprocess.run([skopeo_binary(), "inspect", "--raw", *options.flags(ref, ""), ref.skopeo()],
                           capture_output=True, stdin=subprocess.DEVNULL, timeout=options.stall_timeout)
    except subprocess.TimeoutExpired:
        raise Stalled(f"{what}: the registry sent no image manifest in {options.stall_timeout:g} s "
                      "(--stall-timeout); nothing installed") from None
    if r.returncode != 0:
        raise skopeo_error(what, r.stderr.decode("utf-8", "replace"))
    raw = r.stdout
    document = f"{ref}: image manifest"
    if len(raw) > CAP_IMAGE_MANIFEST:
        raise CorruptArtifact(f"{document}: is {len(raw)} bytes, over the {CAP_IMAGE_MANIFEST} "
                              "this reader accepts")
    doc = parse_json(raw, document)
    if isinstance(doc, dict) and "manifests" in doc:
        raise BadInput(f"{what}: the reference names an image index, not a bake image (name the "
                       "image `cachebake push` printed)")
    doc = check_image_manifest(doc, document)
    budget = PullBudget(raw, (doc["config"]["size"], *(layer["size"] for layer in doc["layers"])))
    if ref.digest and budget.digest != ref.digest:
        raise CorruptArtifact(f"{document}: its digest is {budget.digest}, not the {ref.digest} "
                              "the reference pins")
    return budget


def check_free_space(budget: PullBudget, where: Path) -> None:
    """The declared sizes against the free space of TMPDIR (where the pull lands), before any
    blob is requested: a pull that cannot fit fails now, not with a full disk."""
    try:
        st = os.statvfs(where)
    except OSError as e:
        raise BadInput(f"TMPDIR ({where.parent}): {e.strerror}") from None
    free = st.f_bavail * st.f_frsize
    if budget.total > free:
        raise BadInput(f"TMPDIR ({where.parent}) has {free / 1e6:.1f} MB free; the image's blobs "
                       f"declare {budget.blobs / 1e6:.1f} MB (set TMPDIR to a larger filesystem)")


def _layout_bytes(layout: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(layout):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except FileNotFoundError:  # a temp blob renamed or removed between walk and lstat
                pass
    return total


def _file_size_limit(limit: int):
    def apply():  # in the child, before exec: the kernel holds every file skopeo writes to it
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def pull_bounded(args: list[str], what: str, *, layout: Path, budget: PullBudget,
                 stall_timeout: float, log: Path) -> None:
    """Run ``skopeo copy ARGS`` into ``layout``, held to ``budget`` (module docstring: the
    file size limit, the total, the stall timeout); kill it at the first breach."""
    with open(log, "wb") as err:  # a file, not a pipe: skopeo can never block on it
        proc = subprocess.Popen([skopeo_binary(), *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                preexec_fn=_file_size_limit(budget.file_limit))
    try:
        start = mark_time = time.monotonic()
        mark_bytes = 0
        while True:
            try:
                rc = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            now, got = time.monotonic(), _layout_bytes(layout)
            if got > budget.total:
                raise CorruptArtifact(f"{what}: the registry sent more than the {budget.blobs} bytes "
                                      "the image manifest declares (a blob longer than declared); "
                                      "stopped, nothing installed")
            mark_bytes = min(mark_bytes, got)  # a retried blob starts again from zero
            if got - mark_bytes >= min(STALL_MIN_BYTES, max(budget.blobs - mark_bytes, 1)):
                mark_bytes, mark_time = got, now
            elif now - mark_time >= stall_timeout or now - start >= SKOPEO_TIMEOUT_S:
                raise Stalled(f"{what}: stalled: {max(got - mark_bytes, 0)} bytes arrived in the "
                              f"last {now - mark_time:.0f} s, under the {STALL_MIN_BYTES} the stall "
                              f"timeout asks for in {stall_timeout:g} s (--stall-timeout); stopped, "
                              "nothing installed")
    finally:
        if proc.poll() is None:  # ours, in its own session: its group is skopeo and its helpers
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    if rc != 0:
        raise skopeo_error(what, log.read_bytes()[-64 << 10:].decode("utf-8", "replace"))


def fetch(reference: str, dest: Path, *, target: str | None = None,
          fingerprint_file: str | None = None, options: RegistryOptions | None = None) -> RegistryRef:
    """Copy one image from the registry into a new OCI layout at ``dest`` (skopeo verifies
    every blob's digest on the way in), bounded by what its manifest declares (the module
    docstring).  ``dest``'s parent is a private directory of the caller's, in TMPDIR.  Returns
    the reference actually read."""
    options = options or RegistryOptions()
    ref = parse_reference(reference)
    # The layout names the image by its target (sm_90) whatever the registry calls it, so
    # the artifact reader finds it; it then checks the image's own manifest says that target.
    local_name = tag_for(target, fingerprint_file)
    if not ref.tag and not ref.digest:
        ref = ref.with_tag(local_name)
    what = f"pull {ref}"
    budget = read_image_manifest(ref, options, what)
    check_free_space(budget, dest.parent)
    pinned = RegistryRef(ref.host, ref.repository, None, budget.digest)
    pull_bounded(["copy", "--quiet", "--preserve-digests", "--retry-times", "3",
                  *options.flags(ref, "src"), pinned.skopeo(), f"oci:{dest}:{local_name}"],
                 what, layout=dest, budget=budget, stall_timeout=options.stall_timeout,
                 log=dest.parent / "skopeo.log")
    return ref


def install_reference(reference: str, to: os.PathLike | str, *, target: str | None = None,
                      fingerprint_file: str | None = None, options: RegistryOptions | None = None,
                      verify=None, **install_options):
    """``cachebake install docker://...``: fetch into a private temp layout, then install it
    with cachebake.install (every check of a local install; nothing in DIR before they pass).
    ``verify``: called with the reference (its tag resolved) before anything is pulled
    (distribute.sign.verify_reference with the trusted keys: it raises SignatureRefused, or
    returns what it verified); the pull is then pinned to the verified digest and install.json
    records the digest and the key.  A callable, not an import: sign.py sits above this module."""
    from cachebake.install import install_artifact

    ref = parse_reference(reference)  # a bad reference fails before any preflight work
    signature = None
    if verify is not None:  # verified before anything is pulled or written; then pulled by that digest
        if not ref.tag and not ref.digest:
            ref = ref.with_tag(tag_for(target, fingerprint_file))
        verified = verify(str(ref))
        signature = verified.record()
        reference = f"docker://{ref.name}@{verified.digest}"
    try:
        tmp = Path(tempfile.mkdtemp(prefix="cachebake-pull-"))  # 0700: private until removed
    except OSError as e:
        raise from_os_error(e, f"TMPDIR ({tempfile.gettempdir()})", "cannot make the pull's "
                            "private directory") from None
    try:
        layout = tmp / "layout"
        pulled = fetch(reference, layout, target=target, fingerprint_file=fingerprint_file,
                       options=options)
        # install.json and the report name the reference, not the temp layout removed below
        return install_artifact(layout, to, target=target, fingerprint_file=fingerprint_file,
                                artifact_name=str(pulled) if not ref.digest else reference,
                                **({"signature": signature} if signature else {}), **install_options)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
