#!/usr/bin/env python3
"""Carry out a Pod `cachebake k8s` wrote, or the repo's Dockerfile, on one host with no
container engine (the H200 machine: a VM, root, no docker/podman/kubelet): the honest stand-in
for a kubelet + runtime there.  Not a mock of the server: every container's command runs for
real, on the host's software, inside a private mount namespace built the way a runtime builds
a container's filesystem.

    python3 bench/pod_runner.py pod MANIFEST --work DIR [--pvc CLAIM=HOSTDIR] \
        [--image-volume REF=ARTIFACT] [--image-env K=V] [--image-entrypoint IMAGE=JSON] \
        [--add-env CONTAINER:K=V] [--add-bind CONTAINER:HOSTDIR:PATH] [--add-arg C:ARG] [--ready-file F]
    python3 bench/pod_runner.py dockerfile DOCKERFILE --work DIR --context DIR --target STAGE \
        [--build-arg K=V] [--stage-dir STAGE=DIR] [--image-env K=V] [--base-entrypoint JSON] \
        [--skip-device-runs] [--run -- ARGS...]

Images are NOT pulled: every image a spec names is mapped to the host's root filesystem (the
GPU host has the serving software installed), and the log says so.  A container's root is an
overlay of the host's filesystems (each host mount, lower, read-only) with a private upper dir,
so a container's writes to its root stay its own, as with a runtime; readOnlyRootFilesystem
makes that root read-only.  /proc, /sys and /dev are the host's (no pid, network or user
namespace: the processes share the host's), /dev/shm a fresh tmpfs.

Pod mode, as a kubelet on one node (KEP-753 order): init containers in order, each to exit 0,
except native sidecars (restartPolicy: Always), which are started, kept running (restarted when
they exit) and stopped last; then the containers.  Honoured: command/args (an image entrypoint
only from --image-entrypoint: the host root has none), env (value), workingDir, securityContext
runAsUser/runAsGroup/runAsNonRoot/readOnlyRootFilesystem/allowPrivilegeEscalation
(no_new_privs)/capabilities.drop ALL, the Pod's runAsUser/runAsGroup/fsGroup/supplementalGroups,
volumeMounts (readOnly), volumes: emptyDir (a fresh dir, root's 0777 as the kubelet makes it,
group fsGroup + setgid when set; medium Memory a tmpfs of sizeLimit; a disk sizeLimit is only
noted: the kubelet enforces it by eviction), hostPath, persistentVolumeClaim (--pvc CLAIM=DIR),
image (--image-volume REF=ARTIFACT: the layer of a cachebake artifact, extracted, read-only;
a digest-pinned REF must be the artifact's).  Noted, not enforced: seccompProfile (no filter is
loaded), resources (the host's GPUs are all visible), imagePullPolicy/imagePullSecrets (nothing
pulled), the Pod's restartPolicy (nothing restarts but sidecars), metadata.  Anything else is
refused: exit 2, one line naming the field.

Dockerfile mode, as a builder: stages in order from the one --target needs; FROM a build arg or
an image = the host root, FROM an earlier stage = that stage's filesystem, FROM scratch = empty;
RUN in the stage's filesystem (an overlay whose upper dir is the stage's output), with ENV,
USER, WORKDIR and `--mount=type=bind` of the context; COPY from the context or --from a stage
(that stage's files); --stage-dir STAGE=DIR gives a stage's filesystem ready-made (the
Dockerfile's own advice: replace the `cache` stage with a cache image).  Then --run runs the
final image's ENTRYPOINT + CMD (or ARGS, as `docker run IMAGE ARGS` does) as its USER.

Exit codes: 0 done (or stopped by SIGTERM/SIGINT after everything started); 2 a field or
instruction it cannot honour (one line); 3 an init container (or a RUN step) failed; 4 the
server container exited non-zero; 5 this host cannot do it (not root, no mount namespace).
Logs: DIR/runner.log (every mount and its mode, the env, uid/gid and command of each
container), DIR/logs/<container>.log (its stdout and stderr, as `kubectl logs`).
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

EXIT_REFUSED, EXIT_INIT_FAILED, EXIT_SERVER_FAILED, EXIT_HOST = 2, 3, 4, 5

# <sys/mount.h>, <sched.h>, <sys/prctl.h>
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS = 0x00020000
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
# Mounts a container gets from the host as they are (kernel filesystems), not in its root.
KERNEL_TREES = ("/proc", "/sys", "/dev")
PSEUDO_FS = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "debugfs", "tracefs", "securityfs",
             "pstore", "bpf", "autofs", "binfmt_misc", "fusectl", "configfs", "hugetlbfs", "nsfs",
             "efivarfs", "rpc_pipefs", "devtmpfs"}


class Refused(Exception):
    """A field or instruction this runner cannot honour: exit 2, one line."""


class HostError(Exception):
    """This host cannot do what is asked (not root, no mount namespace): exit 5."""


# -- syscalls ---------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _b(s):
    return None if s is None else os.fsencode(s)


def sys_mount(source, target, fstype, flags, data=None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount({source}, {target}, {fstype}): {os.strerror(e)}")


def sys_unshare_mounts() -> None:
    """A private mount namespace for this process (unshare(2), as `unshare -m --propagation
    private`): nothing mounted here is seen by the host, and it all goes when the last process
    in it exits."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise HostError(f"unshare(CLONE_NEWNS): {os.strerror(e)} (needs root)")
    sys_mount(None, "/", None, MS_REC | MS_PRIVATE)


