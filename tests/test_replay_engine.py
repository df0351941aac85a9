"""Record real JIT launches, replay them for sm_90, sm_100 and sm_120 on this CPU machine, and
check the result against Triton's own JIT for the same launches under each target: same keys,
cubins for the right arch, the same launcher helpers, and a JIT that then compiles nothing.

The JIT runs with tests/kit/jit_launch.py's stand-in driver (Triton's own way to swap the active
driver); it stands in for the GPU runtime only: specialization, keys, compiles and autotune
files are Triton's.  Every launch runs in a fresh subprocess so nothing is cached in memory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import servekit

from cachebake.capture.recorder import load_record_log
from cachebake.errors import Unsupported
from cachebake.replay.engine import compile_record, load_record, replay

pytestmark = pytest.mark.slow  # real compiles in subprocesses: ~1 min on 2 cores

REPO = Path(__file__).resolve().parent.parent
TESTS = servekit.kernels_dir()  # where every process of the session imports the test kernels
# The test kernels' modules: a record may name only these beyond vllm and triton (--allow-module)
KERNEL_MODULES = ("aot_kernels", "replay_kernels")
ALLOW_KERNELS = [arg for m in KERNEL_MODULES for arg in ("--allow-module", m)]

_CHILD = r"""
import json, os, sys
sys.path[:0] = [{tests!r}, {repo!r}]
import triton
if os.environ.get("RECORD_LOG"):
    from cachebake.capture import monitor
    monitor.activate(os.environ["RECORD_LOG"])
helper_keys = []
if os.environ.get("HELPER_KEYS"):  # Triton's own launcher, keyed as it keys it; not built
    import hashlib, types
    from triton.backends.nvidia import driver as nv
    from triton.runtime.build import platform_key
    def fake_build(src, name, **kw):
        helper_keys.append(hashlib.sha256((src + platform_key()).encode()).hexdigest())
        return types.SimpleNamespace(launch=lambda *a: None)  # no GPU to launch on
    nv.compile_module_from_src = fake_build
    nv.library_dirs = lambda: []  # linking is what needs libcuda; nothing is linked here
import jit_launch
if os.environ.get("HELPER_KEYS"):
    jit_launch.TargetDriver.launcher_cls = nv.CudaLauncher
events = []
previous = triton.knobs.compilation.listener
def listener(*, src, metadata, metadata_group, times, cache_hit):
    t = metadata["target"]
    events.append([metadata["hash"], bool(cache_hit), t.arch if hasattr(t, "arch") else t["arch"]])
    if previous is not None:
        previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)
triton.knobs.compilation.listener = listener
jit_launch.warmup(int(os.environ["ARCH"]))
import replay_kernels
result = {{"events": events, "helper_keys": helper_keys,
          "benchmarked": "bench_time" in vars(replay_kernels.tuned_kernel)}}
if os.environ.get("PROBE_VLLM"):  # a stand-in vllm.platforms.cuda: what host code would ask
    sys.path.insert(0, os.environ["PROBE_VLLM"])
    from vllm.platforms.cuda import NvmlCudaPlatform as P
    result["platform"] = [P.get_device_name(), list(P.get_device_capability())]
print(json.dumps(result))
"""


def jit_warmup(cache: Path, arch: int, **env) -> dict:
    """tests/kit/jit_launch.py's launches in a fresh process against ``cache``."""
    code = _CHILD.format(tests=str(TESTS), repo=str(REPO))
    full = {**os.environ, "TRITON_CACHE_DIR": str(cache), "TRITON_CACHE_AUTOTUNING": "1", "ARCH": str(arch),
            **{k: str(v) for k, v in env.items()}}
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def kernel_dirs(cache: Path) -> set[str]:
    return {p.parent.name for p in cache.glob("*/__grp__*.json")}


def autotune_dirs(cache: Path) -> set[str]:
    return {p.parent.name for p in cache.glob("*/*.autotune.json")}


def b32(hex_key: str) -> str:
    return base64.b32encode(bytes.fromhex(hex_key)).decode().rstrip("=")


