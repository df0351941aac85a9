"""``cachebake k8s``: the Kubernetes manifests for the two ways a Pod gets a bake.

``init`` (any Kubernetes): an emptyDir filled before the server starts.
  1. ``cachebake-lib`` (installer image) copies cachebake's sources into an emptyDir;
  2. ``cachebake-fingerprint`` (the *serving* image, ``PYTHONPATH`` on that copy) writes the
     serving environment's fingerprint: Triton key, Python ABI, ptxas and the server's own
     environment variables, which an installer image cannot know;
  3. ``cachebake-install`` (installer image) runs ``cachebake install REF --to /cachebake
     --serve-at ROOT --fingerprint ... --no-sync``: the server mounts the volume at ROOT, so
     Triton's group files are written for ROOT, not for the installer's mount path; no sync,
     because the emptyDir dies with the Pod and this container re-installs at every start.
  With ``--install-in-serving-image`` steps 1-2 go and the install itself runs in the serving
  image, whose preflight then reads the real environment directly; that image needs
  cachebake (and skopeo for a registry reference).  Every cachebake container runs as uid
  65534 with a read-only root filesystem, no privilege escalation and no capabilities; /tmp
  is an emptyDir (a registry pull lands there before it is verified and installed).

``image-volume`` (Kubernetes >= 1.35, ``volumes[].image``): the pushed bake image itself is
  mounted read-only at ROOT (``cachebake push`` writes the cache tree at the image's root, its
  group files written for the bake root: ROOT must be that root).  A read-only cache cannot
  take a kernel the bake missed; the serve-time layered cache manager (cachebake.serve) sends
  misses to a writable overlay: this pattern mounts an emptyDir for it and sets the variables
  it reads.  The ``vllm`` role cannot be read-only at all: Inductor writes into
  ``VLLM_CACHE_ROOT`` every time it loads a compiled graph (README, "Moving a vLLM bake").  So
  an emptyDir is mounted over ROOT/vllm, inside the read-only image volume, and filled before
  the server starts by ``cachebake-vllm-copy``: the serving image (any image with ``find`` and
  ``cp``; no cachebake needed) mounts the bake image at /cachebake-image and copies each entry
  of its ``vllm/`` tree with ``cp -a``; pack already wrote that tree for the layer root, so its
  paths are right at ROOT/vllm.  A mount inside another is valid Kubernetes (the kubelet itself pre-creates mount
  points inside read-only API-data volumes, kubernetes/kubernetes#60342), but the runtime must
  find the mount point: it cannot create ROOT/vllm in a read-only volume (EROFS,
  kubernetes/kubernetes#121294).  So the copy needs a bake that has the role, and the
  generator, given only a registry reference, cannot see the image's roles: it assumes one
  (``vllm_role``, the default) and says so; a bake without it (``--no-vllm-role``) gets an
  empty writable VLLM_CACHE_ROOT outside ROOT instead.

The image-volume pattern sets ``TRITON_CACHE_MANAGER`` to cachebake's layered cache manager,
which the server imports: a stock vLLM image has no cachebake.  So the pattern either provides
it, as the init pattern provides the fingerprint probe (``cachebake-lib``, the installer image,
copies cachebake's pure-Python sources into an emptyDir the server mounts on ``PYTHONPATH``;
the manager needs only the standard library and the image's Triton), or is told the image has
it (``serving_image_has_cachebake``, e.g. the Dockerfile's ``serving-cachebake`` stage); with
neither it refuses.  Misses are logged in the overlay; ``miss-log``, a native sidecar
(``restartPolicy: Always``, Kubernetes >= 1.29) in the serving image, streams the log to the
Pod's logs (README, "Serving"), where cluster logging keeps it after the Pod is gone.

The server's environment is ``server_env``'s (cachebake.install.environment, the one function
install and serve-args use too) for the pattern's layout (``_layout``), and the server runs as
uid ``NONROOT_UID`` (explicit: vLLM's image user is root) with a read-only root filesystem, no
privilege escalation, no capabilities and the runtime's seccomp profile; every path it writes
at import or at start is an emptyDir (HOME and, on an image volume, Inductor's and FlashInfer's
dirs in ``SCRATCH_MOUNT``; /tmp): torch makes TORCHINDUCTOR_CACHE_DIR at import, and one in the
read-only image volume killed the server before it logged a line (issue 30).

The server runs a command (never the image's entrypoint: vLLM's needs arguments): ``-- CMD...``;
else the ``vllm serve`` command of the bake itself when a local copy of it is given
(``--bake ART``, a ``--driver vllm`` bake: model path, serve args and the environment
``serve-args`` prints); else ``--model``'s recipe flags.  A ``vllm serve PATH`` reads its model
from PATH, which the Pod must provide: a PersistentVolumeClaim mounted read-only there
(``model_pvc``), or the serving image's own copy (``model_in_image``); with neither it refuses.
PATH may be an artifact's, so the claim is mounted only under ``MODEL_MOUNT_BASE`` or the
user's ``model_mount``, never around another mount (``check_model_mount``, issue 31).

The output is read by kubectl, so it is built as data and written by a serializer: the
documents by PyYAML (``render``: every value quoted as the emitter decides, so a newline,
``---`` or a quote in a command or path stays inside its string), the notes as comments only
folded onto one line (cachebake.serve.command.one_line), and the result parsed back before it
is printed: exactly one document, equal to the one built.  Names Kubernetes only takes in one
form (``--name``, images, the pull secret) are checked in that form (``check_plan``).

The init pattern's ``/tmp`` emptyDir, where the installer's registry pull lands, has a
``sizeLimit``: from the bake's declared blob sizes when a local copy of it is given
(``declared_bytes``, ``--bake``), else ``DEFAULT_TMP_SIZE``.  Without one an emptyDir is
bounded only by the node's disk.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import posixpath

from cachebake.errors import BadInput, InvalidDocument, Unsupported, UsageError
from cachebake.install.environment import BakeFacts, ServerLayout, server_env
from cachebake.roles import DEFAULT_ROOT, MISS_LOG_ENV, ROLE_ENV, role_dir
from cachebake.serve.command import comment, one_line
from cachebake.vllm.serveargs import MODEL_DIR_BASE

PATTERNS = ("init", "image-volume")
KINDS = ("deployment", "pod")
NONROOT_UID = 65534  # "nobody": owns nothing in any image
INSTALL_MOUNT = "/cachebake"  # where the installer sees the cache volume
FINGERPRINT_DIR = "/cachebake-fingerprint"
LIB_DIR = "/cachebake-lib"
AUTH_DIR = "/cachebake-auth"
OVERLAY_MOUNT = "/var/cache/cachebake-overlay"
# The overlay is a dir the server makes inside the emptyDir: the layered manager refuses an
# overlay that others can write (an emptyDir is 0777) and makes its own 0700 (README, Trust).
OVERLAY_DIR = f"{OVERLAY_MOUNT}/cachebake"
IMAGE_COPY_MOUNT = "/cachebake-image"  # where cachebake-vllm-copy sees the bake image
VLLM_COPY_MOUNT = "/cachebake-vllm"  # ...and the emptyDir it fills, the server's ROOT/vllm
VLLM_EMPTY_ROOT = "/var/cache/cachebake-vllm"  # VLLM_CACHE_ROOT for a bake without the role
# The server's writable scratch (an emptyDir): its HOME, and, where the bake's own dir is
# read-only (an image volume), what torch and FlashInfer write at import and at start: torch's
# _dynamo/package.py makes TORCHINDUCTOR_CACHE_DIR at import (EROFS in a read-only volume: the
# server dies before it logs a line, issue 30), FlashInfer JITs under FLASHINFER_WORKSPACE_BASE.
SCRATCH_MOUNT = "/var/cache/cachebake-scratch"
SCRATCH_INDUCTOR = f"{SCRATCH_MOUNT}/torchinductor"
SERVER_TMP = "/tmp"  # an emptyDir too: IPC sockets, torch's and vLLM's temp files
# Where a model volume may be mounted when the path comes from an artifact (a --bake's
# `vllm serve PATH`): under here, or under the user's --model-mount; never a system dir, the
# service-account token dir, or a dir the Pod mounts something else at (issue 31).
MODEL_MOUNT_BASE = MODEL_DIR_BASE
MODEL_VOLUME = "model"  # the PersistentVolumeClaim with the model, at the `vllm serve` path
MISS_LOG_CONTAINER = "miss-log"  # the sidecar README's "Serving" collects from
# Names of the containers this module adds: --name must not take one of them.
OUR_CONTAINERS = ("cachebake-lib", "cachebake-fingerprint", "cachebake-install", "cachebake-vllm-copy",
                  MISS_LOG_CONTAINER)
DEFAULT_INSTALLER_NOTE = "docker/installer.Dockerfile"
# /tmp of the init pattern: a bake is MBs to a few hundred MB compressed; this holds any bake
# up to about 2 GB when its size is not known here (--tmp-size sets it, --bake derives it).
DEFAULT_TMP_SIZE = "2Gi"
# Over the declared blobs: skopeo's layout files and the installer's own small temp files.
TMP_MARGIN = 64 << 20
MIB = 1 << 20
# The forms Kubernetes validates (k8s.io/apimachinery/pkg/util/validation and
# resource.Quantity): a container and the Deployment take a DNS-1123 label, a Secret's name is a
# DNS-1123 subdomain; quantities here without exponents.  form -> (pattern, max length, what).
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
FORMS = {
    "name": (re.compile(_DNS_LABEL), 63,
             "a Kubernetes name (a DNS-1123 label: lower-case letters, digits, '-'; at most 63)"),
    "secret": (re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*"), 253,
               "a Kubernetes Secret name (a DNS-1123 subdomain)"),
    "claim": (re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*"), 253,
              "a PersistentVolumeClaim name (a DNS-1123 subdomain)"),
    "quantity": (re.compile(r"[0-9]+(?:\.[0-9]+)?(?:Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?"), 64,
                 "a Kubernetes quantity such as 2Gi or 512Mi"),
}


def form_error(form: str, text: str) -> str | None:
    """Why ``text`` is not of ``form`` (a FORMS key), or None when it is."""
    pattern, max_len, what = FORMS[form]
    if len(text) <= max_len and pattern.fullmatch(text):
        return None
    return f"{ascii(text)} is not {what}"


@dataclass
class PodPlan:
    artifact: str
    serving_image: str
    pattern: str = "init"
    target: str | None = None
    installer_image: str | None = None
    install_in_serving_image: bool = False
    name: str = "vllm"
    root: str = str(DEFAULT_ROOT)
    command: list[str] = field(default_factory=list)
    gpus: int = 1
    kind: str = "deployment"
    pull_secret: str | None = None
    tls_verify: bool | None = None
    vllm_role: bool = True  # image-volume: the bake has a vllm role (not visible from a reference)
    tmp_size: str | None = None  # init: /tmp's sizeLimit (a quantity); None: derived or the default
    declared_bytes: int | None = None  # init: what the bake's blobs declare, when known here
    model_pvc: str | None = None  # the claim mounted read-only at the `vllm serve` model path
    model_in_image: bool = False  # ...or the serving image has the model at that path
    serving_image_has_cachebake: bool = False  # image-volume: no cachebake-lib copy needed
    bake: BakeFacts | None = None  # a local copy's facts (--bake): its environment routes
    command_from_bake: bool = False  # the command (its model path) is the artifact's, not the user's
    model_mount: str | None = None  # the user's own dir a model volume may be mounted under
    verify_keys: tuple[str, ...] = ()  # init: PEM public keys the installer verifies the image with
    server_uid: int = NONROOT_UID  # the server's uid: the copied vllm role's and the overlay's owner


def server_command(model: str | None, cmd: tuple[str, ...] | list[str], bake: BakeFacts | None = None,
                   ) -> tuple[list[str], list[str], bool]:
    """(argv, notes, from the bake) of the server: ``cmd``; else the bake's own ``vllm serve``
    command (``bake``, a ``--driver vllm`` bake's: cachebake.serve.command.server_argv); else
    the recipe's flags.  The environment is the Pod's (``pod_spec``: server_env)."""
    if model and cmd:
        raise UsageError("give --model or a command after --, not both")
    if cmd:
        return list(cmd), [], False
    driver = bake.bake.driver if bake is not None else None
    if driver == "vllm":
        if model:
            raise UsageError("--bake is a --driver vllm bake: its own command serves; give --model "
                             "or --bake, not both")
        from cachebake.serve.command import server_argv

        path, flags, notes = server_argv(bake)
        return ["vllm", "serve", path, *flags], notes, True
    if not model:
        raise UsageError("the server needs a command: --model M (`vllm serve` with its recipe's "
                         "flags), --bake ART (a --driver vllm bake's own command) or -- CMD...")
    from cachebake.vllm.serveargs import BAKE_ONLY, carried_serve_args, resolve, serve_args_to_flags

    _, args, model_dir = resolve(model)
    if driver == "kernels":  # its kernels were planned for exact serve args: serve with those
        from cachebake.artifact.schema import Checker

        c = Checker(bake.document)
        plan = c.obj(bake.bake.extra.get("plan") or {}, "bake.plan")
        args = carried_serve_args(c.obj(plan.get("serve_args") or {}, "bake.plan.serve_args"),
                                  bake.document, "bake.plan.serve_args")
        notes = [f"the server's flags are those the --driver kernels bake's engine plan was computed "
                 f"for; its model path is recipe {model}'s"]
    elif driver is None:
        notes = [f"the server's flags are recipe {model}'s as this cachebake knows them: --bake ART (the "
                 "bake pushed) serves with the bake's own command and environment"]
    else:  # a command bake: it records no serve args
        notes = [f"the server's flags are recipe {model}'s: the --bake ran a command, not vLLM"]
    return (["vllm", "serve", model_dir,
             *serve_args_to_flags({k: v for k, v in args.items() if k not in BAKE_ONLY})], notes, False)


def model_path(command: list[str]) -> str | None:
    """The model directory ``vllm serve PATH ...`` reads, if the command is one (an absolute
    PATH: a Hugging Face id is fetched by vLLM, not mounted)."""
    if command[:2] == ["vllm", "serve"] and len(command) > 2 and command[2].startswith("/"):
        return command[2]
    return None


@dataclass
class LocalBake:
    """A local copy of the bake the Pod pulls (``--bake``): what its blobs declare and its
    manifest, read once into what the server's environment takes from it."""

    declared_bytes: int
    facts: BakeFacts


def read_local_bake(artifact: str, target: str, pinned: str | None = None) -> LocalBake:
    """The local copy's declared sizes (``declared_bytes``) and its bake manifest for
    ``target``; ``pinned``: the manifest digest the Pod's reference names, which it must hold."""
    from cachebake.artifact.oci import open_artifact

    return LocalBake(declared_bytes(artifact, target, pinned),
                     BakeFacts.from_manifest(open_artifact(artifact).select(target).manifest,
                                             "--bake: bake manifest"))


def _nonroot(uid: int = NONROOT_UID) -> dict:
    """What a cluster operator wants of every container: not root (an explicit uid, so an image
    whose user is root, as vLLM's is, still starts), a read-only root filesystem (every path
    written is an emptyDir), no privilege escalation, no capabilities, the runtime's seccomp."""
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid,
            "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _env(mapping: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in mapping.items()]


def _layout(plan: PodPlan) -> ServerLayout:
    """Where the server finds each role, its overlay and its writable scratch, by pattern.

    init: every role in the installed emptyDir at ROOT, writable.  image-volume: Triton's role
    read-only in the image (misses go to the overlay), the vllm role in its writable copy (or
    an empty emptyDir with --no-vllm-role), and Inductor's and FlashInfer's variables in the
    scratch emptyDir: torch and FlashInfer write there at import and start, and the image is
    read-only (measured on the H200 with vLLM 0.24, issue 30: with these two moved, ready in
    55 s, 0 Triton compiles, the AOT artifact loaded).  HOME is the scratch dir in both."""
    roles = list(plan.bake.recorded_roles() or ROLE_ENV) if plan.bake is not None else list(ROLE_ENV)
    scratch = {"HOME": SCRATCH_MOUNT}
    if plan.pattern == "init":
        return ServerLayout.installed(plan.root, roles, scratch=scratch)
    where = {"triton": role_dir(plan.root, "triton")}
    if plan.vllm_role:
        where["vllm"] = role_dir(plan.root, "vllm")
    else:
        scratch["VLLM_CACHE_ROOT"] = VLLM_EMPTY_ROOT
    scratch["TORCHINDUCTOR_CACHE_DIR"] = SCRATCH_INDUCTOR
    scratch["FLASHINFER_WORKSPACE_BASE"] = SCRATCH_MOUNT
    return ServerLayout(where, OVERLAY_DIR, scratch)


def _server_writable(plan: PodPlan, server: dict, volumes: list[dict]) -> None:
    """The server's own emptyDirs (its root filesystem is read-only): the scratch dir (HOME,
    and on an image volume Inductor's and FlashInfer's dirs) and /tmp."""
    volumes += [{"name": "cachebake-scratch", "emptyDir": {}}, {"name": "server-tmp", "emptyDir": {}}]
    server["volumeMounts"] += [{"name": "cachebake-scratch", "mountPath": SCRATCH_MOUNT},
                               {"name": "server-tmp", "mountPath": SERVER_TMP}]


def _install_args(plan: PodPlan, fingerprint: bool) -> list[str]:
    args = ["install", plan.artifact, "--to", INSTALL_MOUNT, "--serve-at", plan.root,
            "--target", plan.target]
    if fingerprint:
        args += ["--fingerprint", f"{FINGERPRINT_DIR}/fingerprint.json"]
    if plan.tls_verify is not None:
        args.append("--tls-verify" if plan.tls_verify else "--no-tls-verify")
    if plan.pull_secret:
        args += ["--authfile", f"{AUTH_DIR}/config.json"]
    for pem in plan.verify_keys:  # the PEM text itself: a public key is no secret (docs/trust.md)
        args += ["--verify-key", pem]
    # The emptyDir lives and dies with the Pod, and this container re-runs install at every
    # (re)start of the Pod: a crash's damage is found and repaired then, so no sync.
    return args + ["--no-sync"]


def tmp_size_limit(plan: PodPlan) -> str:
    """/tmp's sizeLimit: ``tmp_size``, else the declared blobs plus ``TMP_MARGIN`` (whole MiB),
    else ``DEFAULT_TMP_SIZE``."""
    if plan.tmp_size:
        return plan.tmp_size
    if plan.declared_bytes is not None:
        return f"{-(-(plan.declared_bytes + TMP_MARGIN) // MIB)}Mi"
    return DEFAULT_TMP_SIZE


def declared_bytes(artifact: str, target: str, pinned: str | None = None) -> int:
    """What a local copy of a bake declares a pull of it writes: its image manifest, config and
    layer blobs.  ``pinned``: the manifest digest the Pod's reference names, which that copy
    must hold (else its sizes say nothing about what the Pod pulls)."""
    from cachebake.artifact.oci import open_artifact
    from cachebake.artifact.schema import CAP_IMAGE_MANIFEST, check_image_manifest

    art = open_artifact(artifact)
    ref = art.select(target)
    if pinned and ref.manifest_digest != pinned:
        raise BadInput(f"{artifact}: its {target} image is {ref.manifest_digest}, not the {pinned} "
                       "--artifact pins (--bake must be the bake that was pushed)")
    entry = art.entries_by_target()[ref.target]
    doc = f"{artifact}: image manifest"
    image = check_image_manifest(art.read_json_blob(entry, doc, CAP_IMAGE_MANIFEST), doc)
    return entry["size"] + image["config"]["size"] + ref.layer_size


def check_plan(plan: PodPlan) -> None:
    """The plan's names in the forms Kubernetes takes (the CLI checks them while parsing; this
    is for callers from Python), and no control character in a path the server sees."""
    from cachebake.distribute.registry import is_image_name

    for option, form, value in (("--name", "name", plan.name), ("--pull-secret", "secret", plan.pull_secret),
                                ("--tmp-size", "quantity", plan.tmp_size), ("--model-pvc", "claim", plan.model_pvc)):
        why = form_error(form, value) if value is not None else None
        if why:
            raise BadInput(f"{option}: {why}")
    for option, image in (("--serving-image", plan.serving_image), ("--installer-image", plan.installer_image)):
        if image is not None and not is_image_name(image):
            raise BadInput(f"{option}: {ascii(image)} is not an image name")
    if not plan.root.startswith("/") or one_line(plan.root) != plan.root:
        raise BadInput(f"--root: {ascii(plan.root)} is not an absolute path without control characters")
    if plan.name in OUR_CONTAINERS:
        raise BadInput(f"--name {plan.name}: a container cachebake adds is called that")


def _lib_copy(plan: PodPlan, volumes: list[dict]) -> dict:
    """``cachebake-lib``: the installer image copies cachebake's sources into an emptyDir, for
    a serving image without cachebake (cachebake.distribute.probe)."""
    volumes.append({"name": "cachebake-lib", "emptyDir": {"medium": "Memory", "sizeLimit": "32Mi"}})
    return {"name": "cachebake-lib", "image": plan.installer_image,
            "command": ["python3", "-m", "cachebake.distribute.probe", "--copy-package", LIB_DIR],
            "volumeMounts": [{"name": "cachebake-lib", "mountPath": LIB_DIR}],
            "securityContext": _nonroot()}


def _init_pattern(plan: PodPlan, server: dict) -> tuple[list[dict], list[dict]]:
    """(initContainers, volumes) of the init-container pattern."""
    tmp = {"name": "cachebake-tmp", "mountPath": "/tmp"}
    cache_rw = {"name": "cachebake", "mountPath": INSTALL_MOUNT}
    volumes = [{"name": "cachebake", "emptyDir": {}},
               {"name": "cachebake-tmp", "emptyDir": {"sizeLimit": tmp_size_limit(plan)}}]
    inits: list[dict] = []
    install_mounts = [cache_rw, tmp]
    if plan.pull_secret:
        volumes.append({"name": "cachebake-auth", "secret": {
            "secretName": plan.pull_secret, "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}})
        install_mounts.append({"name": "cachebake-auth", "mountPath": AUTH_DIR, "readOnly": True})
    if plan.install_in_serving_image:
        inits.append({"name": "cachebake-install", "image": plan.serving_image,
                      "command": ["cachebake", *_install_args(plan, fingerprint=False)],
                      "env": [e for e in server.get("env", []) if e["name"] != "HOME"],
                      "volumeMounts": install_mounts, "securityContext": _nonroot()})
        return inits, volumes
    inits.append(_lib_copy(plan, volumes))
    volumes.append({"name": "cachebake-fingerprint", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    fp_mount = {"name": "cachebake-fingerprint", "mountPath": FINGERPRINT_DIR}
    # The server's own variables (cache-invalidating ones enter Triton's key) plus the copy of
    # cachebake on PYTHONPATH; python -I would drop PYTHONPATH, so the env carries it.
    fp_env = [e for e in server.get("env", []) if e["name"] not in ("PYTHONPATH", "HOME")]
    fp_env.append({"name": "PYTHONPATH", "value": LIB_DIR})
    inits.append({"name": "cachebake-fingerprint", "image": plan.serving_image,
                  "command": ["python3", "-m", "cachebake.distribute.probe", "--target", plan.target,
                              "--out", f"{FINGERPRINT_DIR}/fingerprint.json"],
                  "env": fp_env,
                  "volumeMounts": [{"name": "cachebake-lib", "mountPath": LIB_DIR, "readOnly": True},
                                   fp_mount, tmp],
                  "securityContext": _nonroot()})
    inits.append({"name": "cachebake-install", "image": plan.installer_image,
                  "args": _install_args(plan, fingerprint=True),
                  "volumeMounts": [*install_mounts, {**fp_mount, "readOnly": True}],
                  "securityContext": _nonroot()})
    return inits, volumes


def _writable_vllm_role(plan: PodPlan, server: dict, volumes: list[dict]) -> list[dict]:
    """image-volume: a writable VLLM_CACHE_ROOT for the server (see the module's docstring);
    the init containers that fill it."""
    volumes.append({"name": "cachebake-vllm", "emptyDir": {}})
    if not plan.vllm_role:  # nothing to copy, and no ROOT/vllm in the image to mount over
        server["volumeMounts"].append({"name": "cachebake-vllm", "mountPath": VLLM_EMPTY_ROOT})
        return []
    server["volumeMounts"].append({"name": "cachebake-vllm", "mountPath": role_dir(plan.root, "vllm")})
    # cp -a of each entry, not of vllm/. itself: that would also set the emptyDir's own times and
    # mode, which only its owner (root, as the kubelet makes it, 0777) may; uid 65534 exits 1.
    return [{"name": "cachebake-vllm-copy", "image": plan.serving_image,
             "command": ["find", f"{IMAGE_COPY_MOUNT}/vllm", "-mindepth", "1", "-maxdepth", "1",
                         "-exec", "cp", "-a", "{}", f"{VLLM_COPY_MOUNT}/", ";"],
             "volumeMounts": [{"name": "cachebake", "mountPath": IMAGE_COPY_MOUNT, "readOnly": True},
                              {"name": "cachebake-vllm", "mountPath": VLLM_COPY_MOUNT}],
             "securityContext": _nonroot(plan.server_uid)}]


def _miss_log_sidecar(plan: PodPlan, log: str) -> dict:
    """A native sidecar (an init container with ``restartPolicy: Always``: started before the
    server, alive as long as the Pod) streaming the overlay's miss log to the Pod's logs, as
    README's "Serving" collects them (``kubectl logs POD -c miss-log``).  ``tail -F`` waits for
    the file and never creates it; the serving image has tail (no other image to pull)."""
    return {"name": MISS_LOG_CONTAINER, "image": plan.serving_image, "restartPolicy": "Always",
            "command": ["tail", "-n", "+1", "-F", log],
            "volumeMounts": [{"name": "cachebake-overlay", "mountPath": OVERLAY_MOUNT, "readOnly": True}],
            # the server's own uid: the overlay is the server's 0700 dir, which no other uid may read
            "securityContext": _nonroot(plan.server_uid)}


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def check_model_mount(plan: PodPlan, path: str, server: dict) -> None:
    """Where the model volume goes, when that is ``path`` (the server's ``vllm serve PATH``):
    one normalized absolute path, under ``MODEL_MOUNT_BASE`` or the user's ``--model-mount``,
    and neither at, inside nor around a path the Pod mounts something else at.  A path the
    artifact chose (``command_from_bake``) that breaks this is a corrupt artifact (exit 5), one
    the user chose is a usage error (exit 2); one line each."""
    def refuse(why: str):
        if plan.command_from_bake:
            raise InvalidDocument("--bake: bake manifest", "bake.model.path", f"{ascii(path)[1:-1]} {why}")
        raise UsageError(f"the model path {ascii(path)[1:-1]} {why}")

    if not path.startswith("/") or posixpath.normpath(path) != path or "//" in path:
        refuse("is not a normalized absolute path: the model volume is mounted there")
    bases = [MODEL_MOUNT_BASE] + ([plan.model_mount] if plan.model_mount else [])
    if not any(_under(path, b) for b in bases):
        refuse(f"is not under {' or '.join(bases)}: a model volume is mounted only there "
               "(--model-mount DIR allows another dir of yours)")
    for m in server["volumeMounts"]:
        other = m["mountPath"]
        if _under(path, other) or _under(other, path):
            refuse(f"is at or around {other}, where the Pod mounts {m['name']}")


def _model_volume(plan: PodPlan, server: dict, volumes: list[dict], notes: list[str]) -> None:
    """What the server's ``vllm serve PATH`` reads: the claim mounted read-only at PATH, or
    the serving image's own copy; refused without either (the server would exit at start)."""
    path = model_path(plan.command)
    if path is None:
        if plan.model_pvc:
            raise UsageError("--model-pvc: the server's command serves no model directory "
                             "(`vllm serve /PATH ...`) to mount it at")
        return
    if plan.model_pvc and plan.model_in_image:
        raise UsageError("give --model-pvc CLAIM or --model-in-image, not both")
    if plan.model_in_image:
        notes.append(f"the server reads its model from {path} in the serving image (--model-in-image)")
        return
    if not plan.model_pvc:
        raise UsageError(f"the server runs `vllm serve {one_line(path)}`: give --model-pvc CLAIM (a "
                         "PersistentVolumeClaim holding the model, mounted read-only there) or "
                         "--model-in-image (the serving image has it)")
    check_model_mount(plan, path, server)
    volumes.append({"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": plan.model_pvc,
                                                                    "readOnly": True}})
    server["volumeMounts"].append({"name": MODEL_VOLUME, "mountPath": path, "readOnly": True})
    notes.append(f"the server runs as uid {plan.server_uid}: the claim's files must be readable by it "
                 "(or set the Pod's fsGroup)")


def pod_spec(plan: PodPlan) -> tuple[dict, list[str]]:
    """The Pod spec for ``plan`` and notes for the operator (things the spec cannot say)."""
    from cachebake.distribute.registry import is_reference, parse_reference
    from cachebake.gpu import GPUTargetSpec

    notes: list[str] = []
    if plan.pattern not in PATTERNS:
        raise BadInput(f"--pattern {plan.pattern!r}: one of {', '.join(PATTERNS)}")
    check_plan(plan)
    if not plan.target:
        raise BadInput("--target is needed (e.g. sm_90): the Pod's init containers see no GPU")
    if not plan.command:
        raise UsageError("the server needs a command (the serving image's entrypoint is not "
                         "one): --model M, --bake ART or -- CMD...")
    plan.target = GPUTargetSpec.parse(plan.target).ref_name
    server: dict = {"name": plan.name, "image": plan.serving_image, "command": plan.command}
    env = server_env(plan.bake, _layout(plan))  # the one function every caller builds it with
    server["env"] = _env(env.as_dict())
    notes += env.notes
    server["volumeMounts"] = []
    server["securityContext"] = _nonroot(plan.server_uid)
    if plan.gpus:
        server["resources"] = {"limits": {"nvidia.com/gpu": plan.gpus}}
    spec: dict = {}
    if plan.pattern == "init":
        if not plan.install_in_serving_image and not plan.installer_image:
            raise BadInput(f"--installer-image is needed (build it from {DEFAULT_INSTALLER_NOTE}), "
                           "or --install-in-serving-image")
        if plan.serving_image_has_cachebake:
            raise UsageError("--serving-image-has-cachebake is for --pattern image-volume (the init "
                             "pattern's server does not import cachebake; --install-in-serving-image "
                             "runs the install there)")
        if is_reference(plan.artifact):
            parse_reference(plan.artifact)
        inits, volumes = _init_pattern(plan, server)
        if is_reference(plan.artifact) and not plan.tmp_size and plan.declared_bytes is None:
            notes.append(f"/tmp of the installer (where the registry pull lands) is limited to "
                         f"{DEFAULT_TMP_SIZE}, the default: the bake's size cannot be seen from a "
                         "reference (--bake ART derives it, --tmp-size sets it)")
        # Writable: a kernel the bake missed is compiled and cached in this Pod's copy.
        server["volumeMounts"].append({"name": "cachebake", "mountPath": plan.root})
        spec["initContainers"] = inits
    else:
        if not is_reference(plan.artifact):
            raise BadInput(f"{plan.artifact}: an image volume needs a registry reference "
                           "(docker://HOST/REPO:TAG, as `cachebake push` printed it)")
        if plan.install_in_serving_image:
            raise UsageError("--install-in-serving-image is for --pattern init (an image volume "
                             "installs nothing)")
        if plan.serving_image_has_cachebake == bool(plan.installer_image):
            raise UsageError("--pattern image-volume points TRITON_CACHE_MANAGER at cachebake's layered "
                             "cache manager, which the server imports: give --installer-image IMG (an "
                             "init container copies cachebake onto the server's PYTHONPATH) or "
                             "--serving-image-has-cachebake, one of them")
        ref = parse_reference(plan.artifact)
        image_ref = f"{ref.name}@{ref.digest}" if ref.digest else f"{ref.name}:{ref.tag or plan.target}"
        # ROOT first, then the vllm role's mount inside it (runtimes sort mounts by depth too)
        server["volumeMounts"].append({"name": "cachebake", "mountPath": plan.root, "readOnly": True})
        volumes = [{"name": "cachebake", "image": {"reference": image_ref, "pullPolicy": "IfNotPresent"}}]
        inits = _writable_vllm_role(plan, server, volumes)
        server["volumeMounts"].append({"name": "cachebake-overlay", "mountPath": OVERLAY_MOUNT})
        volumes.append({"name": "cachebake-overlay", "emptyDir": {}})
        if inits:
            notes.append(f"assumed the bake has a vllm role (the generator cannot see the image's "
                         f"roles): it is copied to a writable emptyDir at {role_dir(plan.root, 'vllm')}; "
                         "for a bake without one (`cachebake inspect` lists roles) use --no-vllm-role, "
                         "or the server cannot start (no mount point in the read-only image)")
        if not plan.serving_image_has_cachebake:
            inits.append(_lib_copy(plan, volumes))
            server["volumeMounts"].append({"name": "cachebake-lib", "mountPath": LIB_DIR, "readOnly": True})
            server["env"] = [e for e in server["env"] if e["name"] != "PYTHONPATH"]
            server["env"].append({"name": "PYTHONPATH", "value": LIB_DIR})
            notes.append(f"the server imports cachebake's layered cache manager from {LIB_DIR} "
                         "(PYTHONPATH, copied there by cachebake-lib from the installer image): a "
                         "PYTHONPATH the serving image sets is replaced")
        inits.append(_miss_log_sidecar(plan, env.as_dict()[MISS_LOG_ENV]))
        spec["initContainers"] = inits
        notes.append(f"image volumes need Kubernetes >= 1.35 and a runtime that reads zstd layers "
                     f"(containerd >= 1.5, CRI-O); {plan.root} must be the root the bake was made at")
    _server_writable(plan, server, volumes)
    _model_volume(plan, server, volumes, notes)
    if plan.pull_secret:
        spec["imagePullSecrets"] = [{"name": plan.pull_secret}]
    spec["containers"] = [server]
    spec["volumes"] = volumes
    return spec, notes


def manifest(plan: PodPlan) -> tuple[dict, list[str]]:
    spec, notes = pod_spec(plan)
    labels = {"app.kubernetes.io/name": plan.name, "app.kubernetes.io/component": "server"}
    # (The artifact reference is in the install args / image volume: podman refuses annotation
    # values over 63 characters, which a digest-pinned reference is.)
    annotations = {"cachebake.dev/target": plan.target, "cachebake.dev/pattern": plan.pattern}
    if plan.kind == "pod":
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": plan.name, "labels": labels, "annotations": annotations},
                "spec": spec}, notes
    if plan.kind != "deployment":
        raise BadInput(f"--kind {plan.kind!r}: one of {', '.join(KINDS)}")
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": plan.name, "labels": labels, "annotations": annotations},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": plan.name}},
                     "template": {"metadata": {"labels": labels, "annotations": annotations},
                                  "spec": spec}}}, notes


