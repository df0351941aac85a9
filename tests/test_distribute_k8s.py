"""`cachebake k8s`: both patterns checked against the Kubernetes 1.35 schema (kubernetes-validate,
offline), and the init-container Pod run for real by `podman kube play`: the installer pulls
the bake from the registry into an emptyDir, checked against the serving image's fingerprint,
and the server container verifies it with 0 compiles.

The image-volume Pod cannot run here: podman 4.3's kube play knows hostPath, configMap,
emptyDir and persistentVolumeClaim volumes only ("HostPath, ConfigMap, EmptyDir, and
PersistentVolumeClaim are currently the only supported VolumeSource").  So its vllm-role copy
is played with the bake image's tree (the pushed layer, unpacked) as a read-only hostPath in
place of the image volume, and the role's emptyDir as a hostPath directory made as the kubelet
makes an emptyDir (root's, mode 0777; podman would chown its own emptyDir to the first
container's user, which hides what a non-root copy may not do on Kubernetes).  The copy
container, the mount inside the read-only mount, and what the server then reads and writes are
real; the image volume and the kubelet are not."""

import errno
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from containerkit import (ROOT, WARMUP, cachebake_wheel, cli, container_artifact, dockerfile_context,  # noqa: F401
                          engines, installer_image, serving_cachebake, standin_server, verify_json)
from installkit import REPO

from cachebake.artifact.pack import CacheRoot, pack_artifact
from cachebake.distribute.k8s import NONROOT_UID, VLLM_EMPTY_ROOT, PodPlan, manifest
from cachebake.errors import BadInput, ExitCode
from cachebake.serve.command import comment, one_line

REF = "docker://reg.example/bakes/nemotron:sm_90"
PINNED = "docker://reg.example/bakes/nemotron@sha256:" + "b" * 64


def _pod(doc):
    return doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]


def _k8s(*args) -> dict:
    return yaml.safe_load(cli("k8s", *args).stdout)


# The init pattern as README writes it: the recipe served from a claim holding the model.
INIT = ["--artifact", REF, "--serving-image", "vllm:1", "--installer-image", "inst:1", "--target", "sm_90",
        "--model", "nemotron-h", "--model-pvc", "models"]
# The image-volume pattern: cachebake copied onto the server's PYTHONPATH by the installer image.
VOLUME = ["--artifact", PINNED, "--serving-image", "vllm:1", "--pattern", "image-volume", "--installer-image",
          "inst:1", "--target", "sm_90", "--model", "nemotron-h", "--model-pvc", "models"]
MODEL_PATH = "/models/nemotron-h-8b"  # the nemotron-h recipe's model directory


def _env_of(container) -> dict:
    return {e["name"]: e["value"] for e in container["env"]}