def remount_ro(target: str) -> None:
    """`mount -o remount,bind,ro TARGET`, keeping nosuid/nodev/noexec as they are (the kernel
    refuses to clear a locked flag)."""
    f = os.statvfs(target).f_flag
    keep = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC)  # ST_* and MS_* share these values
    sys_mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def drop_all_caps() -> None:
    """capabilities.drop [ALL] for a root container: the bounding set and every set emptied."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def mountinfo() -> list[dict]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        f = pre.split()
        fstype = post.split()[0]
        point = f[4].encode().decode("unicode_escape")  # \040 and friends
        out.append({"point": point, "fstype": fstype, "options": f[5]})
    return out


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


# -- the in-namespace child: build a container's filesystem, become its user, exec -------------

def _exec_child(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    sys_unshare_mounts()
    new = spec["newroot"]
    os.makedirs(new, exist_ok=True)
    upper = spec["upper"]
    sys_mount("tmpfs", upper, "tmpfs", 0, "mode=0755") if spec.get("upper_tmpfs") else None
    rootfs_mounts = []
    for i, m in enumerate(spec["rootfs"]):
        dst = new + m["point"] if m["point"] != "/" else new
        if m["point"] != "/" and not os.path.isdir(dst):
            continue  # not reachable in this root (e.g. under a dir the lower does not show)
        if m["how"] == "overlay":
            u, w = m.get("upperdir") or f"{upper}/u{i}", m.get("workdir") or f"{upper}/w{i}"
            os.makedirs(u, exist_ok=True)
            os.makedirs(w, exist_ok=True)
            try:
                sys_mount("overlay", dst, "overlay", 0, f"lowerdir={m['lower']},upperdir={u},workdir={w}")
            except OSError as e:
                if ":" in m["lower"] or m.get("upperdir"):
                    raise  # a stage's layers: no honest fallback
                # This kernel will not overlay that filesystem: the host's own, bound, so the
                # container's writes there reach the host.  Said in the container's log.
                print(f"pod_runner: {spec['name']}: {m['point']}: overlay refused ({e.strerror}): the host's "
                      "filesystem bound read-write instead: writes there reach the host", file=sys.stderr)
                sys_mount(m["lower"], dst, None, MS_BIND)
        elif m["how"] == "empty":  # FROM scratch
            sys_mount("tmpfs", dst, "tmpfs", 0, "mode=0755")
        else:
            sys_mount(m["lower"], dst, None, MS_BIND | MS_REC)
        rootfs_mounts.append(dst)
    for tree in KERNEL_TREES:
        if os.path.isdir(new + tree) or spec.get("scratch"):
            os.makedirs(new + tree, exist_ok=True)
            sys_mount(tree, new + tree, None, MS_BIND | MS_REC)
    os.makedirs(new + "/dev/shm", exist_ok=True)
    sys_mount("shm", new + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    # Volumes, parents first (runtimes sort by depth); a mount point is made in the container's
    # root as runc makes it, which fails (EROFS) inside a read-only volume, as on a node.
    for v in sorted(spec["mounts"], key=lambda v: v["target"].rstrip("/").count("/")):
        dst = new + v["target"]
        try:
            if os.path.isdir(v["source"]):
                os.makedirs(dst, exist_ok=True)
            elif not os.path.exists(dst):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                open(dst, "a").close()
        except OSError as e:
            sys.exit(f"pod_runner: {spec['name']}: cannot make the mount point {v['target']}: {e.strerror} "
                     "(as a runtime fails: CreateContainerError)")
        sys_mount(v["source"], dst, None, MS_BIND | MS_REC)
        if v["readonly"]:
            remount_ro(dst)
    if spec["readonly_root"]:
        covered = [new + v["target"] for v in spec["mounts"]]
        for dst in rootfs_mounts:
            if any(_under(dst, c) for c in covered):
                continue  # hidden under a volume: not part of what the container sees
            remount_ro(dst)
    os.chroot(new)
    os.chdir(spec["workdir"] or "/")
    if spec["no_new_privs"]:
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    uid, gid = spec["uid"], spec["gid"]
    os.setgroups(spec["groups"])
    os.setresgid(gid, gid, gid)
    if uid == 0 and spec["drop_all_caps"]:
        drop_all_caps()
    os.setresuid(uid, uid, uid)  # from root to another uid: every capability goes with it
    argv, env = spec["argv"], spec["env"]
    path = env.get("PATH", os.defpath)
    exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path)
    if exe is None:
        sys.exit(f"pod_runner: {spec['name']}: {argv[0]}: executable file not found in $PATH ({path})")
    os.execve(exe, argv, env)


# -- the host side ------------------------------------------------------------------------------

class Log:
    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def __call__(self, msg: str) -> None:
        line = f"pod_runner: {msg}"
        self.f.write(line + "\n")
        print(line, flush=True)


def rootfs_layers(work: Path, base: str = "/") -> list[dict]:
    """The host's filesystems a container's root is made of: "/" and each other host mount
    outside the kernel trees and this runner's work dir, each an overlay lower (read-only,
    writes to the container's upper), or a read-only bind when it cannot be one (a file, a path
    overlayfs' option syntax cannot name)."""
    layers = [{"point": "/", "lower": base, "how": "overlay"}]
    if base != "/":
        return layers
    seen = set()
    for m in mountinfo():
        p = m["point"]
        if p == "/" or p in seen or m["fstype"] in PSEUDO_FS or any(_under(p, t) for t in KERNEL_TREES):
            continue
        if _under(p, str(work)):
            continue  # the runner's own mounts (volumes, uppers) are never part of an image
        seen.add(p)
        how = "overlay" if os.path.isdir(p) and not any(c in p for c in ",:\\") else "bind"
        layers.append({"point": p, "lower": p, "how": how})
    return sorted(layers, key=lambda m: m["point"].count("/") if m["point"] != "/" else -1)


