"""Cross-target warmups and the build's seed step, on CPU.

The cross-target patches (cachebake.capture.cross) run in a real JIT warmup whose active driver
stands in for an sm_90 GPU (tests/kit/jit_launch.py): Triton must compile every launch for the
requested sm_120, skip the launches (building the launcher helper as a first launch would),
and answer host code's device questions for the target.  A real cross bake on a GPU is
bench/gpu_replay.sh's job (not run here: no GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_replay_engine import ALLOW_KERNELS, REPO, TESTS, jit_warmup

from cachebake.bake.seed import prepare_bake
from cachebake.capture.cross import CROSS_TARGET_ENV, GPU_NAME_ENV
from cachebake.capture.env import bake_env
from cachebake.capture.recorder import load_record_log
from cachebake.gpu import GPUTargetSpec

FAKE_PLATFORM = '''
from typing import NamedTuple
class DeviceCapability(NamedTuple):
    major: int
    minor: int
class NvmlCudaPlatform:
    @classmethod
    def get_device_name(cls, device_id=0):
        return "NVIDIA H200"
    @classmethod
    def get_device_capability(cls, device_id=0):
        return DeviceCapability(9, 0)
'''


def test_a_cross_target_warmup_compiles_for_the_target_and_skips_launches(tmp_path):
    fake = tmp_path / "fake"
    (fake / "vllm" / "platforms").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    (fake / "vllm" / "platforms" / "__init__.py").write_text("")
    (fake / "vllm" / "platforms" / "cuda.py").write_text(FAKE_PLATFORM)
    name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    cross = jit_warmup(tmp_path / "cross", 90, RECORD_LOG=tmp_path / "events.jsonl", HELPER_KEYS=1,
                       PROBE_VLLM=fake, **{CROSS_TARGET_ENV: "cuda:120", GPU_NAME_ENV: name})
    assert {arch for _, _, arch in cross["events"]} == {120}
    assert cross["benchmarked"]  # every candidate compiled; the timings are of skipped launches
    assert cross["helper_keys"]  # launchers were built for the skipped launches
    assert cross["platform"] == [name, [12, 0]]
    native = jit_warmup(tmp_path / "native", 120)  # the same launches with sm_120 as "this GPU"
    assert {h for h, _, _ in cross["events"]} == {h for h, _, _ in native["events"]}
    record = load_record_log(tmp_path / "events.record.jsonl")
    assert record.targets() == ["cuda:120"] and record.summary()["unverified"] == 0


def test_prepare_bake_makes_a_bake_cross_target_only_when_the_gpu_differs(tmp_path):
    benv = bake_env(tmp_path / "root", monitor_log=tmp_path / "events.jsonl")
    h200 = lambda: (GPUTargetSpec("cuda", 90, 32), "NVIDIA H200")  # noqa: E731
    same = prepare_bake(benv, target="sm_90", visible=h200)
    assert same.cross_target is None and CROSS_TARGET_ENV not in benv.env
    prep = prepare_bake(benv, target="sm_120", gpu_name="RTX", visible=h200)
    assert prep.cross_target == "cuda:120" and benv.env[CROSS_TARGET_ENV] == "cuda:120"
    assert benv.env[GPU_NAME_ENV] == "RTX"
    # an autotune result measured on skipped launches must not ship
    key_dir = Path(prep.triton_dir) / "KEY"
    key_dir.mkdir(parents=True)
    (key_dir / "k.autotune.json").write_text("{}")
    bake: dict = {}
    prep.finish(bake)
    assert not key_dir.exists() and bake["cross_target"]["autotune_results_dropped"] == 1
    assert bake["unverified_on_target"] == {"how": "cross-bake", "built_on": "cuda:90"}


def test_gpu_name_without_a_cross_target_is_refused(tmp_path):
    from cachebake.errors import BadInput

    benv = bake_env(tmp_path / "root", monitor_log=tmp_path / "events.jsonl")
    try:
        prepare_bake(benv, target="sm_90", gpu_name="X", visible=lambda: (GPUTargetSpec("cuda", 90, 32), None))
    except BadInput as e:
        assert "--gpu-name" in str(e)
    else:
        raise AssertionError("accepted --gpu-name for a native bake")


def _cli(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    return subprocess.run([sys.executable, "-m", "cachebake.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.mark.slow  # two builds and a seeding, real compiles: 5-6 s alone on the 2-vCPU VM
def test_build_records_and_a_seeded_build_compiles_nothing_in_its_rounds(tmp_path):
    warmup = ["--", sys.executable, str(TESTS / "jit_launch.py"), "--arch", "90"]
    first = _cli("build", "--target", "sm_90", "--root", str(tmp_path / "a"), "--out", str(tmp_path / "art1"),
                 "--json", *warmup)
    assert first.returncode == 0, first.stderr
    bake = json.loads(first.stdout)["bake"]
    assert bake["compiles"] == 9 and bake["autotunes"] == 2
    seeded = _cli("build", "--target", "sm_90", "--root", str(tmp_path / "b"), "--out", str(tmp_path / "art2"),
                  "--seed", str(tmp_path / "art1"), "--jobs", "2", "--json", *ALLOW_KERNELS, *warmup)
    assert seeded.returncode == 0, seeded.stderr
    out = json.loads(seeded.stdout)
    bake = out["bake"]
    # round 1 already hits everything, autotune results included: the seeded rounds compile nothing: the first two quiet rounds make the fixed point
    assert bake["rounds"] == bake["quiet_rounds"] == 2
    assert bake["compiles"] == 0 and bake["autotunes"] == 0
    seed = bake["seed"]
    assert seed["compiled"] == 9 and seed["autotune_carried"] == 2 and seed["problems"] == []
    assert out["record"]["mediaType"] == "application/vnd.cachebake.compile-record.v1+json"
