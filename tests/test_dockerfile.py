"""The root Dockerfile users copy: its GPU form (read here), and its CPU form built for real by
BuildKit (dockerd 20.10) with the bake stage AOT-compiling sm_90 kernels, the cache stage
FROM scratch, and the serving stage verified in a container with 0 compiles."""

import io
import json
import re
import tarfile

import pytest

from containerkit import (cachebake_wheel, DEVICE_FLAG, ROOT, WARMUP, cpu_dockerfile, dockerfile_context,  # noqa: F401
                          engines, served, verify_json)
from installkit import REPO

from cachebake.roles import ROLE_ENV, serving_env

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _stages(text: str) -> dict[str, str]:
    return {m["name"]: m["base"] for m in re.finditer(r"^FROM (?P<base>\S+) AS (?P<name>\S+)$", text, re.M)}


def test_gpu_form_bakes_through_cdi_in_stable_syntax():
    assert DOCKERFILE.splitlines()[0] == "# syntax=docker/dockerfile:1"
    assert _stages(DOCKERFILE) == {"serving-cachebake": "${BASE}", "bake": "serving-cachebake",
                                   "cache": "scratch", "serve": "serving-cachebake"}
    bake = DOCKERFILE.split("AS bake", 1)[1].split("AS cache", 1)[0]
    assert DEVICE_FLAG in bake and "cachebake build" in bake and '--driver "$DRIVER" --model "$MODEL"' in bake
    assert "docker buildx build --builder gpubuilder --allow device" in DOCKERFILE


def test_cpu_form_differs_only_by_the_device_flag_and_syntax_line():
    cpu = cpu_dockerfile(DOCKERFILE)
    assert "\nRUN --device" not in cpu and not cpu.startswith("# syntax=")
    assert cpu.replace("RUN set -eu;", DEVICE_FLAG + "set -eu;") == DOCKERFILE.split("\n", 1)[1]


def test_serving_stage_sets_what_install_hands_a_server():
    # the one function install, serve-args and k8s build a server's environment with, for the
    # layout of this image: every role installed at ROOT (cachebake.install.environment)
    from cachebake.install.environment import ServerLayout, server_env

    env = dict(re.findall(r"(\w+)=(\S+)", DOCKERFILE.split("AS serve", 1)[1].split("ENV", 1)[1]))
    layout = server_env(None, ServerLayout.installed(ROOT, list(ROLE_ENV))).as_dict()
    expected = {k: v.replace(ROOT, "${ROOT}") for k, v in layout.items()}
    assert {k: v.rstrip("\\") for k, v in env.items()} == expected
    assert expected == {k: v.replace(ROOT, "${ROOT}") for k, v in serving_env(ROOT, list(ROLE_ENV)).items()}


@pytest.mark.containers
@pytest.mark.slow
def test_cpu_bake_stage_then_serving_image_verifies_with_no_compile(engines, served):
    # As a non-root server on a read-only root filesystem would run it.
    r = engines.run(served, "cachebake", "verify", "--cache", ROOT, "--json", "--", *WARMUP.split(),
                    docker_args=["--read-only", "--tmpfs", "/tmp", "--user", "65534:65534"])
    report = verify_json(r.stdout)
    assert report["ok"] and report["compiles"] == 0 and report["autotunes"] == 0
    assert report["cache_hits"] == 3  # the three AOT kernels the bake stage compiled
    config = json.loads(engines.docker("image", "inspect", served).stdout)[0]["Config"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert serving_env(ROOT, ["triton"]).items() <= env.items()


@pytest.mark.containers
def test_cache_stage_holds_only_the_installed_tree(engines, dockerfile_context, served):
    tag = engines.build(dockerfile_context, "cachebake-ci/cache:test", target="cache",
                        BASE=engines.serving_image, TARGET="sm_90", BAKE_WARMUP=WARMUP)
    saved = engines.docker("save", tag, text=False).stdout
    outer = tarfile.open(fileobj=io.BytesIO(saved))
    manifest = json.load(outer.extractfile("manifest.json"))[0]
    assert len(manifest["Layers"]) == 1
    layer = tarfile.open(fileobj=outer.extractfile(manifest["Layers"][0]))
    names = [m.name.rstrip("/") for m in layer.getmembers()]
    assert names and all(n in ("var", "var/cache", ROOT[1:]) or n.startswith(ROOT[1:] + "/") for n in names)
    links = {m.name: m.linkname for m in layer.getmembers() if m.issym()}
    assert links[f"{ROOT[1:]}/triton"] == ".cachebake/current/triton"
    marker = next(m for m in layer.getmembers() if m.name.endswith("/install.json"))
    assert json.load(layer.extractfile(marker))["serve_at"] == ROOT


# ------------------------------------------------------------- cachebake from the checkout's wheel
# cachebake is not on PyPI: both images install the checkout's own wheel from the build context
# (docker/install-cachebake.sh), which .dockerignore keeps down to what they read.

def _context_reads(text: str) -> set[str]:
    """The build-context paths a Dockerfile reads: COPY sources, and the scripts its RUNs run
    from the bind-mounted context."""
    reads = set(re.findall(r"^COPY (?!--from)(\S+) ", text, re.M))
    reads |= set(re.findall(r"/cachebake-context/(docker/[\w.-]+)", text))
    return reads


def test_the_build_context_holds_what_the_dockerfiles_read_and_nothing_else():
    from containerkit import CONTEXT_SCRIPTS

    ignore = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ignore[0] == "*"  # everything out, then exactly these back in
    admitted = {ln[1:] for ln in ignore[1:]}
    scripts = {f"docker/{s}" for s in CONTEXT_SCRIPTS}
    assert admitted == {"dist/cachebake-*.whl", *scripts}
    installer = (REPO / "docker" / "installer.Dockerfile").read_text()
    assert _context_reads(DOCKERFILE) == {"docker/install-cachebake.sh"}
    assert _context_reads(installer) == scripts
    for text in (DOCKERFILE, installer):
        assert "ARG CACHEBAKE_PIP=\n" in text  # the default: the wheel, never PyPI's name


def _install_script(context, venv, **env):
    import os
    import subprocess

    return subprocess.run(["sh", str(REPO / "docker" / "install-cachebake.sh"), str(context)],
                          capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}", **env})


@pytest.mark.slow
def test_the_install_script_takes_the_one_wheel_of_the_context(tmp_path):
    """As the image builds run it (python3 and pip on PATH): no wheel or two wheels is one line
    saying how to make one; the one wheel installs with its dependencies and runs."""
    import subprocess
    import sys

    from containerkit import make_wheel

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (tmp_path / "empty").mkdir()
    none = _install_script(tmp_path / "empty", venv)
    assert none.returncode == 1 and none.stderr.count("\n") == 1
    assert "exactly one dist/cachebake-*.whl, it has 0" in none.stderr
    assert "pip wheel --no-deps -w dist ." in none.stderr
    wheel = make_wheel(tmp_path / "ctx" / "dist", tmp_path)
    (tmp_path / "ctx" / "dist" / "cachebake-0.0.1-py3-none-any.whl").write_bytes(wheel.read_bytes())
    two = _install_script(tmp_path / "ctx", venv)
    assert two.returncode == 1 and "it has 2" in two.stderr
    (tmp_path / "ctx" / "dist" / "cachebake-0.0.1-py3-none-any.whl").unlink()
    one = _install_script(tmp_path / "ctx", venv)
    assert one.returncode == 0, one.stderr
    from importlib.metadata import version

    assert one.stdout.strip().endswith(f"cachebake, version {version('cachebake')}")
    assert (venv / "bin" / "cachebake").exists()
