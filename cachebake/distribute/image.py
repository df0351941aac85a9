"""The Docker API where a daemon is the natural tool (the ``docker`` package, the ``docker`` extra):

* ``cachebake image ART --tag REF [--push]``: the cache image, ``FROM scratch`` with the bake
  installed at the serving root (``/var/cache/cachebake/triton -> ...``), built in a daemon and
  optionally pushed.  A serving Dockerfile then takes it with
  ``COPY --from=REF /var/cache/cachebake /var/cache/cachebake``: the route for builders that
  have no GPU in builds.
* ``cachebake build --image IMG ...``: the bake run inside the serving image on a GPU host
  (device requests for the GPUs, the artifact's directory mounted, the caller's uid), so the
  bake's fingerprint is the serving image's by construction.

The cache image's tree is made by ``cachebake install`` itself (same checks as any install),
into a private temp build context, with the group files relocated for the serving root.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from cachebake.errors import BadInput, CachebakeError, CommandFailed, ExitCode, Unsupported

# Where the bake's pieces are mounted inside the serving image during `build --image`.
CONTAINER_OUT = "/cachebake/out"
CONTAINER_WORK = "/cachebake/work"
LABEL_ROOT = "dev.cachebake.root"
# The cache image (docker/cache.Dockerfile says the same): the installed tree, nothing else.
CACHE_DOCKERFILE = "FROM scratch\nCOPY rootfs/ /\n"
# vLLM and NCCL use /dev/shm between workers; Docker's default is 64 MB (vLLM's docs ask for
# --ipc=host or a large --shm-size).  A limit, not an allocation.
BAKE_SHM_SIZE = "16g"


def _docker_module():
    try:
        import docker
    except ImportError:
        raise Unsupported("this command needs the docker package: pip install 'cachebake[docker]'") from None
    return docker


def _os_cause(error: BaseException) -> OSError | None:
    """The OSError under a docker/requests/urllib3 error, wherever that chain keeps it
    (``__cause__``, ``__context__``, or inside ``args``: urllib3's ProtocolError)."""
    todo, seen = [error], set()
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return e
        todo += [x for x in (e.__cause__, e.__context__, *e.args) if isinstance(x, BaseException)]
    return None


def daemon_address() -> str:
    """Where the docker package looks for the daemon: DOCKER_HOST, else the default socket."""
    from docker.constants import DEFAULT_UNIX_SOCKET

    return os.environ.get("DOCKER_HOST") or DEFAULT_UNIX_SOCKET.replace("http+unix://", "unix://", 1)


def docker_client():
    """A client for DOCKER_HOST (or the default socket); one clear line if there is none: the
    address tried and why, in words (the docker package's own message is a Python repr of a
    requests error)."""
    docker = _docker_module()
    where = daemon_address()
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        cause = _os_cause(e)
        why = (cause.strerror or os.strerror(cause.errno)) if cause is not None else \
            " ".join(str(e).split())
        hint = " (set DOCKER_HOST to the daemon's socket)" if not os.environ.get("DOCKER_HOST") else ""
        raise BadInput(f"cannot reach a Docker daemon at {where}: {why}{hint}") from None
    return client


def _docker_errors():
    return _docker_module().errors.DockerException


# ------------------------------------------------------------------------------ cache image


@dataclass
class ImageReport:
    artifact: str
    tag: str
    image_id: str
    target: str
    layer_digest: str
    root: str
    files: int
    pushed_digest: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self, console) -> None:
        console.print(f"built {self.tag} ({self.image_id[:19]}): bake {self.target} "
                      f"{self.layer_digest[:19]}, {self.files} files at {self.root}",
                      markup=False, soft_wrap=True)
        if self.pushed_digest:
            console.print(f"pushed {self.tag}@{self.pushed_digest}", markup=False, soft_wrap=True)
        console.print(f"use: COPY --from={self.tag} {self.root} {self.root}", markup=False, soft_wrap=True)


def _docker_tag(tag: str) -> tuple[str, str]:
    """``host/repo:tag`` (or docker://...) into (repository, tag) for the Docker API."""
    tag = tag[len("docker://"):] if tag.startswith("docker://") else tag
    if "@" in tag:
        raise BadInput(f"{tag}: --tag names a tag, not a digest")
    repo, sep, name = tag.rpartition(":")
    if not sep or "/" in name:
        return tag, "latest"
    return repo, name