def cubin_targets(cache: Path) -> set[str]:
    """``.target`` of every cubin, as NVIDIA's cuobjdump (bundled with Triton) reads it."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    found = set()
    for cubin in cache.glob("*/*.cubin"):
        out = subprocess.run([str(tool), "--dump-elf", str(cubin)], capture_output=True, text=True)
        found |= set(re.findall(r"^\.target (sm_\d+a?)", out.stdout, re.M))
    return found


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A bake's record: the warmup's launches on sm_90, under the compile monitor."""
    d = tmp_path_factory.mktemp("record")
    run = jit_warmup(d / "cache", 90, RECORD_LOG=d / "events.jsonl")
    assert run["benchmarked"] and not any(hit for _, hit, _ in run["events"])
    return d


@pytest.fixture(scope="module")
def record(recorded):
    return load_record_log(recorded / "events.record.jsonl")


def test_the_record_holds_every_launch_verified(record, recorded):
    s = record.summary()
    assert s["compiles"] == 9 and s["kernels"] == 3 and s["unverified"] == 0
    assert s["modules"] == ["aot_kernels", "replay_kernels"]
    # two tuning keys (fp32, bf16), each with its 3 benchmarked candidates and their timings
    assert [len(a.configs) for a in record.autotune] == [3, 3]
    assert all(len(a.compiles) == 3 and len(a.timings) == 3 for a in record.autotune)
    # the recorded result hashes are where Triton wrote the autotune files
    assert {b32(a.result_hash) for a in record.autotune} == autotune_dirs(recorded / "cache")


@pytest.mark.parametrize("arch", [90, 100, 120])
def test_replayed_keys_equal_the_jits_keys_for_each_target(record, tmp_path, arch):
    replayed = tmp_path / "replayed"
    res = compile_record(record, f"sm_{arch}", replayed, jobs=2, allow_modules=KERNEL_MODULES)
    assert res.problems == [] and res.compiled == 9
    # same Triton build as the recording: on sm_90 each key was checked against the recorded one
    assert res.same_triton_build and res.key_mismatches == 0
    reference = jit_warmup(tmp_path / "jit", arch, HELPER_KEYS=1)
    jit_hashes = {h for h, _, _ in reference["events"]}
    assert {s.hash for s in res.replayed} == jit_hashes
    assert kernel_dirs(replayed) == kernel_dirs(tmp_path / "jit") == {b32(h) for h in jit_hashes}
    assert cubin_targets(replayed) == {f"sm_{arch}a"}
    # launcher helpers under the keys Triton's own CudaLauncher computes for these kernels
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    helpers = {p.parent.name for p in replayed.glob(f"*/*{suffix}")}
    assert {b32(k) for k in reference["helper_keys"]} <= helpers
    assert len(helpers) == len(set(reference["helper_keys"])) + 1  # + cuda_utils
    # Built with no libcuda here, each helper still names the driver's library: without that
    # entry it fails to load on a GPU server ("undefined symbol: cuFuncSetAttribute") and Triton
    # rebuilds it at the first launch (seen on an H200 before worker._stub_libcuda defined the
    # symbols; gcc's --as-needed drops a stub that defines nothing).
    for so in replayed.glob(f"*/*{suffix}"):
        dynamic = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True,
                                 check=True).stdout
        assert "Shared library: [libcuda.so.1]" in dynamic, so.name
    # autotune results travel only to the target they were measured on
    if arch == 90:
        assert res.autotune_carried == 2 and autotune_dirs(replayed) == autotune_dirs(tmp_path / "jit")
    else:
        assert res.autotune_carried == 0 and res.autotune_not_carried == 2 and not autotune_dirs(replayed)
    # the first launches against the replayed cache compile nothing; on another target the
    # autotuner benchmarks, and every candidate it benchmarks hits
    again = jit_warmup(replayed, arch)
    assert again["events"] and all(hit for _, hit, _ in again["events"])
    assert again["benchmarked"] == (arch != 90)


