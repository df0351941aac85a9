"""The layered cache manager, with real sm_90 cache entries compiled on this CPU machine.

A "miss" here is a real ``triton.compile`` for a GPUTarget under the manager, in a fresh
process configured by environment only, as a server started from ``install --overlay`` is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import aot
import pytest
import servekit
from conftest import as_nobody

from cachebake.serve import layered, misslog

IN_BAKE = aot.SPECS[0]  # add_kernel fp32 BLOCK=1024: in the triton_cache fixture
OTHER_IN_BAKE = aot.SPECS[4]  # rowsum_kernel, also there
NOT_IN_BAKE = ["add_kernel", aot.SPECS[0][1], {"BLOCK": 2048}, {}, {}]
ALSO_NOT_IN_BAKE = ["rowsum_kernel", aot.SPECS[4][1], {"N": 256}, {}, {"num_warps": 4}]


@pytest.fixture
def triton_knobs(monkeypatch):
    """Triton's cache knobs for an in-process test, restored after (Triton's own scope)."""
    import triton

    for var in ("TRITON_CACHE_MANAGER", "CACHEBAKE_OVERLAY_DIR", "CACHEBAKE_MISS_LOG"):
        monkeypatch.delenv(var, raising=False)
    with triton.knobs.cache.scope():
        yield triton.knobs


def _groups(cache: Path):
    for grp in sorted(cache.glob("*/__grp__*.json")):
        yield grp.parent.name, grp.name[len("__grp__"):]


def test_hits_return_what_triton_returns(triton_cache, triton_knobs, tmp_path, monkeypatch):
    from triton.runtime.cache import FileCacheManager

    triton_knobs.cache.dir = str(triton_cache)
    monkeypatch.setenv("CACHEBAKE_OVERLAY_DIR", str(tmp_path / "overlay"))
    checked = 0
    for key, name in _groups(triton_cache):
        theirs = FileCacheManager(key).get_group(name)
        ours = layered.LayeredCacheManager(key).get_group(name)
        # Same files, same bytes; ours in the tree it reads (the fixture's copy kept the
        # group files' paths to where it was built, which Triton follows).
        assert set(ours) == set(theirs) and name in ours
        for child, path in ours.items():
            assert Path(path).parent == triton_cache / key
            assert Path(path).read_bytes() == Path(theirs[child]).read_bytes()
        checked += 1
    assert checked == len(aot.SPECS)
    (tuned,) = triton_cache.glob("*/*.autotune.json")
    mgr = layered.LayeredCacheManager(tuned.parent.name)
    assert mgr.get_file(tuned.name) == FileCacheManager(tuned.parent.name).get_file(tuned.name)
    assert not (tmp_path / "overlay").exists()  # hits write nothing, not even the overlay dir


def test_hits_wherever_the_bake_is_mounted(triton_cache, triton_knobs, tmp_path):
    """A packed layer's group files name the layer root (pack rewrites them, with this very
    function); an image volume mounted elsewhere, without install, keeps them.  Triton's own
    manager then misses every kernel; the layered one hits them all."""
    from triton.runtime.cache import FileCacheManager

    mounted = tmp_path / "mounted" / "triton"
    shutil.move(str(triton_cache), mounted)
    servekit.relocate(mounted, "/var/cache/cachebake/triton")
    triton_knobs.cache.dir = str(mounted)
    for key, name in _groups(mounted):
        assert name not in (FileCacheManager(key).get_group(name) or {})  # Triton: a miss
        ours = layered.LayeredCacheManager(key).get_group(name)
        assert ours[name] == str(mounted / key / name)
        assert all(Path(p).parent == mounted / key for p in ours.values())


def test_triton_reads_judge_as_triton_does(installed, triton_knobs, tmp_path, monkeypatch):
    """verify's mode (CACHEBAKE_LAYERED_READS=triton): the baked tree read as Triton's own
    manager reads it, so a bake that only the layered manager would hit is a miss there."""
    from triton.runtime.cache import FileCacheManager

    monkeypatch.setenv("CACHEBAKE_LAYERED_READS", "triton")
    triton_knobs.cache.dir = str(installed)
    for key, name in _groups(installed):  # group files name where the tree is: both hit
        assert layered.LayeredCacheManager(key).get_group(name) == FileCacheManager(key).get_group(name)
    moved = tmp_path / "moved"
    shutil.move(str(installed), moved)  # group files now name a path that is gone
    triton_knobs.cache.dir = str(moved)
    for key, name in _groups(moved):
        assert layered.LayeredCacheManager(key).get_group(name) is None


def test_incomplete_group_is_a_miss_not_a_crash(installed, tmp_path):
    """A bake whose group names a missing cubin crashes Triton 3.6 on load; the layered
    manager treats it as a miss and recompiles into the overlay."""
    key_dir = next(d for d in installed.iterdir() if (d / "add_kernel.cubin").exists()
                   and json.loads((d / "add_kernel.json").read_text())["num_warps"] == 4)
    (key_dir / "add_kernel.cubin").unlink()
    plain = servekit.run_server([IN_BAKE], servekit.serve_env(installed))
    assert plain["error"] and "KeyError" in plain["error"]  # Triton's own manager crashes
    out = servekit.run_server([IN_BAKE], servekit.serve_env(installed, tmp_path / "ovl"))
    assert out["error"] is None and out["cache_hits"] == [False]
    assert (tmp_path / "ovl" / "triton" / key_dir.name / "add_kernel.cubin").exists()
    assert not (key_dir / "add_kernel.cubin").exists()


@pytest.mark.slow
def test_read_only_bake_as_nobody(installed, public_tmp):
    """The scenario that killed the server on the H200: the installed tree read-only, used by
    uid 65534.  Triton's manager raises PermissionError at the first kernel the bake lacks;
    the layered one serves it from the overlay, logs it, and leaves the tree byte-identical."""
    base = public_tmp / "bake" / "triton"
    servekit.relocate(Path(shutil.copytree(installed, base)))
    os.system(f"chmod -R a-w,a+rX {public_tmp / 'bake'}")
    before = servekit.tree_state(base)
    overlay = public_tmp / "overlay"
    overlay.mkdir()
    os.chown(overlay, 65534, 65534)

    plain = servekit.run_server([IN_BAKE, NOT_IN_BAKE], servekit.serve_env(base), runner=as_nobody)
    assert plain["error"] and "PermissionError" in plain["error"]

    specs = [IN_BAKE, NOT_IN_BAKE, ALSO_NOT_IN_BAKE, NOT_IN_BAKE]
    env = servekit.serve_env(base, overlay, POD_NAME="vllm-0", POD_NAMESPACE="serving")
    out = servekit.run_server(specs, env, runner=as_nobody)
    assert out["rc"] == 0 and out["error"] is None, out["stderr"]
    assert out["cache_hits"] == [True, False, False, True]
    assert servekit.tree_state(base) == before
    missed = out["compiles"][1]
    assert all(p.startswith(str(overlay / "triton" / missed["key"])) for p in missed["paths"])
    lines = servekit.miss_lines(overlay / "misses.jsonl")
    assert [(m["kind"], m["kernel"]) for m in lines] == [("kernel", "add_kernel"), ("kernel", "rowsum_kernel")]
    first = lines[0]
    assert first["key"] == missed["key"] and first["stored"] == "overlay"
    assert first["pod"] == "vllm-0" and first["namespace"] == "serving" and first["seconds"] > 0
    rec = first["record"]
    assert rec["constexprs"] == [[[4], 2048]] and rec["kernel"]["module"] == "aot"
    assert rec["target"] == "cuda:90" and rec["options"]["num_warps"] == 4
    assert rec["signature"][0] == ["x_ptr", "*fp32"]  # argument order, as the key hashes it
    from triton.runtime.cache import _base32
    assert _base32(rec["hash"]) == first["key"]

    again = servekit.run_server(specs, env, runner=as_nobody)  # a second worker: overlay hits
    assert again["cache_hits"] == [True, True, True, True]
    assert len(servekit.miss_lines(overlay / "misses.jsonl")) == 2


def test_writable_bake_is_not_written_either(installed, tmp_path):
    """Read-only is not what keeps the bake intact: a writable one is left as it was too."""
    before = servekit.tree_state(installed)
    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE, ALSO_NOT_IN_BAKE],
                              servekit.serve_env(installed, tmp_path / "ovl"))
    assert out["cache_hits"] == [True, False, False] and out["error"] is None, out["stderr"]
    assert servekit.tree_state(installed) == before
    assert len(servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")) == 2


@pytest.mark.parametrize("overlay", ["unset", "unwritable", "foreign"])
def test_no_usable_overlay_spills_and_logs_to_stderr(installed, public_tmp, overlay):
    """No overlay, one of ours that cannot be written (mode 0555), or one another uid made
    (root's, for a server of uid 65534): the misses spill, the log is stderr, the server goes
    on, and the overlay is left as it was."""
    base = public_tmp / "triton"
    servekit.relocate(Path(shutil.copytree(installed, base)))
    os.system(f"chmod -R a-w,a+rX {base}")
    given = public_tmp / "given"
    env = servekit.serve_env(base, None if overlay == "unset" else given)
    if overlay == "unset":
        env["TRITON_CACHE_MANAGER"] = "cachebake.serve.layered:LayeredCacheManager"
    else:
        given.mkdir(mode=0o755)
        if overlay == "unwritable":
            os.chown(given, 65534, 65534)
            given.chmod(0o555)
    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE, NOT_IN_BAKE], env, runner=as_nobody)
    assert out["rc"] == 0 and out["error"] is None, out["stderr"]
    assert out["cache_hits"] == [True, False, True]  # the 2nd call hits this process's spill
    assert "/cachebake-spill-" in out["compiles"][1]["paths"][0]
    (line,) = [ln for ln in out["stderr"].splitlines() if ln.startswith("cachebake: miss: ")]
    entry = json.loads(line[len("cachebake: miss: "):])
    assert entry["stored"] == "spill" and entry["kernel"] == "add_kernel" and entry["record"]
    assert not os.path.exists(out["compiles"][1]["paths"][0])  # the spill went with the process
    said = [ln for ln in out["stderr"].splitlines() if not ln.startswith("cachebake: miss: ")]
    if overlay == "unwritable":
        assert said and all("cannot be written (Permission denied)" in ln for ln in said), said
    if overlay == "foreign":
        assert said == [f"cachebake: the overlay {given} is refused: it is owned by uid 0, not this "
                        f"process's uid 65534; pid {entry['pid']} keeps its misses in a private spill "
                        "(recompiled by each process) and logs them to stderr unless "
                        "CACHEBAKE_MISS_LOG is outside the overlay"]
    if overlay != "unset":
        assert not any(given.iterdir())


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 24 KiB tmpfs: one kernel's files do not fit (a full emptyDir).  Mode 0700: a tmpfs is
    1777 by default, which the layered manager refuses as an overlay (anyone could plant an
    entry in it)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k,mode=0700", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and a mountable tmpfs to fill an overlay")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_full_overlay_spills_mid_kernel(installed, tiny_tmpfs):
    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE, NOT_IN_BAKE],
                              servekit.serve_env(installed, tiny_tmpfs))
    assert out["rc"] == 0 and out["error"] is None, out["stderr"]
    assert out["cache_hits"] == [True, False, True]
    paths = out["compiles"][1]["paths"]
    assert any(p.startswith(str(tiny_tmpfs)) for p in paths)  # the first files fit...
    assert any("/cachebake-spill-" in p for p in paths)  # ...the rest spilled
    assert "No space left" in out["stderr"]


def test_launcher_helper_builds_through_the_overlay(tmp_path, triton_knobs, monkeypatch):
    """Triton's gcc helper path (runtime/build.py compile_module_from_src, which builds
    cuda_utils and __triton_launcher) with a real C module: the .so lands in the overlay, is
    logged, loads, and is a hit next time.  (cuda_utils itself links libcuda: GPU only.)"""
    from triton.runtime.build import compile_module_from_src

    src = ("#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"cb_probe\"};\n"
           "PyMODINIT_FUNC PyInit_cb_probe(void) { return PyModule_Create(&m); }\n")
    triton_knobs.cache.dir = str(tmp_path / "bake")
    triton_knobs.cache.manager_class = layered.LayeredCacheManager
    monkeypatch.setenv("CACHEBAKE_OVERLAY_DIR", str(tmp_path / "ovl"))
    mod = compile_module_from_src(src, "cb_probe")
    assert mod.__file__.startswith(str(tmp_path / "ovl" / "triton"))
    (line,) = servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")
    assert line["kind"] == "helper" and line["kernel"] == "cb_probe" and line["seconds"] > 0
    assert compile_module_from_src(src, "cb_probe").__file__ == mod.__file__
    assert len(servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")) == 1
    assert not (tmp_path / "bake").exists()


def test_autotune_result_goes_to_the_overlay(tmp_path, triton_knobs, monkeypatch):
    """The calls Autotuner.check_disk_cache makes (get_file, then put after benchmarking);
    benchmarking itself needs a GPU, the cache traffic does not."""
    monkeypatch.setenv("CACHEBAKE_OVERLAY_DIR", str(tmp_path / "ovl"))
    triton_knobs.cache.dir = str(tmp_path / "bake")
    mgr = layered.LayeredCacheManager("A" * 52)
    assert mgr.get_file("ssd_kernel.autotune.json") is None
    timings = [[{"kwargs": {"BLOCK": 64}, "num_warps": 4}, [0.02, 0.019, 0.021]]]
    path = mgr.put(json.dumps({"key": [4096, "torch.bfloat16"], "configs_timings": timings}),
                   "ssd_kernel.autotune.json", binary=False)
    assert path == str(tmp_path / "ovl" / "triton" / ("A" * 52) / "ssd_kernel.autotune.json")
    (line,) = servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")
    assert line["kind"] == "autotune" and line["tuning_key"] == [4096, "torch.bfloat16"]
    assert line["timings"] == timings and line["configs"] == [timings[0][0]]
    assert layered.LayeredCacheManager("A" * 52).get_file("ssd_kernel.autotune.json") == path


def test_dump_and_override_modes_are_tritons(tmp_path, triton_knobs, monkeypatch):
    triton_knobs.cache.dump_dir = str(tmp_path / "dump")
    mgr = layered.LayeredCacheManager("K" * 52, dump=True)
    assert mgr.put(b"x", "k.ttir").startswith(str(tmp_path / "dump"))


def test_activate_without_the_variable(tmp_path):
    """The vLLM plugin path: only CACHEBAKE_OVERLAY_DIR set; register() turns the manager on,
    and the monitor, when also on, wraps it instead of replacing it."""
    code = ("import triton; from cachebake.serve import vllm_plugin; vllm_plugin.register();"
            "m = triton.knobs.cache.manager_class; print(m.__name__, [c.__name__ for c in m.__mro__][:3])")
    env = servekit.serve_env(tmp_path / "bake", None, CACHEBAKE_OVERLAY_DIR=tmp_path / "ovl")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split()[0] == "LayeredCacheManager", out.stderr
    env["CACHEBAKE_MONITOR_LOG"] = str(tmp_path / "events.jsonl")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "MonitoredLayeredCacheManager" in out.stdout and "'LayeredCacheManager'" in out.stdout, out.stderr
    quiet = subprocess.run([sys.executable, "-c", "import sys; from cachebake.serve import vllm_plugin;"
                            "vllm_plugin.register(); print('triton' in sys.modules)"],
                           env=servekit.serve_env(tmp_path), capture_output=True, text=True)
    assert quiet.stdout.strip() == "False"  # inert without the variables: no Triton import


def test_spill_is_removed_only_by_its_process(tmp_path):
    spill = layered._Spill()
    path = spill.write("K" * 52, "k.cubin", b"x")
    assert Path(path).read_bytes() == b"x" and spill.path("K" * 52, "k.cubin") == path
    spill._pid = -1  # as a forked child sees it
    spill.remove()
    assert Path(path).exists()
    spill._pid = os.getpid()
    spill.remove()
    assert not Path(path).exists() and spill.path("K" * 52, "k.cubin") is None


def test_listener_chain_installs_once():
    import triton

    saved = triton.knobs.compilation.listener
    try:
        triton.knobs.compilation.listener = None
        misslog.install_listener()
        first = triton.knobs.compilation.listener
        misslog.install_listener()
        assert triton.knobs.compilation.listener is first
    finally:
        triton.knobs.compilation.listener = saved


def _in_bake_key_dir(cache: Path) -> Path:
    """IN_BAKE's key dir (add_kernel fp32: num_warps 4; the fp16 one has 8)."""
    return next(d for d in cache.iterdir() if (d / "add_kernel.cubin").exists()
                and json.loads((d / "add_kernel.json").read_text())["num_warps"] == 4)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    os.symlink("/dev/zero", path)


