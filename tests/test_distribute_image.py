"""The Docker API commands against a real dockerd: `build --image` bakes inside the serving image
(its fingerprint, the caller's uid), `image` turns the artifact into the cache image, and a
serving Dockerfile that copies it from the registry verifies with 0 compiles: the route for
builders with no GPU in builds."""

import json
import os

import pytest

from containerkit import (cachebake_wheel, ROOT, WARMUP, cli, container_artifact, dockerfile_context, engines,  # noqa: F401
                          serving_cachebake, verify_json)

from cachebake.distribute.image import (CACHE_DOCKERFILE, build_args, device_requests,
                                        plan_bake_in_image)
from cachebake.errors import BadInput, ExitCode


def test_gpus_become_device_requests():
    assert device_requests("none") == []
    (every,) = device_requests("all")
    assert every["Count"] == -1 and every["Capabilities"] == [["gpu"]]
    assert device_requests("2")[0]["Count"] == 2
    assert device_requests("device=0,3")[0]["DeviceIDs"] == ["0", "3"]
    with pytest.raises(BadInput):
        device_requests("most")


def test_the_bake_in_the_image_mounts_out_and_runs_as_the_caller(tmp_path):
    args = build_args(target="sm_90", max_rounds=3, cmd=("python3", "w.py"))
    plan = plan_bake_in_image("img", args, out=tmp_path / "art", root=ROOT, gpus="all")
    assert plan.argv[:5] == ["build", "--target", "sm_90", "--max-rounds", "3"]
    assert plan.argv[-3:] == ["--", "python3", "w.py"]  # our --out/--root/--work-dir before --
    out = plan.argv.index("--out")
    assert plan.argv[out + 1] == "/cachebake/out/art" and plan.argv.index("--") > out
    assert plan.volumes[str(tmp_path)]["bind"] == "/cachebake/out"
    assert plan.volumes[str(plan.work / "root")]["bind"] == ROOT
    assert plan.user == f"{os.getuid()}:{os.getgid()}" and plan.device_requests[0]["Count"] == -1


def test_docker_cache_dockerfile_is_what_image_builds():
    from installkit import REPO

    lines = [ln for ln in (REPO / "docker" / "cache.Dockerfile").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert "\n".join(lines) + "\n" == CACHE_DOCKERFILE


def test_no_daemon_is_one_line_naming_the_socket_tried(tmp_path, triton_cache):
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    art = tmp_path / "art"
    pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90")  # a real bake: the
    # daemon is the first thing missing, not the artifact
    sock = tmp_path / "no-daemon.sock"
    r = cli("image", art, "--tag", "x:y", check=False, DOCKER_HOST=f"unix://{sock}")
    assert r.returncode == ExitCode.BAD_INPUT and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == (f"cachebake: error: cannot reach a Docker daemon at unix://{sock}: "
                        "No such file or directory\n")
    if not os.path.exists("/var/run/docker.sock"):  # the default, named when DOCKER_HOST is not set
        r = cli("image", art, "--tag", "x:y", check=False, DOCKER_HOST="")
        assert r.stderr == ("cachebake: error: cannot reach a Docker daemon at unix:///var/run/docker.sock: "
                            "No such file or directory (set DOCKER_HOST to the daemon's socket)\n")


@pytest.mark.containers
@pytest.mark.slow
def test_build_in_the_serving_image_as_another_uid(engines, serving_cachebake, tmp_path):
    from cachebake.distribute.image import run_bake_in_image

    out_dir = tmp_path / "o"
    out_dir.mkdir()
    os.chown(out_dir, 65534, 65534)
    plan = plan_bake_in_image(serving_cachebake, build_args(target="sm_90", cmd=WARMUP.split()),
                              out=out_dir / "art", root=ROOT, gpus="none", user="65534:65534")
    run_bake_in_image(plan)
    assert (out_dir / "art" / "index.json").stat().st_uid == 65534
    assert not plan.work.exists()  # removed after a good bake


@pytest.mark.containers
@pytest.mark.slow
def test_cache_image_from_the_registry_serves_with_no_compile(engines, container_artifact,
                                                              serving_cachebake, tmp_path):
    manifest = json.loads((container_artifact / "cachebake.json").read_text())["bakes"]["cuda:90"]
    assert manifest["fingerprint"]["python_tag"].startswith("cpython-313")  # the image's, not ours
    tag = f"{engines.registry}/bakes/cache-image:sm_90"
    r = cli("image", container_artifact, "--tag", tag, "--push", "--json")
    report = json.loads(r.stdout)
    assert report["pushed_digest"].startswith("sha256:") and report["root"] == ROOT
    engines.docker("rmi", tag)  # the serving build must take it from the registry
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {serving_cachebake}\nCOPY --from={tag} {ROOT} {ROOT}\n"
                                    f"ENV TRITON_CACHE_DIR={ROOT}/triton TRITON_CACHE_AUTOTUNING=1\n")
    served = engines.build(ctx, "cachebake-ci/served-from-cache-image:test")
    r = engines.run(served, "cachebake", "verify", "--cache", ROOT, "--json", "--", *WARMUP.split())
    result = verify_json(r.stdout)
    assert result["ok"] and result["compiles"] == 0 and result["cache_hits"] == 3