def test_candidates_missing_from_the_record_are_derived_from_the_autotune_configs(recorded, tmp_path):
    # A second run against the warm cache reads the autotune results from disk, so only the
    # best config of each key is compiled (and recorded).
    cache = tmp_path / "cache"
    shutil.copytree(recorded / "cache", cache)
    run = jit_warmup(cache, 90, RECORD_LOG=tmp_path / "events.jsonl")
    assert not run["benchmarked"]
    rec = load_record_log(tmp_path / "events.record.jsonl")
    assert [len(a.compiles) for a in rec.autotune] == [1, 1] and len(rec.compiles) == 5
    res = compile_record(rec, "sm_120", tmp_path / "replayed", jobs=2, allow_modules=KERNEL_MODULES)
    assert res.problems == [] and res.derived == 4 and res.compiled == 9
    again = jit_warmup(tmp_path / "replayed", 120)
    assert again["benchmarked"] and all(hit for _, hit, _ in again["events"])


def test_what_cannot_be_replayed_is_reported_and_nothing_is_written(record, recorded, tmp_path):
    rec = load_record_log(recorded / "events.record.jsonl")
    rec.compiles[0].kernel = type(rec.compiles[0].kernel)("no_such_module_xyz", "k", "k", "0" * 64)
    edited = rec.compiles[1].kernel
    rec.compiles[1].kernel = type(edited)(edited.module, edited.qualname, edited.name, "f" * 64)
    path = tmp_path / "record.json"
    path.write_bytes(rec.to_json())
    out = tmp_path / "art"
    allowed = [*KERNEL_MODULES, "no_such_module_xyz"]  # listed, so it is tried (and fails to import)
    with pytest.raises(Unsupported) as err:
        replay(path, target="sm_90", out=out, jobs=2, allow_modules=allowed)
    problems = err.value.report.result.problems
    assert any("no_such_module_xyz" in p and "does not import" in p for p in problems)
    assert any("source differs from the recorded kernel" in p for p in problems)
    assert not out.exists()
    report = replay(path, target="sm_90", out=out, jobs=2, partial=True, allow_modules=allowed)
    assert not report.ok and report.result.compiled == 7
    manifest = json.loads((out / "cachebake.json").read_text())["bakes"]["cuda:90"]
    assert len(manifest["bake"]["replay"]["problems"]) == 2


def test_cli_replays_a_record_into_an_artifact_marked_unverified(recorded, tmp_path):
    out = tmp_path / "art"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    run = subprocess.run([sys.executable, "-m", "cachebake.cli", "replay", str(recorded / "events.record.jsonl"),
                          "--target", "sm_120", "--out", str(out), "--jobs", "2", "--json", *ALLOW_KERNELS],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["target"] == "cuda:120" and report["compiled"] == 9
    index = json.loads((out / "index.json").read_text())
    assert index["manifests"][0]["annotations"]["dev.cachebake.unverified-on-target"] == "replay"
    inspected = subprocess.run([sys.executable, "-m", "cachebake.cli", "inspect", str(out), "--json"],
                               env=env, capture_output=True, text=True, timeout=120)
    bake = json.loads(inspected.stdout)["bakes"][0]
    assert bake["record"]["targets"] == ["cuda:120", "cuda:90"] and bake["record"]["compiles"] == 18
    # the artifact's record replays again (an artifact is a record source too)
    assert load_record(out).record.summary()["compiles"] == 18


def test_a_missing_source_is_bad_input(tmp_path):
    from cachebake.errors import BadInput

    with pytest.raises(BadInput):
        load_record(tmp_path / "nope")


def test_helper_cache_keys_match_tritons_build_function():
    """cuda_utils: the key replay uses is runtime/build.py's: sha256(source + platform)."""
    from triton.runtime.build import platform_key

    from cachebake.replay import worker

    src = worker.cuda_utils_source()
    assert "PyInit_cuda_utils" in src
    key = hashlib.sha256((src + platform_key()).encode()).hexdigest()
    assert len(key) == 64