# corruption -> (what it does to a key dir of add_kernel, what the miss line's reason says)
CORRUPTIONS = {
    "truncated metadata": (lambda d: _truncate(d / "add_kernel.json"),
                           "add_kernel.json metadata unreadable (not valid JSON"),
    "FIFO group file": (lambda d: _fifo(d / "__grp__add_kernel.json"),
                        "__grp__add_kernel.json is a FIFO, not a regular file"),
    "FIFO metadata": (lambda d: _fifo(d / "add_kernel.json"), "add_kernel.json is a FIFO, not a regular file"),
    "FIFO cubin": (lambda d: _fifo(d / "add_kernel.cubin"), "add_kernel.cubin is a FIFO, not a regular file"),
    "/dev/zero metadata link": (lambda d: _dev_zero(d / "add_kernel.json"), "add_kernel.json is a symbolic link"),
    "/dev/zero cubin link": (lambda d: _dev_zero(d / "add_kernel.cubin"), "add_kernel.cubin is a symbolic link"),
    "metadata without a target": (
        lambda d: (d / "add_kernel.json").write_text(json.dumps(
            {k: v for k, v in json.loads((d / "add_kernel.json").read_text()).items() if k != "target"})),
        "add_kernel.json metadata unreadable (no target backend, arch and warp_size)"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_bad_baked_entry_is_a_miss(installed, tmp_path, corruption):
    """A corrupt or partial entry in the baked tree: a miss (no exception, no hang: the test's
    timeout), its line saying why, recompiled into the overlay, whose good entry then shadows
    the bad one; the bake itself is never written."""
    corrupt, reason = CORRUPTIONS[corruption]
    key_dir = _in_bake_key_dir(installed)
    corrupt(key_dir)
    before = servekit.tree_state(installed)
    if corruption == "truncated metadata":  # what Triton's own manager does with it
        plain = servekit.run_server([IN_BAKE], servekit.serve_env(installed), timeout=120)
        assert plain["error"] and "JSONDecodeError" in plain["error"]
    env = servekit.serve_env(installed, tmp_path / "ovl")
    # A hit first: the compile that imports cachebake.serve is one its listener cannot see
    # (compile() reads the listener before it asks for a cache manager; on a GPU the driver's
    # cuda_utils helper is that first call).
    out = servekit.run_server([OTHER_IN_BAKE, IN_BAKE, IN_BAKE], env, timeout=120)
    assert out["rc"] == 0 and out["error"] is None, out["stderr"]
    assert out["cache_hits"] == [True, False, True]  # the 3rd lookup: the overlay's entry
    assert all(p.startswith(f"{tmp_path}/ovl/triton/{key_dir.name}/") for p in out["compiles"][2]["paths"])
    (line,) = servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")
    assert line["kernel"] == "add_kernel" and line["key"] == key_dir.name and line["record"]
    assert line["reason"].startswith("bake: ") and reason in line["reason"], line["reason"]
    assert servekit.tree_state(installed) == before
    again = servekit.run_server([IN_BAKE], env, timeout=120)  # another process of the pod
    assert again["cache_hits"] == [True] and again["error"] is None, again["stderr"]
    assert len(servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")) == 1


@pytest.mark.parametrize("corruption", ["truncated metadata", "FIFO group file", "/dev/zero cubin link"])
def test_bad_overlay_entry_is_a_miss(installed, tmp_path, corruption):
    """The same in the overlay (a pod's process killed mid-write on a filesystem without
    atomic rename, a disk error): a logged miss, recompiled over the bad entry."""
    corrupt, reason = CORRUPTIONS[corruption]
    env = servekit.serve_env(installed, tmp_path / "ovl")
    first = servekit.run_server([NOT_IN_BAKE], env)
    key = first["compiles"][0]["key"]
    corrupt(tmp_path / "ovl" / "triton" / key)
    out = servekit.run_server([OTHER_IN_BAKE, NOT_IN_BAKE], env, timeout=120)
    assert out["rc"] == 0 and out["error"] is None and out["cache_hits"] == [True, False], out["stderr"]
    assert out["compiles"][1]["cubin_sha256"] == first["compiles"][0]["cubin_sha256"]
    lines = servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")
    assert [m["key"] for m in lines] == [key, key] and "reason" not in lines[0]
    assert lines[1]["reason"].startswith("overlay: ") and reason in lines[1]["reason"], lines[1]["reason"]
    again = servekit.run_server([NOT_IN_BAKE], env, timeout=120)
    assert again["cache_hits"] == [True] and again["error"] is None, again["stderr"]


def test_verify_reads_a_truncated_metadata_as_a_miss(installed, triton_knobs, monkeypatch):
    """verify's mode (Triton's own reads) on the same bad entry: a miss, not the server's
    JSONDecodeError."""
    monkeypatch.setenv("CACHEBAKE_LAYERED_READS", "triton")
    triton_knobs.cache.dir = str(installed)
    key_dir = _in_bake_key_dir(installed)
    _truncate(key_dir / "add_kernel.json")
    mgr = layered.LayeredCacheManager(key_dir.name)
    assert mgr.get_group("add_kernel.json") is None
    assert "metadata unreadable (not valid JSON" in mgr._reason()


@pytest.mark.parametrize("result, reason", [
    (b'{"key": [4096], "configs_timi', "not valid JSON"),
    (json.dumps({"key": [1], "configs_timings": [[{"kwargs": {"BLOCK": 64}, "num_warps": 4,
                                                   "ir_override": "/etc/shadow"}, [0.1]]]}).encode(),
     "names a pre_hook or an IR override file"),
    (json.dumps({"key": [1], "configs_timings": [[{"kwargs": {"BLOCK": [64]}}, 0.1]]}).encode(),
     "a config value is not a scalar"),
    (json.dumps({"key": [1], "configs_timings": [[{"kwargs": {}}, 0.1], [{"kwargs": {}}, [0.2]]]}).encode(),
     "timings of two kinds"),
])
def test_bad_autotune_result_is_a_miss(installed, triton_knobs, tmp_path, monkeypatch, result, reason):
    """What Autotuner.check_disk_cache would raise on (or be steered by: an IR override file
    Triton would read as the kernel) is a miss: benchmarked again, logged with the reason."""
    (tuned,) = installed.glob("*/*.autotune.json")
    assert layered.autotune_problem(tuned.read_bytes()) is None  # what Triton writes passes
    tuned.write_bytes(result)
    triton_knobs.cache.dir = str(installed)
    monkeypatch.setenv("CACHEBAKE_OVERLAY_DIR", str(tmp_path / "ovl"))
    mgr = layered.LayeredCacheManager(tuned.parent.name)
    assert mgr.get_file(tuned.name) is None
    good = json.dumps({"key": [1], "configs_timings": [[{"kwargs": {"BLOCK": 64}}, [0.1]]]})
    path = mgr.put(good, tuned.name, binary=False)
    (line,) = servekit.miss_lines(tmp_path / "ovl" / "misses.jsonl")
    assert line["kind"] == "autotune" and reason in line["reason"] and line["reason"].startswith("bake: ")
    assert layered.LayeredCacheManager(tuned.parent.name).get_file(tuned.name) == path
    assert tuned.read_bytes() == result  # the bake is never written


def test_spilled_group_names_only_the_spill_or_the_usable_overlay(tmp_path):
    """A kernel spilled mid-way keeps children the overlay took before it filled up; once the
    overlay is refused (renamed, replaced), a spilled group naming it is a miss."""
    spill = layered._Spill()
    key = "K" * 52
    cubin = spill.write(key, "k.cubin", b"x")
    in_overlay = tmp_path / "ovl" / "triton" / key / "k.ttir"
    in_overlay.parent.mkdir(parents=True)
    in_overlay.write_text("ir")
    group = {"k.json": spill.write(key, "k.json", b"{}"), "k.cubin": cubin, "k.ttir": str(in_overlay)}
    spill.write(key, "__grp__k.json", json.dumps({"child_paths": group}).encode())
    try:
        assert spill.group(key, "k.json", f"{tmp_path}/ovl/triton/{key}/") == group
        assert spill.group(key, "k.json", None) is None
    finally:
        spill.remove()


def test_the_manager_imports_with_the_standard_library_and_triton_alone():
    """A stock serving image has Triton but none of cachebake's own dependencies (the
    image-volume pattern copies cachebake's sources onto PYTHONPATH, nothing else): the manager
    TRITON_CACHE_MANAGER names must import there.  Found by podman: it pulled in install/,
    hence zstandard."""
    code = ("import builtins\nreal = builtins.__import__\n"
            "def guarded(name, *a, **k):\n"
            "    if name.split('.')[0] in ('zstandard', 'click', 'rich', 'yaml'):\n"
            "        raise ModuleNotFoundError(f'no {name} in a serving image')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = guarded\n"
            "import cachebake.serve.layered, cachebake.serve.vllm_plugin\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(servekit.REPO)}, cwd="/")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
