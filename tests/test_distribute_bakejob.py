"""`cachebake bake-job`: the bake matrix as Kubernetes Jobs, checked against the Kubernetes 1.35
schema (kubernetes-validate --strict, offline) and read back as data: one Job per (GPU, recipe),
on a node of that GPU, argv lists only, hostile values kept inside their strings."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from installkit import cli

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