def default_format() -> tuple[str, str | None]:
    """(format, note): YAML where PyYAML is installed (the ``k8s`` extra), else JSON, which
    kubectl reads as it is (JSON is YAML), with a note saying so: a plain ``pip install .``
    still writes manifests that apply."""
    try:
        import yaml  # noqa: F401
    except ImportError:
        return "json", ("PyYAML is not installed: wrote the manifest as JSON (kubectl apply -f "
                        "reads it as it is); pip install 'cachebake[k8s]' for YAML")
    return "yaml", None


def render(doc: dict, notes: list[str], fmt: str = "yaml") -> str:
    """YAML (PyYAML's safe emitter, the ``k8s`` extra) with the notes as leading comments, each
    folded onto one line, or JSON.  The text is parsed back before it is returned: it must be
    exactly ``doc``, one document (a failure here is a bug, never output)."""
    if fmt == "json":
        text = json.dumps(doc, indent=2) + "\n"  # ensure_ascii: every control character escaped
        if json.loads(text) != doc:
            raise AssertionError("the JSON manifest does not parse back to the manifest built")
        return text
    try:
        import yaml
    except ImportError:
        raise Unsupported("YAML output needs PyYAML: pip install 'cachebake[k8s]' (or --format json)") from None

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # no &id001 anchors: plain YAML people can edit
            return True

    head = "".join(comment(n) + "\n" for n in notes)
    # allow_unicode=False: every character outside printable ASCII is an escape in a quoted
    # string, so nothing in a value can act on a terminal or a line-oriented reader either.
    text = head + yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False,
                            width=100, allow_unicode=False)
    if list(yaml.safe_load_all(text)) != [doc]:
        raise AssertionError("the YAML manifest does not parse back to the one document built")
    return text


@dataclass
class ManifestReport:
    text: str
    doc: dict
    notes: list[str]

    def to_dict(self) -> dict:
        return {"manifest": self.doc, "notes": self.notes}

    def render(self, console) -> None:
        import sys

        sys.stdout.write(self.text)  # verbatim: it is a file, not a message
