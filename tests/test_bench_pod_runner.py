"""bench/pod_runner.py, the kubelet stand-in the GPU host runs (bench/gpu_delivery.sh), on CPU:
the Pods `cachebake k8s` writes, exactly as written, with a real bake (real sm_90 Triton cache
entries and the H200 vllm-role excerpt), and `vllm` on the "image's" PATH the stand-in
(tests/kit/standin_vllm.py), which does to the filesystem what the real server does at start.

Every image maps to this host's root (as on the GPU host, where the serving software is
installed): the "image" here is a world-readable dir with `vllm` (the stand-in) and
`cachebake` on PATH, and cachebake's sources on PYTHONPATH.  Needs root (mount namespaces);
skips otherwise, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from containerkit import ROOT, cli
from installkit import REPO, compile_kernels

from cachebake.artifact.pack import CacheRoot, pack_artifact
from cachebake.distribute.k8s import NONROOT_UID

RUNNER = REPO / "bench" / "pod_runner.py"
SERVED_MODEL = "/models/served-here"  # the model path the bake's vllm section records
MARKER = "STAND-IN-SERVER "


def _mount_namespaces_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("the Pod runner needs root (mount namespaces, chroot, other uids): CI runs as root")
    r = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True) if shutil.which("unshare") \
        else None
    if r is not None and r.returncode != 0:
        pytest.skip(f"no mount namespace here: {r.stderr.strip()}")


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """The "image": the host root, plus a world-readable dir holding the stand-in `vllm`, a
    `cachebake` command and cachebake's sources (uid 65534 runs the init containers)."""
    _mount_namespaces_or_skip()
    import servekit

    d = Path(tempfile_public())
    (d / "bin").mkdir()
    shutil.copytree(REPO / "cachebake", d / "lib" / "cachebake", ignore=shutil.ignore_patterns("__pycache__"))
    vllm = d / "bin" / "vllm"
    vllm.write_text(f"#!{sys.executable}\n" + (REPO / "tests" / "kit" / "standin_vllm.py").read_text().split("\n", 1)[1])
    (d / "bin" / "cachebake").write_text(f"#!{sys.executable}\nimport sys\nfrom cachebake.cli import main\n"
                                         "sys.exit(main())\n")
    shutil.copy2(REPO / "docker" / "cachebake-init.sh", d / "cachebake-init.sh")
    kernels = servekit.kernels_dir()
    if Path(kernels).resolve().is_relative_to("/tmp"):
        # A checkout under /tmp (a CI clone) is hidden inside the Pods by their /tmp emptyDir, as
        # an image's own files would be: the test kernels travel with the image's other files.
        # (Their keys hold no path; the bake is made from this same copy: bake fixture.)
        shutil.copytree(kernels, d / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
        kernels = d / "kernels"
    for p in d.rglob("*"):
        p.chmod(0o755 if p.is_dir() or p.parent.name == "bin" or p.suffix == ".sh" else 0o644)
    env = {"PATH": f"{d / 'bin'}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "PYTHONPATH": str(d / "lib"), "CACHEBAKE_STANDIN_KERNELS": str(kernels)}
    yield {"dir": d, "env": env, "entrypoint": ["/bin/sh", str(d / "cachebake-init.sh")]}
    shutil.rmtree(d, ignore_errors=True)


def tempfile_public() -> str:
    import tempfile

    # Not under /tmp: the init containers mount an emptyDir there, which hides it (as it would
    # hide an image's files), and the installer reads the bake at its path.
    d = tempfile.mkdtemp(prefix="cachebake-pod-runner-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    os.chmod(d, 0o755)
    return d


@pytest.fixture(scope="module")
def bake(image):
    """A --driver vllm bake (its section as the driver records it: model path, serve args, the
    env), its Triton role real sm_90 kernels, its vllm role the H200 excerpt, packed for ROOT;
    in a public dir (the installer reads it as uid 65534)."""
    from test_artifact_torch_paths import excerpt

    base = image["dir"] / "bake"
    compile_kernels(base / "root" / "triton")
    for name, data in excerpt().items():
        (base / "root" / name).parent.mkdir(parents=True, exist_ok=True)
        (base / "root" / name).write_bytes(data)
    section = {"driver": "vllm", "model": {"path": SERVED_MODEL},
               "serve_args": {"max_num_seqs": 8}, "serve_env": {"VLLM_USE_V2_MODEL_RUNNER": "1"},
               "env": {"root": ROOT, "invalidating_env_vars": {}}}
    art = base / "artifact"
    report = pack_artifact([CacheRoot("triton", base / "root" / "triton"), CacheRoot("vllm", base / "root" / "vllm")],
                           art, target="sm_90", bake=section, layer_root=ROOT)
    shutil.rmtree(base / "root")  # the bake root is gone, as on a serving node
    for p in [base, *base.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    model = image["dir"] / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["NemotronHForCausalLM"], "stand_in": True}))
    model.chmod(0o755)
    (model / "config.json").chmod(0o644)
    return {"artifact": art, "pinned": f"docker://reg.example/bakes/nemotron@{report.manifest_digest}",
            "model": model}


class Pod:
    """The runner carrying out one manifest, in the background, as a node runs a Pod."""

    def __init__(self, manifest: Path, work: Path, *args: str):
        self.work = work
        self.proc = subprocess.Popen([sys.executable, str(RUNNER), "pod", str(manifest), "--work", str(work), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def log(self, container: str) -> str:
        p = self.work / "logs" / f"{container}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def until_logged(self, container: str, marker: str, timeout: float = 300) -> str:
        """The line starting with ``marker`` in ``container``'s log; fails with the runner's and
        the container's logs if the Pod ends first, or nothing comes in ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log(container).splitlines():
                if line.startswith(marker):
                    return line[len(marker):]
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = self.stop()
                raise AssertionError(f"{container} logged no {marker!r} (runner exit {self.proc.returncode}):\n"
                                     f"--- {container}:\n{self.log(container)[-3000:]}\n--- runner:\n{out[-4000:]}")
            time.sleep(0.3)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        return out


def _runner_args(image, bake) -> list[str]:
    args = ["--pvc", f"models={bake['model']}",
            "--image-entrypoint", f"inst:1={json.dumps(image['entrypoint'])}"]
    for k, v in image["env"].items():
        args += ["--image-env", f"{k}={v}"]
    return args


def _generate(tmp_path: Path, *args) -> tuple[Path, dict]:
    text = cli("k8s", "--kind", "pod", "--target", "sm_90", "--gpus", "0", "--serving-image", "vllm:1", *args).stdout
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    return path, yaml.safe_load(text)


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _layer(art: Path) -> dict:
    """The files of the bake image's one layer, read from the artifact."""
    import tarfile

    import zstandard

    from cachebake.artifact import oci

    layout = oci.open_artifact(art)
    with layout.open_layer(layout.select("sm_90")) as layer, \
            zstandard.ZstdDecompressor().stream_reader(layer) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
        return {os.path.normpath(m.name): tar.extractfile(m).read() for m in tar if m.isfile()}


def test_the_image_volume_pod_as_generated_serves_with_the_bake_read_only(image, bake, tmp_path):
    """Issue 30: `cachebake k8s --pattern image-volume --bake ART --serving-image-has-cachebake
    --model-pvc CLAIM`, carried out as written: the server starts (no EROFS at import), its
    baked kernels all hit, a kernel the bake lacks compiles into the overlay and is streamed
    by the miss-log sidecar, and nothing is written into the read-only image."""
    manifest, doc = _generate(tmp_path, "--pattern", "image-volume", "--artifact", bake["pinned"],
                              "--bake", bake["artifact"], "--serving-image-has-cachebake", "--model-pvc", "models")
    ref = next(v["image"]["reference"] for v in doc["spec"]["volumes"] if "image" in v)
    pod = Pod(manifest, tmp_path / "work", *_runner_args(image, bake),
              "--image-volume", f"{ref}={bake['artifact']}")
    try:
        seen = json.loads(pod.until_logged("vllm", MARKER))
        (server,) = doc["spec"]["containers"]
        assert seen["argv"] == server["command"][1:] and seen["argv"][1] == SERVED_MODEL
        assert seen["model_config"]["stand_in"] is True and seen["model_writable"] is False
        report = seen["verify"]
        assert seen["verify_rc"] == 0 and report["compiles"] == 0 and report["cache_hits"] == 3, report
        miss = seen["miss_compile"]
        assert miss["misses"] == 1 and miss["manager"] == "cachebake.serve.layered:LayeredCacheManager"
        head = '{"cachebake_miss"'  # the line the layered manager wrote, as the sidecar's tail prints it
        streamed = json.loads(head + pod.until_logged("miss-log", head))
        assert streamed["stored"] == "overlay" and streamed["kernel"] == "add_kernel"
    finally:
        out = pod.stop()
    assert pod.proc.returncode == 0, out[-3000:]
    # the image volume is the layer as pushed: nothing was added to it or changed in it
    assert _tree(tmp_path / "work" / "volumes" / "cachebake") == _layer(bake["artifact"])


def test_the_init_pod_as_generated_installs_for_the_server_and_serves(image, bake, tmp_path):
    """The init-container Pod, as written: cachebake-lib and cachebake-fingerprint (uid 65534,
    read-only root), cachebake-install (the installer image's entrypoint, docker/cachebake-init.sh)
    from the bake's local path, then the server: every baked kernel hits, the one it lacks
    compiles into the Pod's writable copy."""
    probe = subprocess.run(["setpriv", f"--reuid={NONROOT_UID}", f"--regid={NONROOT_UID}", "--clear-groups",
                            "/usr/bin/env", sys.executable, "-c", "import triton"], capture_output=True, text=True,
                           cwd="/", env={"PATH": os.defpath})
    if probe.returncode != 0:
        pytest.skip(f"uid {NONROOT_UID} cannot run {sys.executable} (an interpreter under a 0700 home?): "
                    f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    manifest, doc = _generate(tmp_path, "--artifact", str(bake["artifact"]), "--bake", bake["artifact"],
                              "--installer-image", "inst:1", "--model-pvc", "models")
    pod = Pod(manifest, tmp_path / "work", *_runner_args(image, bake))
    try:
        seen = json.loads(pod.until_logged("vllm", MARKER))
        assert seen["verify_rc"] == 0 and seen["verify"]["compiles"] == 0 and seen["verify"]["cache_hits"] == 3
        assert seen["miss_compile"]["misses"] == 1
    finally:
        out = pod.stop()
    assert pod.proc.returncode == 0, out[-3000:]
    data = tmp_path / "work" / "volumes" / "cachebake"
    marker = json.loads((data / ".cachebake" / "current" / "install.json").read_text())
    assert marker["serve_at"] == ROOT
    assert (data / ".cachebake").stat().st_uid == NONROOT_UID  # the installer ran as 65534
    log = (tmp_path / "work" / "runner.log").read_text()
    for c in ("cachebake-lib", "cachebake-fingerprint", "cachebake-install"):
        assert f"init container {c}: exited 0" in log
        assert f"container {c}: uid {NONROOT_UID} gid {NONROOT_UID}" in log and "root read-only" in log


def _add_secret(s):
    s["volumes"].append({"name": "creds", "secret": {"secretName": "x"}})
    return f"spec.volumes[{len(s['volumes']) - 1}].secret"


def _add_ports(s):
    s["containers"][0]["ports"] = [{"containerPort": 8000}]
    return "spec.containers[0].ports"


def _add_value_from(s):
    s["containers"][0]["env"].append({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    return f"spec.containers[0].env[{len(s['containers'][0]['env']) - 1}].valueFrom"


def _add_host_network(s):
    s["hostNetwork"] = True
    return "spec.hostNetwork"


@pytest.mark.parametrize("edit", [_add_secret, _add_ports, _add_value_from, _add_host_network])
def test_a_field_it_cannot_honour_is_refused_naming_it(image, bake, tmp_path, edit):
    manifest, doc = _generate(tmp_path, "--pattern", "image-volume", "--artifact", bake["pinned"], "--no-vllm-role",
                              "--bake", bake["artifact"], "--serving-image-has-cachebake", "--model-pvc", "models")
    field = edit(doc["spec"])
    manifest.write_text(yaml.safe_dump(doc))
    ref = next(v["image"]["reference"] for v in doc["spec"]["volumes"] if "image" in v)
    r = subprocess.run([sys.executable, str(RUNNER), "pod", str(manifest), "--work", str(tmp_path / "w"),
                        *_runner_args(image, bake), "--image-volume", f"{ref}={bake['artifact']}"],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and field in r.stderr, r.stderr
    assert not (tmp_path / "w" / "logs").exists()  # nothing ran


def test_a_claim_without_a_host_dir_is_refused(image, bake, tmp_path):
    manifest, _ = _generate(tmp_path, "--artifact", str(bake["artifact"]), "--installer-image", "inst:1",
                            "--model-pvc", "models", "--bake", bake["artifact"])
    r = subprocess.run([sys.executable, str(RUNNER), "pod", str(manifest), "--work", str(tmp_path / "w")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "claimName: 'models' has no --pvc models=HOSTDIR" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def cache_stage(image, bake):
    """What the Dockerfile's `cache` stage holds (its own advice without a GPU in the build:
    a cache image): a Triton-only bake installed at ROOT under an empty tree (no vllm role,
    so the serve stage's vLLM check, which needs vLLM, has nothing to check)."""
    base = image["dir"] / "cache-stage"
    compile_kernels(base / "root" / "triton")
    art = base / "artifact"
    pack_artifact([CacheRoot("triton", base / "root" / "triton")], art, target="sm_90", layer_root=ROOT)
    tree = base / "tree"
    cli("install", art, "--to", f"{tree}{ROOT}", "--serve-at", ROOT, "--target", "sm_90", "--no-sync")
    return tree


def _dockerfile(image, cache_stage, tmp_path: Path, *run: str, entrypoint: str | None = None) -> subprocess.Popen:
    tmp_path.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, str(RUNNER), "dockerfile", str(REPO / "Dockerfile"), "--work", str(tmp_path / "work"),
            "--context", str(tmp_path), "--target", "serve", "--build-arg", "BASE=vllm:1",
            # the RUN step installs cachebake as the Dockerfile does, from what pip has here (the
            # host "image" has it installed already): no wheel to build, no index to reach
            "--build-arg", "CACHEBAKE_PIP=--no-deps --no-index cachebake",
            "--stage-dir", f"cache={cache_stage}", "--base-entrypoint", '["vllm", "serve"]']
    for k, v in image["env"].items():
        args += ["--image-env", f"{k}={v}"]
    if entrypoint:
        args += ["--entrypoint", entrypoint]
    (tmp_path / "docker").mkdir(exist_ok=True)
    shutil.copy2(REPO / "docker" / "install-cachebake.sh", tmp_path / "docker" / "install-cachebake.sh")
    return subprocess.Popen([*args, "--run", *run], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_dockerfiles_serve_stage_runs_vllms_entrypoint_with_the_bake(image, bake, cache_stage, tmp_path):
    """The root Dockerfile's `serve` stage built step by step (its RUN steps in the stage's own
    filesystem, COPY --from the cache stage, ENV), then `docker run IMAGE MODEL FLAGS` with the
    vLLM image's entrypoint (`vllm serve`): the baked kernels hit, a missing one compiles."""
    proc = _dockerfile(image, cache_stage, tmp_path, str(bake["model"]), "--max-num-seqs", "8")
    pod = Pod.__new__(Pod)
    pod.work, pod.proc = tmp_path / "work", proc
    try:
        seen = json.loads(pod.until_logged("serve-run", MARKER))
        assert seen["argv"][:2] == ["serve", str(bake["model"])]
        assert seen["verify_rc"] == 0 and seen["verify"]["compiles"] == 0 and seen["verify"]["cache_hits"] == 3
        assert seen["miss_compile"]["misses"] == 1
    finally:
        out = pod.stop()
    assert proc.returncode == 0, out[-3000:]
    log = (tmp_path / "work" / "runner.log").read_text()
    assert "stage bake: not needed for serve" in log and "stage cache: given ready-made" in log
    assert "stage serving-cachebake: RUN exited 0" in log and "stage serve: RUN exited 0" in log
    assert not os.path.exists(ROOT + "/triton")  # the stages' files are the runner's, not the host's


def test_readmes_docker_run_cachebake_verify_needs_the_entrypoint_replaced(image, bake, cache_stage, tmp_path):
    """README's `docker run IMAGE cachebake verify ...` on an image FROM vLLM's (entrypoint
    `vllm serve`) runs `vllm serve cachebake verify ...`; `--entrypoint cachebake` runs verify."""
    warmup = [sys.executable, str(Path(image["env"]["CACHEBAKE_STANDIN_KERNELS"]) / "aot_kernels.py")]
    as_written = _dockerfile(image, cache_stage, tmp_path / "a", "cachebake", "verify", "--cache", ROOT, "--",
                             *warmup)
    out, _ = as_written.communicate(timeout=300)
    assert as_written.returncode == 4, out[-3000:]
    assert "no model at cachebake" in (tmp_path / "a" / "work" / "logs" / "serve-run.log").read_text()
    fixed = _dockerfile(image, cache_stage, tmp_path / "b", "verify", "--cache", ROOT, "--", *warmup,
                        entrypoint='["cachebake"]')
    out, _ = fixed.communicate(timeout=300)
    assert fixed.returncode == 0, out[-3000:]
    assert f"verified {ROOT}: 0 compiles, 3 cache hits" in (tmp_path / "b" / "work" / "logs" / "serve-run.log").read_text()