def test_init_pattern_installs_for_the_server_path_with_the_serving_fingerprint():
    pod = _pod(_k8s(*INIT))
    lib, fp, install = pod["initContainers"]
    assert fp["image"] == "vllm:1" and install["image"] == lib["image"] == "inst:1"
    assert install["args"][:2] == ["install", REF] and install["args"][-1] == "--no-sync"
    args = dict(zip(install["args"][2:-1:2], install["args"][3:-1:2]))
    assert args == {"--to": "/cachebake", "--serve-at": ROOT, "--target": "sm_90",
                    "--fingerprint": "/cachebake-fingerprint/fingerprint.json"}
    for c in pod["initContainers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] and sc["runAsUser"] == NONROOT_UID and sc["readOnlyRootFilesystem"]
        assert sc["capabilities"] == {"drop": ["ALL"]} and not sc["allowPrivilegeEscalation"]
    assert {"name": "PYTHONPATH", "value": "/cachebake-lib"} in fp["env"]
    (server,) = pod["containers"]
    assert server["command"][:3] == ["vllm", "serve", MODEL_PATH]
    assert {"name": "cachebake", "mountPath": ROOT} in server["volumeMounts"]
    assert {"name": "TRITON_CACHE_DIR", "value": f"{ROOT}/triton"} in server["env"]
    assert {"name": "cachebake", "emptyDir": {}} in pod["volumes"]
    # the model `vllm serve` reads, from the claim, read-only at that path
    assert {"name": "model", "mountPath": MODEL_PATH, "readOnly": True} in server["volumeMounts"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]


def test_init_in_the_serving_image_needs_no_fingerprint_file():
    pod = _pod(_k8s("--artifact", REF, "--serving-image", "vllm:1", "--install-in-serving-image",
                    "--target", "sm_90", "--pull-secret", "regcred", "--model", "nemotron-h",
                    "--model-in-image"))
    (install,) = pod["initContainers"]
    assert install["image"] == "vllm:1" and install["command"][:3] == ["cachebake", "install", REF]
    assert "--fingerprint" not in install["command"]
    assert install["command"][-3:] == ["--authfile", "/cachebake-auth/config.json", "--no-sync"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    (server,) = pod["containers"]  # the image has the model: nothing mounted at its path
    assert server["command"][2] == MODEL_PATH and not any(v["name"] == "model" for v in pod["volumes"])


def test_image_volume_pattern_mounts_the_bake_read_only_with_an_overlay():
    r = cli("k8s", *VOLUME)
    pod = _pod(yaml.safe_load(r.stdout))
    cache, vllm, overlay, lib, scratch, tmp, model = pod["volumes"]
    assert scratch == {"name": "cachebake-scratch", "emptyDir": {}} and tmp == {"name": "server-tmp", "emptyDir": {}}
    assert cache == {"name": "cachebake", "image": {"reference": PINNED.split("://")[1],
                                                    "pullPolicy": "IfNotPresent"}}
    assert vllm == {"name": "cachebake-vllm", "emptyDir": {}}
    assert overlay == {"name": "cachebake-overlay", "emptyDir": {}}
    assert lib["name"] == "cachebake-lib" and model["name"] == "model"
    (server,) = pod["containers"]
    # The bake read-only at ROOT, the vllm role's writable copy mounted inside it, after it.
    assert server["volumeMounts"][:2] == [{"name": "cachebake", "mountPath": ROOT, "readOnly": True},
                                          {"name": "cachebake-vllm", "mountPath": f"{ROOT}/vllm"}]
    env = _env_of(server)
    assert env["CACHEBAKE_OVERLAY_DIR"] == "/var/cache/cachebake-overlay/cachebake"  # the server's 0700 dir
    assert env["VLLM_CACHE_ROOT"] == f"{ROOT}/vllm" and env["TRITON_CACHE_DIR"] == f"{ROOT}/triton"
    # The manager TRITON_CACHE_MANAGER names is importable: cachebake copied onto PYTHONPATH
    assert env["TRITON_CACHE_MANAGER"] == "cachebake.serve.layered:LayeredCacheManager"
    assert env["PYTHONPATH"] == "/cachebake-lib"
    assert {"name": "cachebake-lib", "mountPath": "/cachebake-lib", "readOnly": True} in server["volumeMounts"]
    copy, lib_copy, miss_log = pod["initContainers"]
    assert lib_copy["image"] == "inst:1" and lib_copy["command"][-2:] == ["--copy-package", "/cachebake-lib"]
    # Filled by cp -a in the serving image, from the image mounted read-only elsewhere.
    assert copy["image"] == "vllm:1"
    assert copy["command"] == ["find", "/cachebake-image/vllm", "-mindepth", "1", "-maxdepth", "1",
                               "-exec", "cp", "-a", "{}", "/cachebake-vllm/", ";"]
    assert copy["volumeMounts"] == [{"name": "cachebake", "mountPath": "/cachebake-image", "readOnly": True},
                                    {"name": "cachebake-vllm", "mountPath": "/cachebake-vllm"}]
    # The miss log streamed to the Pod's logs by a native sidecar (README, "Serving")
    assert miss_log["name"] == "miss-log" and miss_log["restartPolicy"] == "Always"
    assert miss_log["command"] == ["tail", "-n", "+1", "-F", env["CACHEBAKE_MISS_LOG"]]
    assert env["CACHEBAKE_MISS_LOG"] == "/var/cache/cachebake-overlay/cachebake/misses.jsonl"
    assert miss_log["volumeMounts"] == [{"name": "cachebake-overlay", "mountPath": "/var/cache/cachebake-overlay",
                                         "readOnly": True}]
    for c in pod["initContainers"]:
        sc = c["securityContext"]
        # the miss-log sidecar as the server's uid, who alone may read its 0700 overlay: since
        # issue 30 the server runs as NONROOT_UID explicitly (vLLM's image user is root)
        assert sc["runAsNonRoot"] and sc["runAsUser"] == NONROOT_UID and sc["readOnlyRootFilesystem"]
        assert sc["capabilities"] == {"drop": ["ALL"]} and not sc["allowPrivilegeEscalation"]
    assert server["securityContext"] == miss_log["securityContext"]
    assert "assumed the bake has a vllm role" in r.stderr and "PYTHONPATH" in r.stderr


def test_image_volume_with_cachebake_in_the_serving_image_copies_nothing_onto_pythonpath():
    args = [a for a in VOLUME if a not in ("--installer-image", "inst:1")]
    pod = _pod(_k8s(*args, "--serving-image-has-cachebake"))
    (server,) = pod["containers"]
    assert "PYTHONPATH" not in _env_of(server)
    assert [c["name"] for c in pod["initContainers"]] == ["cachebake-vllm-copy", "miss-log"]
    assert not any(v["name"] == "cachebake-lib" for v in pod["volumes"])


def test_image_volume_without_a_vllm_role_gets_an_empty_writable_vllm_root():
    pod = _pod(_k8s(*VOLUME, "--no-vllm-role"))
    (server,) = pod["containers"]
    assert [c["name"] for c in pod["initContainers"]] == ["cachebake-lib", "miss-log"]
    assert {"name": "cachebake-vllm", "mountPath": VLLM_EMPTY_ROOT} in server["volumeMounts"]
    assert not any(m["mountPath"].startswith(ROOT + "/") for m in server["volumeMounts"])
    assert {"name": "VLLM_CACHE_ROOT", "value": VLLM_EMPTY_ROOT} in server["env"]


def test_refusals_are_one_line():
    with pytest.raises(BadInput, match="registry reference"):
        manifest(PodPlan(artifact="/local", serving_image="v", pattern="image-volume", target="sm_90",
                         command=["x"], serving_image_has_cachebake=True))
    with pytest.raises(BadInput, match="installer-image"):
        manifest(PodPlan(artifact=REF, serving_image="v", target="sm_90", command=["x"]))
    r = cli("k8s", "--artifact", REF, "--serving-image", "v", "--target", "sm_90", "--model", "m", "--", "x",
            check=False)
    assert r.returncode == ExitCode.USAGE and r.stderr.count("\n") == 1


def _without(args, *options):
    """``args`` without the given options (and the value of each that takes one)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in options:
            skip = a not in ("--model-in-image", "--serving-image-has-cachebake", "--install-in-serving-image")
        else:
            out.append(a)
    return out


@pytest.mark.parametrize("args, says", [
    # the server needs a command: the serving image's entrypoint is not one
    (_without(INIT, "--model", "--model-pvc"), "the server needs a command"),
    # `vllm serve PATH` with nothing at PATH
    (_without(INIT, "--model-pvc"), "give --model-pvc CLAIM"),
    ([*INIT, "--model-in-image"], "not both"),
    ([*_without(INIT, "--model"), "--", "python3", "-m", "server"], "serves no model directory"),
    # image-volume: the layered manager must be importable in the server
    (_without(VOLUME, "--installer-image"), "give --installer-image IMG"),
    ([*VOLUME, "--serving-image-has-cachebake"], "one of them"),
    ([*VOLUME, "--install-in-serving-image"], "is for --pattern init"),
    ([*INIT, "--serving-image-has-cachebake"], "is for --pattern image-volume"),
    ([*INIT, "--model-pvc", "Models_"], "PersistentVolumeClaim name"),
])
def test_a_manifest_that_could_not_run_as_written_is_refused_naming_what_to_give(args, says):
    r = cli("k8s", *args, check=False)
    assert r.returncode == ExitCode.USAGE, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


# What the server and its libraries write at import or at start, by the variable that places
# it, and where it goes when the variable is unset ("~": HOME).  The issue-30 crash: torch's
# _dynamo/package.py makes TORCHINDUCTOR_CACHE_DIR at import, and the manifest pointed it into the
# read-only image volume (vllm034.md section 4: VLLM_CACHE_ROOT's dummy_cache at every start,
# FlashInfer's JIT workspace, the overlay, /tmp's IPC sockets, HOME's ~/.cache and ~/.triton).
WRITTEN_AT_START = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_nobody", "VLLM_CACHE_ROOT": "~/.cache/vllm",
                    "FLASHINFER_WORKSPACE_BASE": "~", "CACHEBAKE_OVERLAY_DIR": None, "TMPDIR": "/tmp",
                    "VLLM_RPC_BASE_PATH": "/tmp", "XDG_CACHE_HOME": "~/.cache", "TRITON_HOME": "~",
                    "HOME": "/nonexistent"}  # nobody's HOME in Debian's passwd


def _writable(pod: dict, container: dict, path: str) -> bool:
    """Whether ``path`` lands on something ``container`` may write: the deepest mount holding it
    is an emptyDir (or a claim) mounted read-write; outside every mount, the root filesystem,
    which must not be read-only."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = [m for m in container.get("volumeMounts", [])
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    if not mounts:
        return not container.get("securityContext", {}).get("readOnlyRootFilesystem", False)
    deepest = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = volumes[deepest["name"]]
    return not deepest.get("readOnly") and ("emptyDir" in volume or "persistentVolumeClaim" in volume)


def _unwritable_paths(pod: dict) -> list[str]:
    (server,) = pod["containers"]
    env = _env_of(server)
    home = env.get("HOME", WRITTEN_AT_START["HOME"])
    bad = []
    for name, default in WRITTEN_AT_START.items():
        value = env.get(name, default)
        if value is None:
            continue
        value = home + value[1:] if value.startswith("~") else value
        if not _writable(pod, server, value):
            bad.append(f"{name}={value}")
    return bad


@pytest.mark.parametrize("pattern", ["init", "image-volume"])
@pytest.mark.parametrize("source", ["bake", "recipe"])
def test_every_path_the_server_writes_at_start_is_writable(pattern, source, triton_cache, tmp_path):
    art, pinned = _vllm_bake(triton_cache, tmp_path)
    base = [*_without(INIT if pattern == "init" else VOLUME, "--model", "--artifact"), "--artifact", pinned]
    base += ["--bake", str(art)] if source == "bake" else ["--model", "nemotron-h"]
    pod = _pod(_k8s(*base))
    assert _unwritable_paths(pod) == []
    (server,) = pod["containers"]
    # ... on the hardened server an operator wants: every written path an emptyDir, not root
    assert server["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": NONROOT_UID, "runAsGroup": NONROOT_UID,
        "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    # the roles' variables the bake baked with, where the server finds them; Triton's role
    # stays on the read-only image (misses go to the overlay), the vllm role is a writable copy
    env = _env_of(server)
    assert env["TRITON_CACHE_DIR"] == f"{ROOT}/triton"
    if source == "recipe":
        assert env["VLLM_CACHE_ROOT"] == f"{ROOT}/vllm"
    elif pattern == "init":  # this bake holds only the triton role: vLLM's default, in HOME
        assert "VLLM_CACHE_ROOT" not in env
    else:  # ... and the image has no vllm/ to mount the copy over: an empty writable root
        assert env["VLLM_CACHE_ROOT"] == VLLM_EMPTY_ROOT
        assert "cachebake-vllm-copy" not in [c["name"] for c in pod["initContainers"]]


def test_the_walk_finds_the_issue_30_crash(triton_cache, tmp_path):
    # the image-volume Pod as main wrote it: TORCHINDUCTOR_CACHE_DIR and FLASHINFER_WORKSPACE_BASE
    # in the read-only image volume, the server's root filesystem and HOME left as the image's
    pod = _pod(_k8s(*VOLUME))
    (server,) = pod["containers"]
    for e in server["env"]:
        if e["name"] in ("TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
            e["value"] = f"{ROOT}/{'inductor' if e['name'].startswith('TORCH') else 'flashinfer'}"
    assert _unwritable_paths(pod) == [f"TORCHINDUCTOR_CACHE_DIR={ROOT}/inductor",
                                      f"FLASHINFER_WORKSPACE_BASE={ROOT}/flashinfer"]
    server["env"] = [e for e in server["env"] if e["name"] != "HOME"]
    server["volumeMounts"] = [m for m in server["volumeMounts"] if m["mountPath"] != "/tmp"]
    assert "TMPDIR=/tmp" in _unwritable_paths(pod) and "HOME=/nonexistent" in _unwritable_paths(pod)


@pytest.mark.parametrize("model_path", ["/", "/usr", "/var/run/secrets/kubernetes.io/serviceaccount", ROOT,
                                        f"{ROOT}/vllm", "/var/cache/cachebake-scratch", "/tmp/m", "/models/../etc",
                                        "/models//m", "/models/m/", "/modelsx/m"])
def test_an_artifact_never_chooses_where_a_volume_is_mounted(model_path, triton_cache, tmp_path):
    art, pinned = _vllm_bake(triton_cache, tmp_path, model_path=model_path)
    base = [*_without(INIT, "--model", "--artifact"), "--artifact", pinned, "--bake", str(art)]
    r = cli("k8s", *base, check=False)
    assert r.returncode == ExitCode.CORRUPT, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "bake.model.path" in r.stderr, r.stderr


def test_model_mount_allows_a_dir_of_the_users_and_nothing_around_the_pods_mounts(triton_cache, tmp_path):
    art, pinned = _vllm_bake(triton_cache, tmp_path, model_path="/data/models/m")
    base = [*_without(INIT, "--model", "--artifact"), "--artifact", pinned, "--bake", str(art)]
    assert cli("k8s", *base, check=False).returncode == ExitCode.CORRUPT
    pod = _pod(_k8s(*base, "--model-mount", "/data"))
    (server,) = pod["containers"]
    assert {"name": "model", "mountPath": "/data/models/m", "readOnly": True} in server["volumeMounts"]
    # the user's own command: a usage error, still one line
    r = cli("k8s", *_without(INIT, "--model"), "--", "vllm", "serve", "/usr/lib", check=False)
    assert r.returncode == ExitCode.USAGE and r.stderr.count("\n") == 1 and "/usr/lib" in r.stderr
    r = cli("k8s", *_without(INIT, "--model"), "--model-mount", "/", "--", "vllm", "serve", ROOT, check=False)
    assert r.returncode == ExitCode.USAGE and "where the Pod mounts cachebake" in r.stderr


def test_kernel_knobs_and_identity_variables_never_reach_a_pod(triton_cache, tmp_path):
    art = tmp_path / "evil"
    for section in ({"serve_env": {"VLLM_TEST_FORCE_LOAD_FORMAT": "dummy"}},
                    {"compile_identity": {"env_factors": {"VLLM_CACHE_ROOT": "/evil"},
                                          "path_factors": {"VLLM_CACHE_ROOT": "/evil"}}}):
        shutil.rmtree(art, ignore_errors=True)
        bake = {"driver": "vllm", "model": {"path": "/models/m"}, "serve_args": {}, **section}
        report = pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90", bake=bake, layer_root=ROOT)
        base = [*_without(VOLUME, "--model", "--artifact"), "--bake", str(art),
                "--artifact", f"docker://reg.example/b@{report.manifest_digest}"]
        r = cli("k8s", *base, check=False)
        assert "/evil" not in r.stdout and "VLLM_TEST_FORCE_LOAD_FORMAT" not in r.stdout
        if "serve_env" in section:  # refused, one line
            assert r.returncode == ExitCode.CORRUPT and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        else:  # this bake has no vllm role: its identity is not the server's to match at all;
            # with one, the identity route refuses (test_install_environment.py)
            assert r.returncode == 0 and f"{ROOT}/vllm" not in r.stdout


def test_a_name_cachebake_uses_for_its_own_containers_is_refused():
    r = cli("k8s", *INIT, "--name", "miss-log", check=False)
    assert r.returncode == ExitCode.BAD_INPUT and "a container cachebake adds" in r.stderr


def _vllm_bake(triton_cache, tmp_path, layer_root=ROOT, model_path="/models/served-here") -> tuple[Path, str]:
    """A bake whose section is what the vllm driver records (model path, serve args, the env it
    ran with): what `serve-args` prints a command from; and the reference pinned to it."""
    art = tmp_path / "vllm-bake"
    bake = {"driver": "vllm", "model": {"path": model_path},
            "serve_args": {"max_num_seqs": 8, "enable_prefix_caching": True},
            "serve_env": {"VLLM_USE_V2_MODEL_RUNNER": "1"},
            "env": {"root": ROOT, "invalidating_env_vars": {"TRITON_DEFAULT_FP_FUSION": "0"}}}
    report = pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90", bake=bake,
                           layer_root=layer_root)
    return art, f"docker://reg.example/bakes/nemotron@{report.manifest_digest}"


@pytest.mark.parametrize("pattern", ["init", "image-volume"])
def test_the_server_runs_the_bakes_own_command_and_environment(pattern, triton_cache, tmp_path):
    from cachebake.serve.command import read_manifest, serve_command

    art, pinned = _vllm_bake(triton_cache, tmp_path)
    base = [*_without(INIT if pattern == "init" else VOLUME, "--model", "--artifact"), "--artifact", pinned]
    r = cli("k8s", *base, "--bake", art)
    pod = _pod(yaml.safe_load(r.stdout))
    (server,) = pod["containers"]
    expected = serve_command(read_manifest(str(art), "sm_90"), root=ROOT)
    assert server["command"] == expected.argv
    assert expected.argv[:3] == ["vllm", "serve", "/models/served-here"]
    assert {"--max-num-seqs", "8", "--enable-prefix-caching"} <= set(expected.argv[3:])
    env = _env_of(server)
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1" and env["TRITON_DEFAULT_FP_FUSION"] == "0"
    assert {k: env[k] for k in expected.env} == expected.env  # what serve-args prints, exactly
    assert {"name": "model", "mountPath": "/models/served-here", "readOnly": True} in server["volumeMounts"]
    assert "recipe" not in r.stderr
    # --model beside a bake that names its own
    both = cli("k8s", *base, "--bake", art, "--model", "nemotron-h", check=False)
    assert both.returncode == ExitCode.USAGE and "not both" in both.stderr


@pytest.mark.parametrize("pattern", ["init", "image-volume"])
@pytest.mark.parametrize("driver, serve_args", [
    ("vllm", {"trust_remote_code": True}), ("vllm", {"download_dir": "/tmp/evil"}),
    ("vllm", {"hf_overrides": {"architectures": ["Evil"]}}),
    ("kernels", {"tokenizer": "/tmp/evil"}),
])
def test_a_bakes_serve_args_off_the_allowlist_never_reach_the_pod(pattern, driver, serve_args, triton_cache,
                                                                  tmp_path):
    """The Pod's server command is made of the artifact's serve args: one off the allowlist
    (serveargs.SERVE_ARG_KINDS) is refused, exit 6, naming it; no manifest is written."""
    from test_serve_command import _kernels_bake_section

    if driver == "vllm":
        bake = {"driver": "vllm", "model": {"path": "/models/served-here"},
                "serve_args": {"max_num_seqs": 8, **serve_args}}
        extra = []
    else:
        bake = _kernels_bake_section()
        bake["plan"]["serve_args"] = {**bake["plan"]["serve_args"], **serve_args}
        extra = ["--model", "nemotron-h"]
    art = tmp_path / "art"
    report = pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90", bake=bake,
                           layer_root=ROOT)
    pinned = f"docker://reg.example/bakes/nemotron@{report.manifest_digest}"
    base = [*_without(INIT if pattern == "init" else VOLUME, "--model", "--artifact"), "--artifact", pinned]
    r = cli("k8s", *base, "--bake", art, *extra, check=False)
    flag = "--" + next(iter(serve_args)).replace("_", "-")
    assert r.returncode == ExitCode.UNSAFE and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and f"{flag} is not one an artifact" in r.stderr


def test_an_image_volume_of_a_bake_packed_for_another_root_is_refused(triton_cache, tmp_path):
    art, pinned = _vllm_bake(triton_cache, tmp_path, layer_root="/srv/elsewhere")
    r = cli("k8s", *_without(VOLUME, "--model", "--artifact"), "--artifact", pinned, "--bake", art, check=False)
    assert r.returncode == ExitCode.BAD_INPUT and "--root /srv/elsewhere" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1


def test_without_pyyaml_the_manifest_is_json_kubectl_reads(tmp_path):
    shadow = tmp_path / "shadow"
    (shadow / "yaml").mkdir(parents=True)
    (shadow / "yaml" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'yaml'\", name='yaml')\n")
    r = cli("k8s", *INIT, PYTHONPATH=f"{shadow}{os.pathsep}{REPO}")
    assert json.loads(r.stdout) == _k8s(*INIT)
    assert "PyYAML is not installed: wrote the manifest as JSON" in r.stderr
    asked = cli("k8s", *INIT, "--format", "yaml", check=False, PYTHONPATH=f"{shadow}{os.pathsep}{REPO}")
    assert asked.returncode == ExitCode.UNSUPPORTED and "cachebake[k8s]" in asked.stderr


# ------------------------------------------------------------- hostile text in the manifest
# What an attacker would put in a value that reaches the YAML: a line break that ends a comment
# and starts a document, quotes, shell and YAML syntax, terminal escapes, and the line breaks
# YAML knows beyond \n (NEL, U+2028), which PyYAML's reader would also take as ending a comment.
EXTRA_POD = ("\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: evil}\nspec: {containers: "
             "[{name: x, image: evil, securityContext: {privileged: true}}]}\n")
HOSTILE = [EXTRA_POD, "/models/m\n# note\n---\n", "'\"; $(touch /tmp/pwned) `id` \\", "\x1b]0;t\x07\x1b[2J",
           "\x85kind: Pod", "\u2028kind: Pod\u2029", "- item", "key: value", "&a *a !!python/object:os.system",
           "|\n  literal", "\r\nCRLF", "\x01\x7f\x9b[31m"]  # (no NUL: no argv can hold one)


def _hostile_plan(text, kind="pod"):
    return PodPlan(artifact=f"/bakes/art{text}", serving_image="vllm:1", installer_image="i:1",
                   target="sm_90", kind=kind, command=["vllm", "serve", f"/models{text}", "--x", text],
                   model_in_image=True)


@pytest.mark.parametrize("kind", ["pod", "deployment"])
@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_text_parses_back_to_exactly_the_one_document_built(text, kind, tmp_path):
    """A newline in the model path (a note) and in every value the user or a recipe gives:
    one document, equal to the one built, every comment one line, nothing from the text
    outside a string."""
    plan = _hostile_plan(text, kind)
    r = cli("k8s", "--kind", kind, "--artifact", plan.artifact, "--serving-image", "vllm:1",
            "--installer-image", "i:1", "--target", "sm_90", "--model-in-image", "--", *plan.command,
            check=False)
    assert r.returncode == 0, r.stderr
    expected, notes = manifest(plan)
    docs = list(yaml.safe_load_all(r.stdout))
    assert docs == [expected]
    assert _pod(docs[0])["containers"][0]["command"] == plan.command
    assert _pod(docs[0])["initContainers"][-1]["args"][1] == plan.artifact
    comments = [ln for ln in r.stdout.splitlines() if ln.startswith("#")]
    assert comments == [comment(n) for n in notes] and f"model from /models{one_line(text)}" in comments[-1]
    assert all(0x20 <= ord(ch) < 0x7f for ch in r.stdout.replace("\n", ""))  # printable ASCII only
    note_lines = [ln for ln in r.stderr.splitlines() if ln.startswith("cachebake: note:")]
    assert len(note_lines) == len(r.stderr.splitlines()) == len(notes)  # one line each on stderr too
    assert "\x1b" not in r.stderr
    json_text = cli("k8s", "--format", "json", "--kind", kind, "--artifact", plan.artifact,
                    "--serving-image", "vllm:1", "--installer-image", "i:1", "--target", "sm_90",
                    "--model-in-image", "--", *plan.command).stdout
    assert json.loads(json_text) == expected
    if text == EXTRA_POD:  # still one valid Pod/Deployment for the API server's own schema
        path = tmp_path / "m.yaml"
        path.write_text(r.stdout)
        v = _validate(path)
        assert v.returncode == 0, v.stdout + v.stderr


def test_a_note_is_one_comment_line_whatever_its_text():
    from cachebake.distribute.k8s import render

    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    notes = [*HOSTILE, "\x00"]
    text = render(doc, notes)
    head = text.splitlines()[:len(notes)]
    assert all(ln.startswith("# ") for ln in head)
    assert list(yaml.safe_load_all(text)) == [doc]
    assert "\\n---\\napiVersion" in head[0]  # the newline shown as an escape, not taken


@pytest.mark.parametrize("option, value", [
    ("--root", "/var/cache/cachebake\n---\nkind: Pod"), ("--root", "/var/cache/\x1b[2J"),
    ("--name", "vllm\n---"), ("--name", "Vllm"), ("--name", "v" * 64), ("--serving-image", "vllm:1\n---"),
    ("--serving-image", "vllm 1"), ("--installer-image", "$(id)"), ("--pull-secret", "reg\ncred"),
    ("--pull-secret", "Reg_Cred"), ("--tmp-size", "2Gi\n"), ("--tmp-size", "lots")])
def test_a_value_kubernetes_cannot_take_is_a_usage_error_naming_the_option(option, value):
    args = {"--artifact": REF, "--serving-image": "vllm:1", "--installer-image": "i:1", "--target": "sm_90",
            "--model": "nemotron-h", "--model-pvc": "models", option: value}
    r = cli("k8s", *[x for kv in args.items() for x in kv], check=False)
    assert r.returncode == ExitCode.USAGE, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1 and option in r.stderr
    assert "\x1b" not in r.stderr and "Traceback" not in r.stderr


def test_the_python_api_refuses_what_the_cli_refuses():
    for change in ({"name": "a\nb"}, {"serving_image": "v\n---"}, {"root": "/r\n"}, {"root": "rel"},
                   {"pull_secret": "A"}, {"tmp_size": "1 Gi"}):
        plan = PodPlan(**{"artifact": REF, "serving_image": "v", "installer_image": "i", "target": "sm_90",
                          "command": ["x"], **change})
        with pytest.raises(BadInput):
            manifest(plan)


def _tmp_volume(pod):
    return next(v for v in pod["volumes"] if v["name"] == "cachebake-tmp")


def test_the_init_pods_tmp_has_a_size_limit(tmp_path, triton_cache):
    base = ["--artifact", REF, "--serving-image", "vllm:1", "--installer-image", "i:1", "--target", "sm_90",
            "--model", "nemotron-h", "--model-in-image"]
    r = cli("k8s", *base)
    assert _tmp_volume(_pod(yaml.safe_load(r.stdout))) == {"name": "cachebake-tmp", "emptyDir": {"sizeLimit": "2Gi"}}
    assert "limited to 2Gi, the default" in r.stderr
    r = cli("k8s", *base, "--tmp-size", "512Mi")
    assert _tmp_volume(_pod(yaml.safe_load(r.stdout)))["emptyDir"] == {"sizeLimit": "512Mi"}
    assert "the default" not in r.stderr
    # from a local copy of the bake: its manifest, config and layer blobs, plus the margin
    art = tmp_path / "art"
    report = pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90")
    blobs = sum(p.stat().st_size for p in (art / "blobs" / "sha256").iterdir())  # one image: 3 blobs
    want = f"{-(-(blobs + (64 << 20)) // (1 << 20))}Mi"
    pinned = f"docker://reg.example/bakes/nemotron@{report.manifest_digest}"
    for ref in (REF, pinned):
        r = cli("k8s", *base[2:], "--artifact", ref, "--bake", art)
        assert _tmp_volume(_pod(yaml.safe_load(r.stdout)))["emptyDir"] == {"sizeLimit": want}
    # a local copy that is not the image the reference pins says nothing about it
    r = cli("k8s", *base[2:], "--artifact", PINNED, "--bake", art, check=False)
    assert r.returncode == ExitCode.BAD_INPUT and "--bake" in r.stderr and r.stderr.count("\n") == 1


def _validate(path, version="1.35.0"):
    exe = shutil.which("kubernetes-validate")
    if not exe:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate; .ci/containers.sh does)")
    return subprocess.run([exe, "-k", version, "--strict", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("pattern, kind, extra", [
    ("init", "deployment", []), ("init", "pod", []), ("image-volume", "deployment", []),
    ("image-volume", "pod", []), ("image-volume", "deployment", ["--no-vllm-role"]),
    ("image-volume", "pod", ["--serving-image-has-cachebake"])])
def test_manifests_pass_the_kubernetes_1_35_schema(pattern, kind, extra, tmp_path):
    path = tmp_path / "m.yaml"
    installer = [] if "--serving-image-has-cachebake" in extra else ["--installer-image", "i:1"]
    path.write_text(cli("k8s", "--artifact", PINNED, "--serving-image", "vllm:1", *installer,
                        "--pattern", pattern, "--kind", kind, "--target", "sm_90", "--model", "nemotron-h",
                        "--model-pvc", "models", "--pull-secret", "regcred", *extra).stdout)
    r = _validate(path)
    assert r.returncode == 0, r.stdout + r.stderr
    if pattern == "image-volume":  # volumes[].image is not in older schemas
        assert _validate(path, "1.30.0").returncode != 0


def _podman(engines, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*engines.podman, *map(str, args)], capture_output=True, text=True, **kw)


def _volume(engines, name) -> Path:
    return Path(_podman(engines, "volume", "inspect", name, "--format", "{{.Mountpoint}}").stdout.strip())


def _until_logged(engines, container: str, marker: str, timeout: float = 300) -> str:
    """The log line starting with ``marker`` of a container that stays up (a server), waiting
    for it; fails with its logs if the container exits first or nothing comes in time."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        logs = _podman(engines, "logs", container)
        for line in logs.stdout.splitlines():
            if line.startswith(marker):
                return line[len(marker):]
        state = json.loads(_podman(engines, "inspect", container).stdout or "[{}]")[0].get("State", {})
        if state.get("Status") == "exited" and state.get("ExitCode"):
            raise AssertionError(f"{container} exited {state['ExitCode']}: {logs.stdout[-2000:]}{logs.stderr[-2000:]}")
        assert time.monotonic() < deadline, f"{container}: nothing logged: {logs.stdout[-2000:]}{logs.stderr[-2000:]}"
        time.sleep(1)


@pytest.mark.containers
@pytest.mark.slow
@pytest.mark.parametrize("installer", ["installer-image", "serving-image"])
def test_podman_plays_the_init_pod_as_written_and_the_server_starts_with_no_compile(
        engines, container_artifact, installer_image, standin_server, installer, tmp_path):
    """The Pod exactly as `cachebake k8s` writes it (README's command: the recipe's `vllm serve`,
    the model from a claim, the bake's sizes from --bake), played by podman: the installer pulls
    the bake from the registry, checked against the serving image's fingerprint; the server's
    `vllm serve` is the stand-in (tests/kit/standin_vllm.py), which finds the model at its path and
    verifies the cache there with 0 compiles.  Only podman's own flags differ from kubectl's:
    the network (the registry is on this namespace's loopback) and plain-HTTP pulls; and two
    podman 4.3 limits: the miss-log sidecar plays as a regular container (no native sidecars),
    and the Pod's restartPolicy is Never (init containers under Always are never removed)."""
    if not engines.podman:
        pytest.skip("podman is not set up (CACHEBAKE_TEST_PODMAN): .ci/containers.sh does")
    if not engines.private_netns:
        pytest.skip("the Pod reaches the registry through the host network of a private network "
                    "namespace: run under .ci/containers.sh")
    ref = json.loads(cli("push", container_artifact, f"docker://{engines.registry}/bakes/pod",
                         "--json").stdout)["pushed"][0]["pinned"]
    for image in (installer_image, standin_server):
        engines.docker("push", image)
    how = (["--installer-image", installer_image] if installer == "installer-image"
           else ["--install-in-serving-image"])
    text = cli("k8s", "--kind", "pod", "--name", "cbpod", "--artifact", ref, "--serving-image", standin_server,
               *how, "--target", "sm_90", "--gpus", "0", "--model", "nemotron-h", "--model-pvc", "cbmodel",
               "--bake", container_artifact).stdout
    path = tmp_path / "pod.yaml"
    doc = yaml.safe_load(text)
    # podman 4.3 has no native sidecars (KEP-753): it runs every init container to completion,
    # and the miss-log sidecar's `tail -F` never completes.  It plays as a regular container of
    # the Pod; everything else as written.
    sidecars = [c for c in doc["spec"]["initContainers"] if c.get("restartPolicy") == "Always"]
    for c in sidecars:
        doc["spec"]["initContainers"].remove(c)
        del c["restartPolicy"]
        doc["spec"]["containers"].append(c)
    # podman 4.3 runs init containers under the Pod's restartPolicy (Always, a Pod's default)
    # and then fails to remove them ("cannot remove container ... as it is running"): Never
    # for the play, as the other podman tests here do.
    doc["spec"]["restartPolicy"] = "Never"
    path.write_text(yaml.safe_dump(doc))
    volumes = [v["name"] for v in doc["spec"]["volumes"] if "emptyDir" in v]
    _podman(engines, "pod", "rm", "-f", "cbpod")
    _podman(engines, "volume", "rm", "-f", "cbmodel", *volumes)
    # The claim: podman plays a persistentVolumeClaim as the named volume; the model is there.
    assert _podman(engines, "volume", "create", "cbmodel").returncode == 0
    config = {"architectures": ["NemotronHForCausalLM"], "stand_in": True}
    (_volume(engines, "cbmodel") / "config.json").write_text(json.dumps(config))
    try:
        play = _podman(engines, "kube", "play", "--network", "host", "--tls-verify=false", path, timeout=600)
        assert play.returncode == 0, play.stderr[-3000:]
        seen = json.loads(_until_logged(engines, "cbpod-cbpod", "STAND-IN-SERVER "))
        assert seen["argv"] == doc["spec"]["containers"][0]["command"][1:]
        assert seen["argv"][1] == MODEL_PATH and seen["model_config"] == config
        assert seen["model_writable"] is False  # the claim is mounted read-only
        assert seen["verify_rc"] == 0, seen["verify"]
        report = seen["verify"]
        assert report["ok"] and report["compiles"] == 0 and report["cache_hits"] == 3
        data = _volume(engines, "cachebake")
        marker = json.loads((data / ".cachebake" / "current" / "install.json").read_text())
        assert marker["serve_at"] == ROOT  # installed at /cachebake, group files for the server
        assert data.stat().st_uid == NONROOT_UID  # the installer ran as 65534
        if installer == "installer-image":
            fingerprint = json.loads((_volume(engines, "cachebake-fingerprint") / "fingerprint.json").read_text())
            # taken in the serving image (the installer has no Triton, so no Triton key)
            assert fingerprint["triton_key"] and fingerprint["triton_version"] == "3.6.0"
    finally:
        _podman(engines, "pod", "rm", "-f", "cbpod")
        _podman(engines, "volume", "rm", "-f", "cbmodel", *volumes)


def _image_tree(art: Path, dest: Path) -> Path:
    """What a runtime mounts for the pushed bake image: its one layer, unpacked as it is."""
    import zstandard

    from cachebake.artifact import oci

    layout = oci.open_artifact(art)
    with layout.open_layer(layout.select("sm_90")) as layer, \
            zstandard.ZstdDecompressor().stream_reader(layer) as raw, \
            tarfile.open(fileobj=raw, mode="r|") as tar:
        # Python >= 3.11.4 warns without a filter; Debian 12's 3.11.2 has no such argument.
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest


_SERVER_CHECK = r"""
import hashlib, json, os
root = "/var/cache/cachebake"
def tree(d):
    return {os.path.relpath(os.path.join(p, f), d): hashlib.sha256(open(os.path.join(p, f), "rb").read()).hexdigest()
            for p, _, fs in os.walk(d) for f in fs}
out = {"vllm": tree(root + "/vllm"), "owner": os.stat(root + "/vllm/torch_compile_cache").st_uid,
       "env": os.environ["VLLM_CACHE_ROOT"]}
# Inductor saves beside the files it loads (README, Moving a vLLM bake): new files in the role.
for d in ("/vllm", "/vllm/torch_compile_cache"):
    with open(root + d + "/written-by-the-server", "w") as f:
        f.write("ok")
try:
    open(root + "/triton/written-by-the-server", "w")
    out["triton"] = "writable"
except OSError as e:
    out["triton"] = e.errno
# The cache manager TRITON_CACHE_MANAGER names imports here (cachebake from PYTHONPATH, copied by
# cachebake-lib: this image has none); a miss line for the sidecar to stream.
import importlib
module, _, cls = os.environ["TRITON_CACHE_MANAGER"].partition(":")
manager = getattr(importlib.import_module(module), cls)
out["manager"] = f"{manager.__module__}:{manager.__qualname__}"
out["manager_file"] = importlib.import_module(module).__file__
os.makedirs(os.path.dirname(os.environ["CACHEBAKE_MISS_LOG"]), mode=0o700, exist_ok=True)  # as the manager makes it
with open(os.environ["CACHEBAKE_MISS_LOG"], "a") as f:
    f.write(json.dumps({"kind": "kernel", "kernel": "stand_in_miss"}) + "\n")
print(json.dumps(out))
"""


@pytest.mark.containers
@pytest.mark.slow
def test_podman_plays_the_vllm_role_copy_inside_the_read_only_bake(engines, installer_image, tmp_path):
    """The image-volume Pod's vllm-role copy (see the module docstring for what stands in for the
    image volume): a real bake's vllm role (the H200 excerpt, packed for ROOT) and Triton role;
    cachebake copied onto the server's PYTHONPATH (the serving image has none) and the miss log
    streamed by the sidecar.  podman 4.3 runs every init container to completion (no native
    sidecars, KEP-753), so the miss-log sidecar plays as a regular container of the Pod."""
    if not engines.podman:
        pytest.skip("podman is not set up (CACHEBAKE_TEST_PODMAN): .ci/containers.sh does")
    if not engines.private_netns:
        pytest.skip("the Pod pulls the serving image from the registry on the loopback of a private "
                    "network namespace: run under .ci/containers.sh")
    from installkit import compile_kernels
    from test_artifact_torch_paths import excerpt

    compile_kernels(tmp_path / "cache" / "triton")
    for name, data in excerpt().items():
        (tmp_path / "filled" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "filled" / name).write_bytes(data)
    art = tmp_path / "art"
    pack_artifact([CacheRoot("triton", tmp_path / "cache" / "triton"),
                   CacheRoot("vllm", tmp_path / "filled" / "vllm")], art, target="sm_90", layer_root=ROOT)
    image_tree = _image_tree(art, tmp_path / "image")
    image_tree.chmod(0o755)
    expected = {str(p.relative_to(image_tree / "vllm")): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in (image_tree / "vllm").rglob("*") if p.is_file()}
    serving = f"{engines.registry}/cachebake-ci/serving:test"  # Triton, cp, tail, python3; no cachebake
    engines.docker("tag", engines.serving_image, serving)
    for image in (serving, installer_image):
        engines.docker("push", image)
    doc = yaml.safe_load(cli(
        "k8s", "--kind", "pod", "--name", "cbvol", "--pattern", "image-volume", "--serving-image", serving,
        "--installer-image", installer_image,
        "--artifact", f"docker://{engines.registry}/bakes/vol:sm_90", "--target", "sm_90", "--gpus", "0",
        "--", "python3", "-c", _SERVER_CHECK.strip()).stdout)  # (podman 4.3 misreads a leading newline)
    doc["spec"]["restartPolicy"] = "Never"
    inits = doc["spec"]["initContainers"]
    (sidecar,) = [c for c in inits if c.get("restartPolicy") == "Always"]
    inits.remove(sidecar)
    del sidecar["restartPolicy"]
    doc["spec"]["containers"].append(sidecar)
    vols = {v["name"]: v for v in doc["spec"]["volumes"]}
    del vols["cachebake"]["image"]
    vols["cachebake"]["hostPath"] = {"path": str(image_tree), "type": "Directory"}
    empty_dir = tmp_path / "vllm-emptydir"
    empty_dir.mkdir()
    empty_dir.chmod(0o777)  # as the kubelet makes an emptyDir: root's, 0777
    del vols["cachebake-vllm"]["emptyDir"]
    vols["cachebake-vllm"]["hostPath"] = {"path": str(empty_dir), "type": "Directory"}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(doc))
    volumes = [v["name"] for v in doc["spec"]["volumes"] if "emptyDir" in v]
    _podman(engines, "pod", "rm", "-f", "cbvol")
    try:
        play = _podman(engines, "kube", "play", "--network", "host", "--tls-verify=false", path, timeout=600)
        assert play.returncode == 0, play.stderr[-3000:]
        _podman(engines, "wait", "cbvol-cbvol", timeout=300)
        state = json.loads(_podman(engines, "inspect", "cbvol-cbvol").stdout)[0]["State"]
        logs = _podman(engines, "logs", "cbvol-cbvol")
        assert state["ExitCode"] == 0, logs.stdout[-2000:] + logs.stderr[-2000:]
        seen = json.loads(logs.stdout.strip().splitlines()[-1])
        # The server reads the vllm role byte for byte as the image has it (paths already
        # written for ROOT by pack), owned by the non-root copy container, and can write there;
        # the Triton role stays read-only (misses go to the layered manager's overlay).
        assert seen["vllm"] == expected and len(expected) > 10
        assert seen["owner"] == NONROOT_UID and seen["env"] == f"{ROOT}/vllm"
        assert seen["triton"] == errno.EROFS
        assert not list(image_tree.rglob("written-by-the-server"))
        assert len(list(empty_dir.rglob("written-by-the-server"))) == 2
        assert {p.name for p in image_tree.iterdir()} == {"triton", "vllm"}
        # the layered manager came from the copy on PYTHONPATH, and the sidecar streams its log
        assert seen["manager"] == "cachebake.serve.layered:LayeredCacheManager"
        assert seen["manager_file"].startswith("/cachebake-lib/cachebake/")
        marker = '{"kind"'  # the line the server appended, as the sidecar's tail prints it
        streamed = json.loads(marker + _until_logged(engines, f"cbvol-{sidecar['name']}", marker, timeout=60))
        assert streamed == {"kind": "kernel", "kernel": "stand_in_miss"}
    finally:
        _podman(engines, "pod", "rm", "-f", "cbvol")
        _podman(engines, "volume", "rm", "-f", *volumes)


@pytest.mark.containers
@pytest.mark.slow
def test_podman_plays_the_image_volume_pod_as_written_and_the_server_starts(engines, standin_server, tmp_path):
    """Issue 30: the image-volume Pod exactly as `cachebake k8s --pattern image-volume --bake ART
    --serving-image-has-cachebake --model-pvc CLAIM` writes it, the server's `vllm serve` the
    stand-in (tests/kit/standin_vllm.py), which does at start what vLLM does to the filesystem
    (Inductor's cache dir at `import vllm`, the torch.compile cache, a Triton miss through the
    layered manager).  What stands in for the image volume and the role's emptyDir: see the
    module docstring; the miss-log sidecar plays as a regular container (podman 4.3).  On the
    H200 the real server died here at import: `OSError: [Errno 30] Read-only file system:
    '/var/cache/cachebake/inductor'`."""
    if not engines.podman:
        pytest.skip("podman is not set up (CACHEBAKE_TEST_PODMAN): .ci/containers.sh does")
    if not engines.private_netns:
        pytest.skip("the Pod pulls the serving image from the registry on the loopback of a private "
                    "network namespace: run under .ci/containers.sh")
    from test_artifact_torch_paths import excerpt

    # The Triton role compiled by the serving image's own Triton (another Python, another
    # libtriton: another triton_key than this interpreter's), at the same path as here.
    cache = tmp_path / "cache"
    cache.mkdir()
    engines.run(engines.serving_image, "python3", "/opt/cachebake-ci/aot_kernels.py",
                docker_args=["-v", f"{cache}:{cache}", "-e", f"TRITON_CACHE_DIR={cache}/triton"])
    for name, data in excerpt().items():
        (tmp_path / "filled" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "filled" / name).write_bytes(data)
    section = {"driver": "vllm", "model": {"path": MODEL_PATH}, "serve_args": {"max_num_seqs": 8},
               "serve_env": {}, "env": {"root": ROOT, "invalidating_env_vars": {}}}
    art = tmp_path / "art"
    report = pack_artifact([CacheRoot("triton", tmp_path / "cache" / "triton"),
                            CacheRoot("vllm", tmp_path / "filled" / "vllm")], art, target="sm_90", bake=section,
                           layer_root=ROOT)
    image_tree = _image_tree(art, tmp_path / "image")
    image_tree.chmod(0o755)
    engines.docker("push", standin_server)
    doc = yaml.safe_load(cli(
        "k8s", "--kind", "pod", "--name", "cbiv", "--pattern", "image-volume", "--serving-image", standin_server,
        "--serving-image-has-cachebake", "--artifact", f"docker://{engines.registry}/bakes/iv@{report.manifest_digest}",
        "--bake", art, "--target", "sm_90", "--gpus", "0", "--model-pvc", "cbivmodel").stdout)
    doc["spec"]["restartPolicy"] = "Never"
    inits = doc["spec"]["initContainers"]
    (sidecar,) = [c for c in inits if c.get("restartPolicy") == "Always"]
    inits.remove(sidecar)
    del sidecar["restartPolicy"]
    doc["spec"]["containers"].append(sidecar)
    vols = {v["name"]: v for v in doc["spec"]["volumes"]}
    del vols["cachebake"]["image"]
    vols["cachebake"]["hostPath"] = {"path": str(image_tree), "type": "Directory"}
    empty_dir = tmp_path / "vllm-emptydir"
    empty_dir.mkdir()
    empty_dir.chmod(0o777)  # as the kubelet makes an emptyDir: root's, 0777
    del vols["cachebake-vllm"]["emptyDir"]
    vols["cachebake-vllm"]["hostPath"] = {"path": str(empty_dir), "type": "Directory"}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(doc))
    volumes = [v["name"] for v in doc["spec"]["volumes"] if "emptyDir" in v]
    _podman(engines, "pod", "rm", "-f", "cbiv")
    _podman(engines, "volume", "rm", "-f", "cbivmodel", *volumes)
    assert _podman(engines, "volume", "create", "cbivmodel").returncode == 0
    (_volume(engines, "cbivmodel") / "config.json").write_text(json.dumps({"stand_in": True}))
    try:
        play = _podman(engines, "kube", "play", "--network", "host", "--tls-verify=false", path, timeout=600)
        assert play.returncode == 0, play.stderr[-3000:]
        seen = json.loads(_until_logged(engines, "cbiv-cbiv", "STAND-IN-SERVER "))
        assert seen["argv"] == doc["spec"]["containers"][0]["command"][1:]
        assert seen["verify_rc"] == 0 and seen["verify"]["compiles"] == 0 and seen["verify"]["cache_hits"] == 3
        assert seen["miss_compile"]["misses"] == 1
        assert seen["miss_compile"]["manager"] == "cachebake.serve.layered:LayeredCacheManager"
        head = '{"cachebake_miss"'  # the miss, as the sidecar's tail prints it
        streamed = json.loads(head + _until_logged(engines, f"cbiv-{sidecar['name']}", head, timeout=60))
        assert streamed["stored"] == "overlay"
        assert {p.name for p in image_tree.iterdir()} == {"triton", "vllm"}  # nothing written into the image
    finally:
        _podman(engines, "pod", "rm", "-f", "cbiv")
        _podman(engines, "volume", "rm", "-f", "cbivmodel", *volumes)


def test_a_kernels_bake_serves_with_the_flags_its_plan_was_computed_for(triton_cache, tmp_path):
    """A --driver kernels bake records no engine, but its kernels were planned for exact serve
    args: with --model (the path), the server gets those flags, not the recipe's defaults."""
    from test_serve_command import _kernels_bake_section

    bake = _kernels_bake_section()
    bake["plan"]["serve_args"] = {**bake["plan"]["serve_args"], "max_num_seqs": 64}
    art = tmp_path / "kernels-bake"
    report = pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90", bake=bake)
    pinned = f"docker://reg.example/bakes/nemotron@{report.manifest_digest}"
    r = cli("k8s", *_without(INIT, "--artifact"), "--artifact", pinned, "--bake", art)
    (server,) = _pod(yaml.safe_load(r.stdout))["containers"]
    flags = server["command"]
    assert flags[:3] == ["vllm", "serve", MODEL_PATH]
    assert flags[flags.index("--max-num-seqs") + 1] == "64"  # the recipe's default is 256
    assert "engine plan was computed for" in r.stderr
    bake["plan"]["serve_args"] = "--max-num-seqs 64"  # not an object: a malformed document
    art2 = tmp_path / "kernels-bake-2"
    report = pack_artifact([CacheRoot("triton", triton_cache)], art2, target="sm_90", bake=bake)
    bad = cli("k8s", *_without(INIT, "--artifact"), "--artifact",
              f"docker://reg.example/bakes/nemotron@{report.manifest_digest}", "--bake", art2, check=False)
    assert bad.returncode == ExitCode.CORRUPT and "bake.plan.serve_args" in bad.stderr, bad.stderr