def _context_tar(context: Path, dest: Path) -> None:
    """The build context as a tar: owners 0:0 and fixed mtimes (the image's files do not
    carry this host's uid or build time); symlinks stay symlinks."""
    def normalize(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        ti.mtime = 0
        return ti

    with tarfile.open(dest, "w") as tar:
        for entry in sorted(os.listdir(context)):
            tar.add(context / entry, arcname=entry, filter=normalize)


def build_cache_image(artifact: os.PathLike | str, tag: str, *, target: str | None = None,
                      root: str | None = None, push: bool = False) -> ImageReport:
    """Install ``artifact`` into a temp context at ``root`` and build ``FROM scratch`` +
    that tree in the daemon, labelled with the bake manifest; push it if asked."""
    from cachebake.artifact.oci import ANN_TARGET, LABEL_MANIFEST, open_artifact
    from cachebake.install import install_artifact

    repository, name = _docker_tag(tag)
    bake = open_artifact(artifact).select(target)
    root = root or bake.manifest.layer_root or "/var/cache/cachebake"
    if not PurePosixPath(root).is_absolute():
        raise BadInput(f"--root {root}: must be an absolute path")
    client = docker_client()
    tmp = Path(tempfile.mkdtemp(prefix="cachebake-image-"))
    try:
        # Packaging, not serving: the preflight is the bake's own fingerprint (it passes); the
        # serving environment is checked where the image is used (`cachebake verify` there).
        fp = tmp / "fingerprint.json"
        bake.manifest.fingerprint.write(fp)
        tree = tmp / "context" / "rootfs" / root.lstrip("/")
        installed = install_artifact(artifact, tree, target=bake.target, fingerprint_file=str(fp),
                                     serve_at=root, sync=False)  # a build context, tarred next
        (tmp / "context" / "Dockerfile").write_text(CACHE_DOCKERFILE)
        context_tar = tmp / "context.tar"
        _context_tar(tmp / "context", context_tar)
        labels = {LABEL_MANIFEST: bake.manifest.to_json(), ANN_TARGET: bake.target, LABEL_ROOT: root}
        try:
            with open(context_tar, "rb") as f:
                image, _ = client.images.build(fileobj=f, custom_context=True, tag=f"{repository}:{name}",
                                               labels=labels, network_mode="none", rm=True, forcerm=True)
        except _docker_errors() as e:
            raise CommandFailed(f"docker build of {repository}:{name} failed: {e}") from None
        report = ImageReport(str(artifact), f"{repository}:{name}", image.id, bake.target,
                             bake.layer_digest, root, installed.files)
        if push:
            report.pushed_digest = _push(client, repository, name)
        return report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _push(client, repository: str, name: str) -> str:
    """Push through the daemon (its credentials: ~/.docker/config.json and its helpers)."""
    digest = None
    try:
        for line in client.images.push(repository, tag=name, stream=True, decode=True):
            if line.get("error"):
                raise BadInput(f"push {repository}:{name}: {line['error']}")
            digest = (line.get("aux") or {}).get("Digest") or digest
    except _docker_errors() as e:
        raise BadInput(f"push {repository}:{name}: {e}") from None
    if not digest:
        raise BadInput(f"push {repository}:{name}: the daemon reported no digest")
    return digest


# ----------------------------------------------------------------------------- build --image


def device_requests(gpus: str) -> list:
    """``--gpus`` as Docker's device requests: ``all``, a count, ``device=0,1``, or ``none``."""
    DeviceRequest = _docker_module().types.DeviceRequest  # noqa: N806 - docker's class

    gpus = (gpus or "all").strip()
    if gpus == "none":
        return []
    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if gpus.isdigit() and int(gpus) > 0:
        return [DeviceRequest(count=int(gpus), capabilities=[["gpu"]])]
    if gpus.startswith("device="):
        ids = [d for d in gpus[len("device="):].split(",") if d]
        if ids:
            return [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
    raise BadInput(f"--gpus {gpus!r}: use all, a number, device=0,1 or none")


@dataclass
class BakeInImage:
    """What ``build --image`` runs: the inner ``cachebake build`` argv and the mounts."""

    image: str
    argv: list[str]
    volumes: dict[str, dict]
    environment: dict[str, str]
    user: str
    device_requests: list
    out: Path
    work: Path


def plan_bake_in_image(image: str, build_args: list[str], *, out: os.PathLike | str, root: str,
                       gpus: str = "all", user: str | None = None) -> BakeInImage:
    """The container for a bake of ``build_args`` (``cachebake build`` options without --out,
    --root or --work-dir): the artifact's parent directory and a host work directory
    mounted, the caller's uid, the GPUs requested."""
    out = Path(out).resolve()
    if not out.parent.is_dir():
        raise BadInput(f"{out.parent}: no such directory (for --out)")
    if not PurePosixPath(root).is_absolute():
        raise BadInput(f"--root {root}: must be an absolute path")
    # The caches and logs live on the host, owned by the caller, next to the artifact (the
    # same filesystem; kept when the bake fails, to read its logs).
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.work-", dir=out.parent))
    for sub in ("root", "logs", "home"):
        (work / sub).mkdir()
    user = user or f"{os.getuid()}:{os.getgid()}"
    uid, _, gid = user.partition(":")
    if os.geteuid() == 0 and uid.isdigit():  # root asking for another uid: hand it the work dir
        for d in (work, *(work / sub for sub in ("root", "logs", "home"))):
            os.chown(d, int(uid), int(gid) if gid.isdigit() else -1)
    options, sep, cmd = _split_command(build_args)
    argv = ["build", *options, "--out", f"{CONTAINER_OUT}/{out.name}", "--root", root,
            "--work-dir", f"{CONTAINER_WORK}/logs", *sep, *cmd]
    volumes = {str(out.parent): {"bind": CONTAINER_OUT, "mode": "rw"},
               str(work): {"bind": CONTAINER_WORK, "mode": "rw"},
               str(work / "root"): {"bind": root, "mode": "rw"}}
    return BakeInImage(image=image, argv=argv, volumes=volumes,
                       environment={"HOME": f"{CONTAINER_WORK}/home"},
                       user=user,
                       device_requests=device_requests(gpus), out=out, work=work)


def _split_command(args: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(options, ["--"] or [], the warmup command): our flags must go before the ``--``."""
    if "--" in args:
        i = args.index("--")
        return args[:i], ["--"], args[i + 1:]
    return list(args), [], []


def run_bake_in_image(plan: BakeInImage) -> int:
    """Run the plan; the inner build's stderr streams here as it runs, its stdout (the report)
    is printed when it ends.  Returns 0 or raises the inner build's error with its exit code."""
    try:
        client = docker_client()
    except CachebakeError:
        shutil.rmtree(plan.work, ignore_errors=True)
        raise
    kwargs = dict(entrypoint=["cachebake"], command=plan.argv, volumes=plan.volumes,
                  environment=plan.environment, user=plan.user, network_mode="none",
                  device_requests=plan.device_requests or None, detach=True)
    if plan.device_requests:
        kwargs["shm_size"] = BAKE_SHM_SIZE
    try:
        container = client.containers.run(plan.image, **kwargs)
    except _docker_errors() as e:
        shutil.rmtree(plan.work, ignore_errors=True)
        raise CommandFailed(f"could not start cachebake in {plan.image}: {' '.join(str(e).split())} "
                            "(the image needs cachebake: the Dockerfile's serving-cachebake stage "
                            "adds it)") from None
    try:
        tail: list[str] = []

        def pump() -> None:
            for chunk in container.logs(stdout=False, stderr=True, stream=True, follow=True):
                text = chunk.decode(errors="replace")
                sys.stderr.write(text)
                tail[:] = (tail + text.splitlines())[-20:]

        pumping = threading.Thread(target=pump, daemon=True)
        pumping.start()
        code = int(container.wait().get("StatusCode", 1))
        pumping.join(timeout=10)
        sys.stdout.write(container.logs(stdout=True, stderr=False).decode(errors="replace"))
        sys.stdout.flush()
    finally:
        try:
            container.remove(force=True)
        except _docker_errors():
            pass
    if code != 0:
        last = next((ln for ln in reversed(tail) if ln.strip()), f"exit code {code}")
        last = last.removeprefix("cachebake: error: ")
        try:
            exit_code = ExitCode(code)
        except ValueError:
            exit_code = ExitCode.COMMAND_FAILED
        raise CachebakeError(f"bake in {plan.image} failed: {last} (caches and logs kept in "
                             f"{plan.work})", exit_code)
    shutil.rmtree(plan.work, ignore_errors=True)
    return 0


def build_args(*, model=None, driver=None, tp=None, serve_args=None, model_dir=None, target=None,
               until_stable=True, quiet_rounds=None, max_rounds=None, reuse_root=False,
               allow_env=False, layer_root=None, prune_ir=False, as_json=False, cmd=()) -> list[str]:
    """``cachebake build`` options as flags again, for the run inside the image."""
    args: list[str] = []
    if isinstance(serve_args, dict):  # the option's type parsed it; hand it over as JSON
        serve_args = json.dumps(serve_args, sort_keys=True)
    for flag, value in (("--model", model), ("--driver", driver), ("--tp", tp),
                        ("--serve-args", serve_args), ("--model-dir", model_dir),
                        ("--target", target), ("--quiet-rounds", quiet_rounds),
                        ("--max-rounds", max_rounds), ("--layer-root", layer_root)):
        if value is not None:
            args += [flag, str(value)]
    if not until_stable:
        args.append("--no-until-stable")
    if reuse_root:
        args.append("--reuse-root")
    if allow_env:
        args.append("--allow-env")
    if prune_ir:
        args.append("--prune-ir")
    if as_json:
        args.append("--json")
    if cmd:
        args += ["--", *cmd]
    return args
