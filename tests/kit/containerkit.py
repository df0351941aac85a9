"""The real container engines for the container tests (tests/test_distribute_*.py,
tests/test_dockerfile.py), as .ci/containers.sh starts them.

.ci/containers.sh runs dockerd (vfs, BuildKit), a docker-registry on 127.0.0.1 and podman,
all inside a private network namespace that has nothing but a loopback, imports a debootstrapped
Debian base with cachebake's wheels, and builds a stand-in serving image from it (Triton, no
vLLM: the tests' warmup AOT-compiles real sm_90 kernels with triton.compile).  It describes
them in CACHEBAKE_TEST_* variables; without those, every test that needs an engine skips and
says how to get one.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from installkit import REPO, env_with

GATE = "CACHEBAKE_TEST_CONTAINERS"
SKIP_REASON = ("no container engines: .ci/containers.sh starts dockerd, a registry and podman "
               "and sets CACHEBAKE_TEST_* (see README, Containers and Kubernetes)")
WARMUP = "python3 /opt/cachebake-ci/aot_kernels.py"  # put in the serving stand-in by the CI script
ROOT = "/var/cache/cachebake"
DEVICE_FLAG = "RUN --device=nvidia.com/gpu=all \\\n    "
# What the Dockerfiles read from the build context beside dist/cachebake-*.whl (.dockerignore)
CONTEXT_SCRIPTS = ("install-cachebake.sh", "cachebake-init.sh")


@dataclass
class Engines:
    docker_cli: str  # a docker CLI with BuildKit (20.10 here)
    registry: str  # 127.0.0.1:PORT
    base_image: str  # debootstrapped Debian + python3, pip, skopeo; pip reads /opt/wheels
    serving_image: str  # base + Triton + the AOT warmup: stands in for a vLLM image
    podman: list[str]  # podman with its storage flags, or [] if not started
    private_netns: bool  # running inside a network namespace of our own (loopback only)

    def docker(self, *args, check=True, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        r = subprocess.run([self.docker_cli, *map(str, args)],
                           env={**os.environ, "DOCKER_BUILDKIT": "1"}, **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(map(str, args))} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def build(self, context: Path, tag: str, *, dockerfile: Path | None = None, target: str | None = None,
              **build_args: str) -> str:
        args = ["build", "--network=none", "-q", "-t", tag]
        if dockerfile:
            args += ["-f", dockerfile]
        if target:
            args += ["--target", target]
        for k, v in build_args.items():
            args += ["--build-arg", f"{k}={v}"]
        self.docker(*args, context)
        return tag

    def run(self, image: str, *argv, docker_args=(), check=True) -> subprocess.CompletedProcess:
        return self.docker("run", "--rm", "--network", "none", *docker_args, image, *argv, check=check)


def engines_or_skip() -> Engines:
    if os.environ.get(GATE) != "1":
        pytest.skip(SKIP_REASON)
    env = os.environ
    return Engines(docker_cli=env.get("CACHEBAKE_TEST_DOCKER_CLI", "docker"),
                   registry=env["CACHEBAKE_TEST_REGISTRY"],
                   base_image=env["CACHEBAKE_TEST_BASE_IMAGE"],
                   serving_image=env["CACHEBAKE_TEST_SERVING_IMAGE"],
                   podman=shlex.split(env.get("CACHEBAKE_TEST_PODMAN", "")),
                   private_netns=env.get("CACHEBAKE_TEST_PRIVATE_NETNS") == "1")


def cpu_dockerfile(text: str) -> str:
    """The root Dockerfile as a CPU builder without a GPU or network runs it: dockerd 20.10's
    built-in frontend knows no ``RUN --device`` (stable since frontend 1.27) and cannot fetch
    the ``# syntax=`` frontend.  Exactly those two things are taken out; the test checks it."""
    lines = text.splitlines(keepends=True)
    assert lines[0].startswith("# syntax=docker/dockerfile:"), lines[0]
    body = "".join(lines[1:])
    assert body.count(DEVICE_FLAG) == 1
    return body.replace(DEVICE_FLAG, "RUN ")


