"""`cachebake bake-job`: the bake matrix as Kubernetes Jobs, checked against the Kubernetes 1.35
schema (kubernetes-validate --strict, offline) and read back as data: one Job per (GPU, recipe),
on a node of that GPU, argv lists only, hostile values kept inside their strings; and (containers
marker) both Jobs of a matrix played by podman with a stand-in bake, their pushed bakes merged
and installed per target."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from containerkit import cachebake_wheel, dockerfile_context, engines, serving_cachebake  # noqa: F401
from installkit import cli
from jobplay import SMI_PATH, CannotPlay, StandInNode, pod_of_job

from cachebake.errors import ExitCode

BASE = ["bake-job", "--gpu", "NVIDIA-H200=sm_90", "--gpu", "NVIDIA-GeForce-RTX-5090=sm_120",
        "--model", "nemotron-h", "--model", "falcon-h1:7b", "--builder-image", "registry.example/builder:1",
        "--repository", "docker://registry.example/bakes"]


def _validate(path, version="1.35.0"):
    exe = shutil.which("kubernetes-validate")
    if not exe:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate; .ci/containers.sh does)")
    return subprocess.run([exe, "-k", version, "--strict", str(path)], capture_output=True, text=True)


def _jobs(*extra):
    r = cli(*BASE, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout, list(yaml.safe_load_all(r.stdout))


@pytest.mark.parametrize("extra", [[], ["--pull-secret", "regcred", "--no-tls-verify", "--driver", "kernels"]])
def test_jobs_pass_the_kubernetes_1_35_schema(tmp_path, extra):
    text, docs = _jobs(*extra)
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    r = _validate(path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed") + r.stderr.count("passed") == 4


def test_one_job_per_gpu_and_recipe_on_a_node_of_that_gpu():
    _, docs = _jobs("--pull-secret", "regcred", "--", "--max-rounds", "4")
    assert [d["kind"] for d in docs] == ["Job"] * 4
    seen = set()
    for d in docs:
        spec = d["spec"]["template"]["spec"]
        product = spec["nodeSelector"]["nvidia.com/gpu.product"]
        target = {"NVIDIA-H200": "sm_90", "NVIDIA-GeForce-RTX-5090": "sm_120"}[product]
        (bake,), (push,) = spec["initContainers"], spec["containers"]
        argv = bake["command"]
        recipe = argv[argv.index("--model") + 1]
        seen.add((product, recipe))
        assert argv[:2] == ["cachebake", "build"] and argv[argv.index("--target") + 1] == target
        assert argv[-2:] == ["--max-rounds", "4"]  # BUILD_ARGS, as given
        assert bake["resources"]["limits"]["nvidia.com/gpu"] == 1 and "resources" not in push
        slug = recipe.replace(":", "-")
        assert push["command"][:4] == ["cachebake", "push", "/work/bake", f"docker://registry.example/bakes/{slug}"]
        assert push["command"][-2:] == ["--authfile", "/cachebake-auth/.dockerconfigjson"]
        assert d["spec"]["backoffLimit"] == 0 and spec["restartPolicy"] == "Never"
        for c in (bake, push):
            assert isinstance(c["command"], list) and all(isinstance(a, str) for a in c["command"])
            assert c["securityContext"]["runAsUser"] == 65534 and c["securityContext"]["readOnlyRootFilesystem"]
        assert d["metadata"]["name"] == f"cachebake-bake-{slug}-{target.replace('_', '')}"
    assert seen == {(p, m) for p in ("NVIDIA-H200", "NVIDIA-GeForce-RTX-5090") for m in ("nemotron-h", "falcon-h1:7b")}


def test_json_is_one_v1_list(tmp_path):
    r = cli(*BASE, "--format", "json")
    doc = json.loads(r.stdout)
    assert doc["kind"] == "List" and len(doc["items"]) == 4
    r = cli(*BASE, "--json")
    assert len(json.loads(r.stdout)["jobs"]) == 4


def test_hostile_build_args_stay_inside_their_strings():
    evil = ["--serve-args", "x\n---\nkind: Secret\n", "$(reboot)", "'; rm -rf / #"]
    text, docs = _jobs("--", *evil)
    assert len(docs) == 4 and all(d["kind"] == "Job" for d in docs)
    assert docs[0]["spec"]["template"]["spec"]["initContainers"][0]["command"][-4:] == evil
    assert all(ord(c) < 128 for c in text)


@pytest.mark.parametrize("args, code, words", [
    (["--model", "/models/local"], ExitCode.BAD_INPUT, "not a bundled recipe"),
    (["--model", "nemotron-h\nkind: Secret"], ExitCode.BAD_INPUT, "not a bundled recipe"),
    (["--gpu", "NVIDIA H200=sm_90"], ExitCode.USAGE, "label value"),
    (["--gpu", "NVIDIA-H200=sm_999"], ExitCode.USAGE, "unknown GPU target"),
    (["--gpu", "NVIDIA-H100-80GB-HBM3=sm_90"], ExitCode.BAD_INPUT, "one GPU target"),
    (["--repository", "docker://registry.example/bakes:sm_90"], ExitCode.BAD_INPUT, "without a tag"),
    (["--repository", "https://registry.example/bakes"], ExitCode.BAD_INPUT, "docker://"),
    (["--name-prefix", "x" * 60], ExitCode.BAD_INPUT, "DNS-1123"),
])
def test_refusals_are_one_line(args, code, words):
    base = list(BASE)
    for opt in ("--repository", "--name-prefix"):
        if opt in args and opt in base:
            i = base.index(opt)
            del base[i:i + 2]
    if "--model" in args:  # only the hostile recipe
        base = [a for i, a in enumerate(base) if a != "--model" and (i == 0 or base[i - 1] != "--model")]
    r = cli(*base, *args)
    assert r.returncode == code, r.stderr
    assert words in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_driver_command_takes_the_warmup_after_a_second_separator():
    _, docs = _jobs("--driver", "command", "--", "--quiet-rounds", "1", "--", "python3", "warmup.py", "--x")
    argv = docs[0]["spec"]["template"]["spec"]["initContainers"][0]["command"]
    assert argv[argv.index("--driver") + 1] == "command"
    assert argv[-6:] == ["--quiet-rounds", "1", "--", "python3", "warmup.py", "--x"]
    for args in (["--driver", "command", "--", "--quiet-rounds", "1"], ["--driver", "command", "--", "x", "--"],
                 ["--", "--", "python3", "warmup.py"]):
        r = cli(*BASE, *args)
        assert r.returncode == ExitCode.BAD_INPUT and r.stderr.count("\n") == 1, r.stderr


# -------------------------------------------------------------------- the Jobs played by podman
# Two stand-in nodes, one per --gpu of the matrix (what nvidia-smi prints on each; see tests/kit/jobplay.py).
NODES = [StandInNode("NVIDIA-H200", "NVIDIA H200", "9.0"),
         StandInNode("NVIDIA-GeForce-RTX-5090", "NVIDIA GeForce RTX 5090", "12.0")]
STANDIN_WARMUP = ["python3", "/opt/cachebake-ci/aot_kernels.py", "--visible-gpu"]


def test_the_converter_refuses_what_it_cannot_honour(tmp_path):
    _, docs = _jobs("--pull-secret", "regcred")
    with pytest.raises(CannotPlay, match="imagePullSecrets"):
        pod_of_job(docs[0], NODES, tmp_path)
    _, docs = _jobs()
    playable = pod_of_job(docs[0], NODES, tmp_path)
    assert playable.node.product == "NVIDIA-H200" and playable.deadline == 4 * 3600
    for mutate, words in [
            (lambda j: j["spec"].update(parallelism=2), "parallelism"),
            (lambda j: j["spec"].update(backoffLimit=3), "backoffLimit"),
            (lambda j: j["spec"]["template"]["spec"]["nodeSelector"].update(zone="a"), "zone"),
            (lambda j: j["spec"]["template"]["spec"]["initContainers"][0]["resources"]["limits"].update(memory="1Gi"),
             "memory"),
            (lambda j: j["spec"]["template"]["spec"]["volumes"].append({"name": "x", "hostPath": {"path": "/"}}),
             "emptyDirs"),
            (lambda j: j["spec"]["template"]["spec"]["nodeSelector"].update({"nvidia.com/gpu.product": "A100"}),
             "no stand-in node")]:
        job = yaml.safe_load(yaml.safe_dump(docs[0]))
        mutate(job)
        with pytest.raises(CannotPlay, match=words):
            pod_of_job(job, NODES, tmp_path)


def _podman(engines, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*engines.podman, *map(str, args)], capture_output=True, text=True, **kw)


@pytest.mark.containers
@pytest.mark.slow
def test_podman_plays_both_jobs_and_their_bakes_merge_and_install_per_target(engines, serving_cachebake, tmp_path):
    """Issue 32: the matrix `bake-job` writes for two GPUs (sm_90, sm_120) and one recipe, each Job
    played by podman as its Pod (podman 4.3 plays no Job: tests/kit/jobplay.py, which refuses any
    field it cannot honour).  In each Pod `cachebake build` really runs in the builder image (the
    Dockerfile's serving-cachebake stage: Triton, cachebake, skopeo) with the stand-in warmup
    (--driver command): real Triton cubins for the GPU its node reports; then `cachebake push`
    puts the bake on the loopback registry at REPO/RECIPE:sm_XX, as the Job says.  Then `merge`
    of the two tags, and `install` of the merge with each target's fingerprint of the image
    (`cachebake fingerprint --target T` run in it), which picks that target's bake.  What stands in: the GPU node (nodeSelector
    nvidia.com/gpu.product and the nvidia.com/gpu limit: the node's nvidia-smi, no GPU); the
    warmup (vLLM's, in a real builder image).  Only podman's own flags differ from kubectl's:
    the network (the registry is on this namespace's loopback) and plain-HTTP pulls."""
    if not engines.podman:
        pytest.skip("podman is not set up (CACHEBAKE_TEST_PODMAN): .ci/containers.sh does")
    if not engines.private_netns:
        pytest.skip("the Pods reach the registry through the host network of a private network "
                    "namespace: run under .ci/containers.sh")
    from cachebake.artifact.oci import open_artifact

    engines.docker("push", serving_cachebake)
    repo = f"docker://{engines.registry}/bakejob"
    r = cli("bake-job", *(a for n in NODES for a in ("--gpu", f"{n.product}=sm_{n.compute_cap.replace('.', '')}")),
            "--model", "nemotron-h", "--builder-image", serving_cachebake, "--repository", repo,
            "--no-tls-verify", "--driver", "command", "--deadline", "600",
            "--", "--quiet-rounds", "1", "--", *STANDIN_WARMUP)
    assert r.returncode == 0, r.stderr
    stream = tmp_path / "jobs.yaml"
    stream.write_text(r.stdout)
    checked = _validate(stream)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # As written, podman 4.3 plays none of it: no kind it knows.
    play = _podman(engines, "kube", "play", "--network", "host", "--tls-verify=false", stream)
    assert play.returncode != 0 and "does not contain any supported kube kind" in play.stderr, play.stderr
    pushed = {}
    for job in yaml.safe_load_all(r.stdout):
        playable = pod_of_job(job, NODES, tmp_path)
        name, target = job["metadata"]["name"], job["metadata"]["labels"]["dev.cachebake/target"]
        assert playable.stood_in == [f"nodeSelector nvidia.com/gpu.product={playable.node.product}",
                                     "container bake resources.limits nvidia.com/gpu=1"]
        (bake,) = playable.pod["spec"]["initContainers"]  # the GPU's holder gets its node's nvidia-smi
        assert {"name": "stand-in-nvidia-smi", "mountPath": SMI_PATH, "readOnly": True} in bake["volumeMounts"]
        assert bake["command"] == job["spec"]["template"]["spec"]["initContainers"][0]["command"]
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(playable.pod))
        volumes = [v["name"] for v in playable.pod["spec"]["volumes"] if "emptyDir" in v]
        _podman(engines, "pod", "rm", "-f", name)
        _podman(engines, "volume", "rm", "-f", *volumes)  # podman names an emptyDir by its volume's name
        try:
            play = _podman(engines, "kube", "play", "--network", "host", "--tls-verify=false", path,
                           timeout=playable.deadline)
            assert play.returncode == 0, play.stdout[-3000:] + play.stderr[-3000:]
            _podman(engines, "wait", f"{name}-push", timeout=playable.deadline)
            state = json.loads(_podman(engines, "inspect", f"{name}-push").stdout)[0]["State"]
            logs = _podman(engines, "logs", f"{name}-push")
            assert state["ExitCode"] == 0, logs.stdout[-3000:] + logs.stderr[-3000:]
            (one,) = json.loads(logs.stdout[logs.stdout.index("{"):])["pushed"]
            assert one["reference"] == f"{repo}/nemotron-h:{target}"
            pushed[target] = one
        finally:
            _podman(engines, "pod", "rm", "-f", name)
            _podman(engines, "volume", "rm", "-f", *volumes)
    merged = tmp_path / "merged"
    r = cli("merge", *(pushed[t]["reference"] for t in ("sm_90", "sm_120")), "--out", merged, "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(r.stdout)["targets"]) == ["cuda:120", "cuda:90"]
    layout = open_artifact(merged)
    for node in NODES:
        target = f"sm_{node.compute_cap.replace('.', '')}"
        key = f"cuda:{target[3:]}"
        assert layout.select(key).layer_digest == pushed[target]["layer_digest"]
        bake = json.loads((merged / "cachebake.json").read_text())["bakes"][key]
        # the Pod's bake: its warmup, and the GPU its node reported
        assert bake["bake"]["command"] == STANDIN_WARMUP, bake["bake"]
        assert bake["fingerprint"]["gpu_name"] == node.gpu_name
        # The server runs the builder's image (its Triton, its Python): install checks the bake
        # against that image's fingerprint for the target, and picks the target's bake by it.
        fp = tmp_path / f"fp-{target}"
        fp.mkdir()
        engines.run(serving_cachebake, "cachebake", "fingerprint", "--target", target, "--out", "/fp/fingerprint.json",
                    docker_args=["-v", f"{fp}:/fp"])
        dest = tmp_path / f"installed-{target}"
        r = cli("install", merged, "--to", dest, "--fingerprint", fp / "fingerprint.json", "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["target"] == key and report["layer_digest"] == pushed[target]["layer_digest"]
        kernels = [json.loads(p.read_text()) for p in (dest / "triton").glob("*/*.json")
                   if not p.name.startswith("__grp__") and "target" in p.read_text()]
        assert len(kernels) == 3 and {k["target"]["arch"] for k in kernels} == {int(target[3:])}
        assert all(list((dest / "triton").glob(f"*/{k['name']}.cubin")) for k in kernels)