def passwd_home(uid: int, root: str = "/") -> str:
    """HOME as runc sets it when the image and spec do not: the user's passwd entry, else /."""
    try:
        for line in Path(root, "etc/passwd").read_text().splitlines():
            f = line.split(":")
            if len(f) >= 6 and f[2] == str(uid):
                return f[5]
    except OSError:
        pass
    return "/"


class Container:
    def __init__(self, runner, name: str, argv: list[str], env: dict, uid: int, gid: int, groups: list[int],
                 workdir: str, mounts: list[dict], readonly_root: bool, no_new_privs: bool,
                 drop_all_caps: bool, rootfs: list[dict] | None = None):
        self.r, self.name = runner, name
        self.spec = {"name": name, "argv": argv, "env": env, "uid": uid, "gid": gid, "groups": groups,
                     "workdir": workdir, "mounts": mounts, "readonly_root": readonly_root,
                     "no_new_privs": no_new_privs, "drop_all_caps": drop_all_caps,
                     "rootfs": rootfs if rootfs is not None else runner.rootfs,
                     "newroot": str(runner.work / "roots" / name), "upper": str(runner.work / "uppers" / name),
                     "upper_tmpfs": True}
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    def describe(self) -> None:
        s, log = self.spec, self.r.log
        log(f"container {self.name}: uid {s['uid']} gid {s['gid']} groups {s['groups']} workdir "
            f"{s['workdir'] or '/'} root {'read-only' if s['readonly_root'] else 'read-write'} "
            f"no_new_privs {s['no_new_privs']} drop ALL caps {s['drop_all_caps'] or s['uid'] != 0}")
        log(f"container {self.name}: command {shlex.join(s['argv'])}")
        for k in sorted(s["env"]):
            log(f"container {self.name}: env {k}={s['env'][k]}")
        for v in s["mounts"]:
            log(f"container {self.name}: mount {v['target']} <- {v['source']} ({'ro' if v['readonly'] else 'rw'}; "
                f"{v['what']})")

    def start(self) -> None:
        d = self.r.work
        for sub in ("specs", "logs", "roots", "uppers"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        Path(self.spec["upper"]).mkdir(parents=True, exist_ok=True)
        spec_path = d / "specs" / f"{self.name}.json"
        spec_path.write_text(json.dumps(self.spec, indent=1))
        out = open(d / "logs" / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_exec", str(spec_path)],
                                     stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={"PATH": os.defpath})
        out.close()
        self.r.log(f"container {self.name}: started, pid {self.proc.pid}")

    def stop(self, grace: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        self.r.log(f"container {self.name}: stopped ({self.proc.returncode})")


class Runner:
    def __init__(self, work: Path, log: Log, image_env: dict, entrypoints: dict):
        self.work, self.log = work, log
        self.image_env, self.entrypoints = image_env, entrypoints
        self.rootfs = rootfs_layers(work)

    def describe_rootfs(self) -> None:
        for m in self.rootfs:
            self.log(f"image root: {m['point']} <- host {m['lower']} ({m['how']}"
                     f"{', read-only lower, private upper' if m['how'] == 'overlay' else ', read-only'})")


# -- Pod mode ---------------------------------------------------------------------------------

POD_NOTED = {"restartPolicy", "imagePullSecrets", "terminationGracePeriodSeconds"}
POD_FIELDS = {"initContainers", "containers", "volumes", "securityContext"} | POD_NOTED
CONTAINER_NOTED = {"resources", "imagePullPolicy", "terminationMessagePolicy", "terminationMessagePath"}
CONTAINER_FIELDS = {"name", "image", "command", "args", "env", "workingDir", "volumeMounts", "securityContext",
                    "restartPolicy"} | CONTAINER_NOTED
SC_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation",
             "capabilities", "seccompProfile"}
POD_SC_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "supplementalGroups", "seccompProfile"}


def _check_keys(obj: dict, allowed: set, where: str) -> None:
    if not isinstance(obj, dict):
        raise Refused(f"{where}: not an object")
    for k in obj:
        if k not in allowed:
            raise Refused(f"{where}.{k}: not something this runner can honour")


def pod_spec_of(doc: dict) -> tuple[str, dict]:
    kind = doc.get("kind")
    if kind == "Pod":
        _check_keys(doc, {"apiVersion", "kind", "metadata", "spec"}, "Pod")
        return doc["metadata"]["name"], doc["spec"]
    if kind == "Deployment":
        _check_keys(doc, {"apiVersion", "kind", "metadata", "spec"}, "Deployment")
        spec = doc.get("spec") or {}
        _check_keys(spec, {"replicas", "selector", "template"}, "spec")
        _check_keys(spec.get("template") or {}, {"metadata", "spec"}, "spec.template")
        if spec.get("replicas", 1) != 1:
            raise Refused("spec.replicas: this runner is one node running one Pod")
        return doc["metadata"]["name"], spec["template"]["spec"]
    raise Refused(f"kind: {kind!r} is not a Pod or a Deployment")