def cli(*args, check=True, **env) -> subprocess.CompletedProcess:
    # DOCKER_HOST: the engines' daemon (.ci/containers.sh), unless the test names another
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", *map(str, args)], capture_output=True,
                       text=True, env=env_with(**{"DOCKER_HOST": os.environ.get("DOCKER_HOST", ""), **env}),
                       cwd="/")
    if check and r.returncode != 0:
        raise AssertionError(f"cachebake {' '.join(map(str, args))} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def verify_json(stdout: str) -> dict:
    """The envelope ``cachebake verify --json`` printed (the round's progress goes to stderr)."""
    return json.loads(stdout[stdout.index("{"):])


@pytest.fixture(scope="session")
def engines() -> Engines:
    return engines_or_skip()


def make_wheel(dest: Path, scratch: Path) -> Path:
    """cachebake's wheel, as README says to make it (`pip wheel --no-deps -w dist .`), from a
    copy of what the package is made of: setuptools writes build/ and *.egg-info into the
    tree it builds, which must not be the checkout under test."""
    src = scratch / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "cachebake", src / "cachebake", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(src)],
                   check=True, capture_output=True)
    (wheel,) = dest.glob("cachebake-*.whl")
    return wheel


def build_context(dest: Path, wheel: Path) -> Path:
    """A build context as the checkout is one once its wheel is in dist/: what .dockerignore lets
    through (the wheel and docker/'s two scripts; tests/test_dockerfile.py holds it to that)."""
    (dest / "dist").mkdir(parents=True)
    shutil.copy2(wheel, dest / "dist" / wheel.name)
    (dest / "docker").mkdir()
    for script in CONTEXT_SCRIPTS:
        shutil.copy2(REPO / "docker" / script, dest / "docker" / script)
    return dest


@pytest.fixture(scope="session")
def cachebake_wheel(tmp_path_factory) -> Path:
    return make_wheel(tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("wheel-src"))


@pytest.fixture(scope="session")
def dockerfile_context(engines, cachebake_wheel, tmp_path_factory) -> Path:
    ctx = build_context(tmp_path_factory.mktemp("dockerfile"), cachebake_wheel)
    (ctx / "Dockerfile").write_text(cpu_dockerfile((REPO / "Dockerfile").read_text()))
    return ctx


@pytest.fixture(scope="session")
def serving_cachebake(engines, dockerfile_context) -> str:
    """The Dockerfile's ``serving-cachebake`` stage: the serving image plus cachebake, no cache."""
    return engines.build(dockerfile_context, f"{engines.registry}/cachebake-ci/serving-cachebake:test",
                         target="serving-cachebake", BASE=engines.serving_image)


@pytest.fixture(scope="session")
def served(engines, dockerfile_context) -> str:
    """The Dockerfile's final stage, its bake stage run on CPU (BAKE_WARMUP, TARGET=sm_90)."""
    return engines.build(dockerfile_context, "cachebake-ci/served:test", target="serve",
                         BASE=engines.serving_image, TARGET="sm_90", BAKE_WARMUP=WARMUP)


@pytest.fixture(scope="session")
def container_artifact(engines, serving_cachebake, tmp_path_factory) -> Path:
    """A bake made by `cachebake build --image` in the serving image (its fingerprint)."""
    out = tmp_path_factory.mktemp("in-image") / "artifact"
    cli("build", "--image", serving_cachebake, "--gpus", "none", "--target", "sm_90", "--out", out,
        "--", *WARMUP.split())
    return out


@pytest.fixture(scope="session")
def installer_image(engines, cachebake_wheel, tmp_path_factory) -> str:
    ctx = build_context(tmp_path_factory.mktemp("installer"), cachebake_wheel)
    return engines.build(ctx, f"{engines.registry}/cachebake-ci/installer:test",
                         dockerfile=REPO / "docker" / "installer.Dockerfile", BASE=engines.base_image)


@pytest.fixture(scope="session")
def standin_server(engines, serving_cachebake, tmp_path_factory) -> str:
    """The serving image with a stand-in `vllm` (tests/kit/standin_vllm.py): `vllm serve MODEL ...`
    checks the model is there and verifies the cache, then stays up as a server does."""
    ctx = tmp_path_factory.mktemp("standin")
    shutil.copy2(REPO / "tests" / "kit" / "standin_vllm.py", ctx / "vllm")
    (ctx / "vllm").chmod(0o755)  # COPY keeps the mode (COPY --chmod is newer than dockerd 20.10)
    (ctx / "Dockerfile").write_text(f"FROM {serving_cachebake}\nCOPY vllm /usr/local/bin/vllm\n")
    return engines.build(ctx, f"{engines.registry}/cachebake-ci/standin-server:test")