def _volumes(runner: Runner, spec: dict, pvcs: dict, image_volumes: dict, fs_group) -> dict:
    out = {}
    for i, v in enumerate(spec.get("volumes") or []):
        where = f"spec.volumes[{i}]"
        name = v.get("name")
        kinds = [k for k in v if k != "name"]
        if len(kinds) != 1:
            raise Refused(f"{where}: one volume source expected, got {kinds}")
        kind = kinds[0]
        src = v[kind] or {}
        d = runner.work / "volumes" / name
        if kind == "emptyDir":
            _check_keys(src, {"medium", "sizeLimit"}, f"{where}.emptyDir")
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
            note = "emptyDir: a fresh dir, root's, 0777"
            if src.get("medium") == "Memory":
                size = src.get("sizeLimit")
                sys_mount("tmpfs", str(d), "tmpfs", MS_NOSUID | MS_NODEV,
                          f"mode=0777{',size=' + _tmpfs_size(size) if size else ''}")
                note = f"emptyDir medium Memory: a tmpfs{' of ' + size if size else ''}"
            elif src.get("medium"):
                raise Refused(f"{where}.emptyDir.medium: {src['medium']!r}")
            elif src.get("sizeLimit"):
                note += f" (sizeLimit {src['sizeLimit']} noted, not enforced: the kubelet evicts)"
            os.chmod(d, 0o777)
            if fs_group is not None:
                os.chown(d, 0, fs_group)
                os.chmod(d, 0o2777)
                note += f", group {fs_group} setgid (fsGroup)"
            out[name] = {"source": str(d), "readonly": False, "what": note}
        elif kind == "hostPath":
            _check_keys(src, {"path", "type"}, f"{where}.hostPath")
            t = src.get("type", "")
            if t in ("DirectoryOrCreate",):
                os.makedirs(src["path"], exist_ok=True)
            elif t == "Directory" and not os.path.isdir(src["path"]):
                raise Refused(f"{where}.hostPath.path: {src['path']} is not a directory")
            elif t not in ("", "Directory"):
                raise Refused(f"{where}.hostPath.type: {t!r}")
            out[name] = {"source": src["path"], "readonly": False, "what": "hostPath"}
        elif kind == "persistentVolumeClaim":
            _check_keys(src, {"claimName", "readOnly"}, f"{where}.persistentVolumeClaim")
            claim = src.get("claimName")
            if claim not in pvcs:
                raise Refused(f"{where}.persistentVolumeClaim.claimName: {claim!r} has no --pvc {claim}=HOSTDIR")
            out[name] = {"source": pvcs[claim], "readonly": bool(src.get("readOnly")),
                         "what": f"persistentVolumeClaim {claim} = host dir (--pvc)"}
        elif kind == "image":
            _check_keys(src, {"reference", "pullPolicy"}, f"{where}.image")
            ref = src.get("reference")
            if ref not in image_volumes:
                raise Refused(f"{where}.image.reference: {ref!r} has no --image-volume {ref}=ARTIFACT")
            tree = _extract_image(runner, ref, image_volumes[ref], d)
            out[name] = {"source": str(tree), "readonly": True,
                         "what": f"image volume {ref}: the layer of {image_volumes[ref]}, extracted (always read-only)"}
        else:
            raise Refused(f"{where}.{kind}: this runner has no {kind} volumes")
    return out


def _tmpfs_size(q: str) -> str:
    units = {"Ki": "k", "Mi": "m", "Gi": "g", "Ti": "t"}
    for u, t in units.items():
        if q.endswith(u) and q[:-2].isdigit():
            return q[:-2] + t
    if q.isdigit():
        return q
    raise Refused(f"emptyDir.sizeLimit: {q!r} (Ki/Mi/Gi/Ti or bytes)")


def _extract_image(runner: Runner, ref: str, artifact: str, dest: Path) -> Path:
    """What a runtime mounts for an image volume: the image's layer, unpacked as it is.  The
    image is the cachebake artifact's, selected by the reference's digest (which it must hold)
    or tag (the target)."""
    import tarfile

    import zstandard

    from cachebake.artifact import oci

    art = oci.open_artifact(artifact)
    name, _, digest = ref.partition("@")
    if digest:
        entries = [t for t, e in art.entries_by_target().items() if e["digest"] == digest]
        if not entries:
            raise Refused(f"--image-volume {ref}: {artifact} has no image {digest}")
        sel = art.select(entries[0])
    else:
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else None
        sel = art.select(tag)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with art.open_layer(sel) as layer, zstandard.ZstdDecompressor().stream_reader(layer) as raw, \
            tarfile.open(fileobj=raw, mode="r|") as tar:
        # the data filter where Python has it (no links out, no devices, no absolute names)
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    os.chmod(dest, 0o755)
    runner.log(f"image volume {ref}: {artifact} image {sel.manifest_digest} layer {sel.layer_digest[:19]} "
               f"extracted to {dest}")
    return dest


def _container(runner: Runner, c: dict, where: str, pod_sc: dict, volumes: dict, extra_env: dict,
               extra_binds: dict, podname: str, extra_args: dict) -> Container:
    _check_keys(c, CONTAINER_FIELDS, where)
    sc = c.get("securityContext") or {}
    _check_keys(sc, SC_FIELDS, f"{where}.securityContext")
    caps = sc.get("capabilities") or {}
    _check_keys(caps, {"drop"}, f"{where}.securityContext.capabilities")
    if caps.get("drop") not in (None, ["ALL"]):
        raise Refused(f"{where}.securityContext.capabilities.drop: only [ALL]")
    for noted in ("seccompProfile",):
        if noted in sc or noted in pod_sc:
            runner.log(f"{where}: seccompProfile noted, NOT enforced (no seccomp filter is loaded)")
    for noted in CONTAINER_NOTED & set(c):
        runner.log(f"{where}.{noted}: noted, not enforced ({c[noted]})")
    image = c.get("image")
    runner.log(f"{where}: image {image} -> the host's root filesystem (not pulled)")
    entry = runner.entrypoints.get(image, [])
    cmd = c.get("command") or entry
    argv = list(cmd) + list(c.get("args") or ([] if c.get("command") else []))
    if not argv:
        raise Refused(f"{where}.command: not set, and image {image} has no entrypoint here "
                      "(--image-entrypoint IMAGE=JSON)")
    env = dict(runner.image_env)
    env["HOSTNAME"] = podname
    for i, e in enumerate(c.get("env") or []):
        _check_keys(e, {"name", "value"}, f"{where}.env[{i}]")
        env[e["name"]] = str(e.get("value", ""))
    for k, v in extra_env.get(c["name"], {}).items():
        runner.log(f"{where}: env {k} added by the runner (not in the spec): instrumentation")
        env[k] = v
    uid = sc.get("runAsUser", pod_sc.get("runAsUser", 0))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", 0 if uid == 0 else uid))
    if (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")) and uid == 0:
        raise Refused(f"{where}.securityContext.runAsNonRoot: the container would run as root")
    groups = sorted({g for g in [pod_sc.get("fsGroup"), *(pod_sc.get("supplementalGroups") or [])]
                     if g is not None})
    if "HOME" not in env:
        env["HOME"] = passwd_home(uid)
    mounts = []
    for i, m in enumerate(c.get("volumeMounts") or []):
        _check_keys(m, {"name", "mountPath", "readOnly"}, f"{where}.volumeMounts[{i}]")
        if m["name"] not in volumes:
            raise Refused(f"{where}.volumeMounts[{i}].name: no volume {m['name']!r}")
        v = volumes[m["name"]]
        mounts.append({"source": v["source"], "target": m["mountPath"],
                       "readonly": bool(m.get("readOnly")) or v["readonly"], "what": v["what"]})
    for arg in extra_args.get(c["name"], []):
        runner.log(f"{where}: argument {arg!r} appended by the runner (not in the spec)")
        argv.append(arg)
    for host, path in extra_binds.get(c["name"], []):
        runner.log(f"{where}: bind {host} at {path} added by the runner (not in the spec): instrumentation")
        mounts.append({"source": host, "target": path, "readonly": False, "what": "runner's instrumentation"})
    return Container(runner, c["name"], argv, env, uid, gid, groups, c.get("workingDir", ""), mounts,
                     bool(sc.get("readOnlyRootFilesystem")), sc.get("allowPrivilegeEscalation") is False,
                     caps.get("drop") == ["ALL"])


def run_pod(a) -> int:
    import yaml

    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = Log(work / "runner.log")
    docs = [d for d in yaml.safe_load_all(Path(a.manifest).read_text()) if d]
    if len(docs) != 1:
        raise Refused(f"{a.manifest}: {len(docs)} documents, one Pod or Deployment expected")
    podname, spec = pod_spec_of(docs[0])
    _check_keys(spec, POD_FIELDS, "spec")
    pod_sc = spec.get("securityContext") or {}
    _check_keys(pod_sc, POD_SC_FIELDS, "spec.securityContext")
    for noted in POD_NOTED & set(spec):
        log(f"spec.{noted}: noted, not enforced ({spec[noted]})")
    sys_unshare_mounts()  # every mount below (tmpfs emptyDirs) is this runner's own
    runner = Runner(work, log, dict(a.image_env), dict(a.image_entrypoint))
    log(f"pod {podname} from {a.manifest}: no container engine; images map to the host root, not pulled")
    runner.describe_rootfs()
    volumes = _volumes(runner, spec, dict(a.pvc), dict(a.image_volume), pod_sc.get("fsGroup"))
    extra_env: dict = {}
    for c, k, v in a.add_env:
        extra_env.setdefault(c, {})[k] = v
    extra_args: dict = {}
    for c, arg in a.add_arg:
        extra_args.setdefault(c, []).append(arg)
    extra_binds: dict = {}
    for c, h, p in a.add_bind:
        extra_binds.setdefault(c, []).append((h, p))
    inits = [_container(runner, c, f"spec.initContainers[{i}]", pod_sc, volumes, extra_env, extra_binds, podname,
                        extra_args)
             for i, c in enumerate(spec.get("initContainers") or [])]
    sidecar = {c["name"]: c.get("restartPolicy") == "Always" for c in spec.get("initContainers") or []}
    for i, c in enumerate(spec.get("initContainers") or []):
        if c.get("restartPolicy") not in (None, "Always"):
            raise Refused(f"spec.initContainers[{i}].restartPolicy: {c['restartPolicy']!r}")
    mains = [_container(runner, c, f"spec.containers[{i}]", pod_sc, volumes, extra_env, extra_binds, podname,
                        extra_args)
             for i, c in enumerate(spec["containers"])]
    for i, c in enumerate(spec["containers"]):
        if "restartPolicy" in c:
            raise Refused(f"spec.containers[{i}].restartPolicy: only init containers take one")
    for c in inits + mains:
        c.describe()
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sidecars: list[Container] = []
    rc = 0
    try:
        for c in inits:
            c.start()
            if sidecar[c.name]:
                sidecars.append(c)  # KEP-753: started; the next one starts now (no startupProbe)
                continue
            while c.proc.poll() is None and not stopping:
                _keep_sidecars(sidecars, log)
                time.sleep(0.2)
            if stopping:
                log(f"stopped by signal {stopping[0]} during init container {c.name}")
                return 0
            log(f"init container {c.name}: exited {c.proc.returncode}")
            if c.proc.returncode != 0:
                log(f"init container {c.name} failed (exit {c.proc.returncode}): the Pod does not start "
                    f"(logs/{c.name}.log)")
                return EXIT_INIT_FAILED
        for c in mains:
            c.start()
        if a.ready_file:
            Path(a.ready_file).write_text(str(os.getpid()))
        while not stopping:
            _keep_sidecars(sidecars, log)
            done = [c for c in mains if c.proc.poll() is not None]
            if done:
                for c in done:
                    log(f"container {c.name}: exited {c.proc.returncode}")
                if any(c.proc.returncode for c in done):
                    rc = EXIT_SERVER_FAILED
                if len(done) == len(mains) or rc:
                    break
            time.sleep(0.5)
        if stopping:
            log(f"stopped by signal {stopping[0]}")
    finally:
        for c in mains + list(reversed(sidecars)) + inits:
            c.stop()
    return rc


def _keep_sidecars(sidecars: list[Container], log: Log) -> None:
    for c in sidecars:
        if c.proc.poll() is not None:
            c.restarts += 1
            log(f"sidecar {c.name}: exited {c.proc.returncode}; restarting (restartPolicy Always, "
                f"restart {c.restarts})")
            time.sleep(min(10, c.restarts))
            c.start()


# -- Dockerfile mode --------------------------------------------------------------------------

def parse_dockerfile(text: str) -> list[tuple[str, str, int]]:
    """(INSTRUCTION, rest, line) with continuation lines joined and comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip(), start))
        buf = ""
    return out


def _subst(text: str, env: dict) -> str:
    import re

    def one(m):
        name = m.group(1) or m.group(2)
        return env.get(name, "")
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, text)


class Stage:
    def __init__(self, name: str, base: str, out: Path):
        self.name, self.base, self.out = name, base, out
        self.env: dict = {}
        self.user, self.workdir = "0", "/"
        self.entrypoint: list | None = None
        self.cmd: list | None = None
        self.lowers: list[str] = []  # the stage's filesystem: these dirs over the base
        self.scratch = False
        self.nrun = 0
        self.instrs: list = []


def run_dockerfile(a) -> int:
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = Log(work / "runner.log")
    sys_unshare_mounts()
    # The stages' files live on a tmpfs of this runner's own: overlayfs refuses a lower layer
    # inside another (a stage's output under the host root, ELOOP), and a builder's layers are
    # not the host's files either.  They go when the runner exits.
    (work / "stages").mkdir(exist_ok=True)
    sys_mount("tmpfs", str(work / "stages"), "tmpfs", 0, "mode=0755")
    runner = Runner(work, log, dict(a.image_env), {})
    args = dict(a.build_arg)
    given = dict(a.stage_dir)
    log(f"dockerfile {a.dockerfile}: target {a.target}; no builder: every FROM an image maps to the "
        "host root, not pulled")
    runner.describe_rootfs()
    instrs = parse_dockerfile(Path(a.dockerfile).read_text())
    meta_args: dict = {}
    stages: dict[str, Stage] = {}
    order: list[Stage] = []
    cur: Stage | None = None
    for word, rest, line in instrs:
        where = f"{a.dockerfile}:{line} {word}"
        if word == "ARG":
            k, _, v = rest.partition("=")
            scope = meta_args if cur is None else cur.env.setdefault("__args__", {})
            scope[k] = args.get(k, v if v else meta_args.get(k, ""))
            continue
        if word == "FROM":
            parts = rest.split()
            base = _subst(parts[0], {**meta_args, **args})
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else f"stage{len(order)}"
            if len(parts) not in (1, 3):
                raise Refused(f"{where}: FROM IMAGE [AS NAME] only")
            cur = Stage(name, base, work / "stages" / name / "fs")
            if base in stages:
                parent = stages[base]
                cur.env = {k: v for k, v in parent.env.items() if k != "__args__"}
                cur.user, cur.workdir = parent.user, parent.workdir
                cur.entrypoint, cur.cmd = parent.entrypoint, parent.cmd
                cur.lowers, cur.scratch = [*parent.lowers, str(parent.out)], parent.scratch
            elif base == "scratch":
                cur.scratch = True
            else:
                cur.entrypoint = json.loads(a.base_entrypoint) if a.base_entrypoint else None
            cur.instrs = []
            stages[name] = cur
            order.append(cur)
            continue
        if cur is None:
            raise Refused(f"{where}: before any FROM")
        cur.instrs.append((word, rest, line, where))
    needed = _needed(stages, a.target, given)
    for st in order:
        if st.name not in needed:
            log(f"stage {st.name}: not needed for {a.target}, skipped")
            continue
        if st.name in given:
            st.out = Path(given[st.name]).resolve()
            st.lowers, st.scratch = [], True
            log(f"stage {st.name}: given ready-made (--stage-dir): {st.out}")
            continue
        if st.out.parent.exists():
            shutil.rmtree(st.out.parent)
        st.out.mkdir(parents=True)
        log(f"stage {st.name}: FROM {st.base}{' (the host root)' if st.base not in stages and st.base != 'scratch' else ''}")
        for word, rest, line, where in st.instrs:
            if _instruction(runner, st, stages, word, rest, where, a) != 0:
                return EXIT_INIT_FAILED
    final = stages[a.target]
    if a.run is None:
        return 0
    entry = json.loads(a.entrypoint) if a.entrypoint is not None else final.entrypoint
    argv = list(entry or []) + (list(a.run) if a.run else list(final.cmd or []))
    if not argv:
        raise Refused(f"stage {final.name}: no ENTRYPOINT or CMD and nothing to run")
    mounts = []
    for name, host, path in a.add_bind:
        if name == "run":
            log(f"run: bind {host} at {path} added by the runner (not in the image): instrumentation")
            mounts.append({"source": host, "target": path, "readonly": False, "what": "runner's instrumentation"})
    c = _stage_container(runner, final, "run", argv, mounts)
    for name, k, v in a.add_env:
        if name == "run":
            log(f"run: env {k} added by the runner (not in the image)")
            c.spec["env"][k] = v
    c.describe()
    c.start()
    stopping = []
    signal.signal(signal.SIGTERM, lambda s, f: stopping.append(s))
    signal.signal(signal.SIGINT, lambda s, f: stopping.append(s))
    if a.ready_file:
        Path(a.ready_file).write_text(str(os.getpid()))
    while c.proc.poll() is None and not stopping:
        time.sleep(0.5)
    c.stop()
    log(f"run: exited {c.proc.returncode}")
    return 0 if stopping or c.proc.returncode == 0 else EXIT_SERVER_FAILED


def _needed(stages: dict, target: str, given: dict) -> set:
    """The stages ``target`` is built from; a given stage (--stage-dir) needs nothing."""
    if target not in stages:
        raise Refused(f"--target {target}: no such stage ({', '.join(stages)})")
    for g in given:
        if g not in stages:
            raise Refused(f"--stage-dir {g}: no such stage ({', '.join(stages)})")
        if not os.path.isdir(given[g]):
            raise Refused(f"--stage-dir {g}={given[g]}: not a directory")
    need, todo = set(), [target]
    while todo:
        s = stages[todo.pop()]
        if s.name in need:
            continue
        need.add(s.name)
        if s.name in given:
            continue
        if s.base in stages:
            todo.append(s.base)
        for word, rest, _, _ in s.instrs:
            if word == "COPY" and "--from=" in rest:
                src = rest.split("--from=", 1)[1].split()[0]
                if src in stages:
                    todo.append(src)
    return need


def _stage_rootfs(runner: Runner, st: Stage) -> list[dict]:
    """The stage's filesystem as overlay lowers: its own output on top, its parents', then the
    host root (unless FROM scratch)."""
    lowers = [str(st.out), *reversed(st.lowers)]
    if st.scratch:
        return [{"point": "/", "lower": ":".join(lowers), "how": "overlay"}] if len(lowers) > 1 else \
            [{"point": "/", "lower": lowers[0], "how": "bind"}]
    layers = []
    for m in runner.rootfs:
        if m["point"] == "/" and m["how"] == "overlay":
            layers.append({**m, "lower": ":".join([*lowers, "/"])})
        else:
            layers.append(m)
    return layers


def _uid_gid(user: str) -> tuple[int, int]:
    u, _, g = user.partition(":")
    if not u.isdigit() or (g and not g.isdigit()):
        import pwd

        try:
            pw = pwd.getpwnam(u) if not u.isdigit() else pwd.getpwuid(int(u))
            return pw.pw_uid, int(g) if g else pw.pw_gid
        except KeyError:
            raise Refused(f"USER {user}: not a user of the host root") from None
    return int(u), int(g) if g else int(u)


def _stage_container(runner: Runner, st: Stage, label: str, argv: list, mounts=(), writable_out=False) -> Container:
    uid, gid = _uid_gid(st.user)
    env = {**runner.image_env, **{k: v for k, v in st.env.items() if k != "__args__"}}
    env.setdefault("HOME", passwd_home(uid))
    rootfs = _stage_rootfs(runner, st)
    if writable_out:  # a RUN step writes into the stage's own output: the root's upper dir
        if rootfs[0]["how"] != "overlay" or ":" not in rootfs[0]["lower"]:
            raise Refused(f"stage {st.name}: RUN in a FROM scratch stage (no shell to run)")
        rootfs[0] = {**rootfs[0], "lower": rootfs[0]["lower"].split(":", 1)[1], "upperdir": str(st.out),
                     "workdir": str(st.out.parent / "work")}
    return Container(runner, f"{st.name}-{label}", argv, env, uid, gid, [], st.workdir, list(mounts), False,
                     False, False, rootfs=rootfs)


def _instruction(runner: Runner, st: Stage, stages: dict, word: str, rest: str, where: str, a) -> int:
    log = runner.log
    env = {**st.env.get("__args__", {}), **{k: v for k, v in st.env.items() if k != "__args__"}}
    if word == "ENV":
        import shlex as _sh

        for kv in _sh.split(rest):
            k, _, v = kv.partition("=")
            st.env[k] = _subst(v, env)
            env[k] = st.env[k]
        log(f"stage {st.name}: ENV {rest}")
        return 0
    if word == "USER":
        st.user = _subst(rest, env)
        log(f"stage {st.name}: USER {st.user}")
        return 0
    if word == "WORKDIR":
        st.workdir = _subst(rest, env)
        (st.out / st.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        return 0
    if word in ("ENTRYPOINT", "CMD"):
        val = json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]
        if word == "ENTRYPOINT":
            st.entrypoint, st.cmd = val, None
        else:
            st.cmd = val
        log(f"stage {st.name}: {word} {val}")
        return 0
    if word == "COPY":
        words = rest.split()
        frm = None
        while words and words[0].startswith("--"):
            flag = words.pop(0)
            if flag.startswith("--from="):
                frm = flag.split("=", 1)[1]
            else:
                raise Refused(f"{where}: {flag}")
        *srcs, dst = [_subst(w, env) for w in words]
        base = stages[frm].out if frm in stages else Path(a.context) if frm is None else None
        if base is None:
            raise Refused(f"{where}: --from={frm}: not a stage (an image would be pulled)")
        for s in srcs:
            src = base / s.lstrip("/")
            target = st.out / dst.lstrip("/")
            if src.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", "-a", f"{src}/.", str(target)], check=True)
            else:
                if dst.endswith("/"):
                    target = target / src.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
            log(f"stage {st.name}: COPY {'--from=' + frm + ' ' if frm else ''}{s} -> {dst} ({src})")
        return 0
    if word == "RUN":
        mounts, device = [], False
        body = rest
        while body.startswith("--"):
            flag, _, body = body.partition(" ")
            body = body.lstrip()
            if flag.startswith("--device="):
                device = True
            elif flag.startswith("--mount="):
                opts = dict(o.split("=", 1) for o in flag[len("--mount="):].split(","))
                if opts.get("type") != "bind":
                    raise Refused(f"{where}: {flag}: only type=bind")
                src = Path(a.context) / opts.get("source", ".").lstrip("/")
                mounts.append({"source": str(src.resolve()), "target": opts["target"], "readonly": True,
                               "what": "RUN --mount=type=bind (the build context)"})
            else:
                raise Refused(f"{where}: {flag}")
        if device and a.skip_device_runs:
            log(f"stage {st.name}: RUN --device ... skipped (--skip-device-runs)")
            return 0
        # the shell form, with the stage's ARGs as variables of the step (as BuildKit gives them)
        argv = ["/bin/sh", "-c", body]
        st.nrun += 1
        c = _stage_container(runner, st, f"run{st.nrun}", argv, mounts, writable_out=True)
        c.spec["env"].update(st.env.get("__args__", {}))
        c.spec["env"].update({k: v for k, v in st.env.items() if k != "__args__"})
        c.describe()
        c.start()
        c.proc.wait()
        log(f"stage {st.name}: RUN exited {c.proc.returncode}")
        if c.proc.returncode != 0:
            log(f"{where}: failed (exit {c.proc.returncode}; logs/{c.name}.log)")
            return c.proc.returncode
        return 0
    raise Refused(f"{where}: {word} is not an instruction this runner carries out")


# -- CLI --------------------------------------------------------------------------------------

def _kv(text: str) -> tuple[str, str]:
    k, sep, v = text.partition("=")
    if not sep or not k:
        raise SystemExit(f"pod_runner: {text!r}: expected K=V")
    return k, v


def _entry(text: str) -> tuple[str, list]:
    k, v = _kv(text)
    val = json.loads(v)
    if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
        raise SystemExit(f"pod_runner: {text!r}: expected IMAGE=[\"exe\", ...]")
    return k, val


def _cenv(text: str) -> tuple[str, str, str]:
    c, _, kv = text.partition(":")
    return (c, *_kv(kv))


def _cbind(text: str) -> tuple[str, str, str]:
    c, host, path = text.split(":", 2)
    return c, host, path


def main(argv=None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_exec"]:
        _exec_child(argv[1])
        return 127
    ap = argparse.ArgumentParser(prog="pod_runner", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--work", required=True, help="where volumes, roots and logs go")
    common.add_argument("--image-env", type=_kv, action="append", default=[],
                        help="K=V: the images' own ENV (default PATH: this process's)")
    common.add_argument("--ready-file", help="written once every container has started")
    common.add_argument("--add-env", type=_cenv, action="append", default=[],
                        help="CONTAINER:K=V, set by the runner and logged as such (dockerfile: CONTAINER is run)")
    common.add_argument("--add-bind", type=_cbind, action="append", default=[],
                        help="CONTAINER:HOSTDIR:PATH, mounted by the runner and logged as such")
    p = sub.add_parser("pod", parents=[common])
    p.add_argument("manifest")
    p.add_argument("--pvc", type=_kv, action="append", default=[], help="CLAIM=HOSTDIR")
    p.add_argument("--image-volume", type=_kv, action="append", default=[], help="REF=ARTIFACT")
    p.add_argument("--image-entrypoint", type=_entry, action="append", default=[], help="IMAGE=JSON-ARRAY")
    p.add_argument("--add-arg", type=lambda t: tuple(t.split(":", 1)), action="append", default=[],
                   help="CONTAINER:ARG appended to its command (logged)")

    d = sub.add_parser("dockerfile", parents=[common])
    d.add_argument("dockerfile")
    d.add_argument("--context", required=True)
    d.add_argument("--target", required=True)
    d.add_argument("--build-arg", type=_kv, action="append", default=[])
    d.add_argument("--stage-dir", type=_kv, action="append", default=[], help="STAGE=DIR (ready-made)")
    d.add_argument("--base-entrypoint", help="the base image's ENTRYPOINT, JSON (vLLM's: [\"vllm\", \"serve\"])")
    d.add_argument("--skip-device-runs", action="store_true", help="skip RUN --device steps (a bake)")
    d.add_argument("--entrypoint", help="replaces the final image's ENTRYPOINT, JSON (docker run --entrypoint)")
    d.add_argument("--run", action="store_true", help="(last) run the final image; the words after it "
                   "replace its CMD, as `docker run IMAGE ARGS` does")
    run = None
    if argv[:1] == ["dockerfile"] and "--run" in argv:  # everything after --run is the command's
        i = argv.index("--run")
        argv, run = argv[:i + 1], argv[i + 1:]
        run = run[1:] if run[:1] == ["--"] else run
    a = ap.parse_args(argv)
    a.run = run
    if not any(k == "PATH" for k, _ in a.image_env):
        a.image_env.insert(0, ("PATH", os.environ.get("PATH", os.defpath)))
    try:
        if os.geteuid() != 0:
            raise HostError("needs root (mount namespaces, chroot, changing uid)")
        return run_pod(a) if a.mode == "pod" else run_dockerfile(a)
    except Refused as e:
        print(f"pod_runner: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except HostError as e:
        print(f"pod_runner: this host cannot: {e}", file=sys.stderr)
        return EXIT_HOST


if __name__ == "__main__":
    sys.exit(main())
