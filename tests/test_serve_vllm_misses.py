"""The vllm role's serve-time misses: torch.compile dirs a server wrote that its bake lacked.

A real vLLM 0.24 role (tests/data's H200 excerpt) packed with real sm_90 Triton entries,
installed; the "server" then writes new torch.compile dirs the shape vLLM writes (their bytes
are opaque to cachebake); the exit hook and `cachebake misses --vllm-cache` log them (names,
counts, flags; never bytes), and hostile trees (links, FIFOs, odd names, huge or deep trees)
are refused, exit 6, nothing followed or logged.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from cachebake.artifact.pack import CacheRoot, pack_artifact
from cachebake.cli import main
from cachebake.install import install_artifact
from cachebake.replay.misses import MissReport, line_problem, merge, read_lines
from cachebake.serve import vllm_misses as vm

EXCERPT = Path(__file__).parent / "data" / "vllm-0.24-h200-compile-cache-excerpt.tar.zst"
BAKE_ROOT = "/var/cache/cachebake"
BAKED_BACKEND = "torch_compile_cache/b5f17cf9b9/rank_0_0/backbone"
NEW_BACKEND = "torch_compile_cache/0123456789/rank_0_0/backbone"
NEW_AOT = "torch_compile_cache/torch_aot_compile/" + "ab" * 32
SERVER_ARGV = ["/usr/local/bin/vllm", "serve", "/models/nemotron-h-8b", "--max-num-seqs", "64",
               "--mamba-ssm-cache-dtype", "bfloat16"]
SECRET = b"OPAQUE-PICKLE-BYTES-\x80\x04"  # what the server wrote: never in a log


def vllm_tree(dest: Path) -> Path:
    """tests/data's excerpt of a real vllm role, unpacked to ``dest/vllm``."""
    raw = zstandard.ZstdDecompressor().stream_reader(EXCERPT.open("rb")).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for m in tar:
            if m.isfile():
                p = dest / m.name
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(tar.extractfile(m).read())
    return dest / "vllm"


BAKE_SECTION = {"driver": "vllm", "model": {"recipe": "nemotron-h", "path": "/models/nemotron-h-8b"},
                "serve_args": {"max_num_seqs": 64}}


@pytest.fixture
def base_art(installed, tmp_path) -> Path:
    art = tmp_path / "base-art"
    pack_artifact([CacheRoot("triton", installed), CacheRoot("vllm", vllm_tree(tmp_path / "bake"))], art,
                  target="sm_90", bake=BAKE_SECTION, layer_root=BAKE_ROOT)
    return art


@pytest.fixture
def served(base_art, tmp_path) -> Path:
    """The bake installed; its vllm role is the server's VLLM_CACHE_ROOT."""
    install_artifact(base_art, tmp_path / "srv", target="sm_90")
    return tmp_path / "srv" / "vllm"


def write_unit(root: Path, rel: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        p = root / rel / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def serve_with_new_flag(cache: Path) -> None:
    """What vLLM writes when served with a flag the bake lacks: a backend dir and an AOT dir
    under new hashes, and (a load) a file inside a baked dir."""
    write_unit(cache, NEW_BACKEND, {"cache_key_factors.json": b"{}", "computation_graph.py": SECRET,
                                    "artifact_compile_range_1_8192_subgraph_0": SECRET * 10})
    write_unit(cache, NEW_AOT, {"rank_0_0/model": SECRET, "inductor_cache/ab/cabc.py": SECRET,
                                "inductor_cache/aotautograd/akey/fkey": SECRET})
    write_unit(cache, BAKED_BACKEND, {"written_at_load.py": SECRET})


def test_installed_inventory_is_the_bakes_dirs(served):
    baked = vm.installed_inventory(str(served))
    assert {u.rel for u in baked} == {BAKED_BACKEND, "torch_compile_cache/torch_aot_compile/"
                                      "a81caeba2363250f00754b85433a6af692f9977a61d73995655567320d0b0d0c"}
    assert vm.installed_inventory(str(served.parent / "triton")) is None  # not the vllm role


def test_scan_finds_only_the_new_dirs(served):
    serve_with_new_flag(served)
    result = vm.scan(str(served), vm.installed_inventory(str(served)))
    assert result.baked == 2
    new = {n.unit.rel: (n.files, n.bytes) for n in result.new}
    assert new == {NEW_BACKEND: (3, 2 + len(SECRET) * 11), NEW_AOT: (3, 3 * len(SECRET))}


def test_exit_hook_logs_names_counts_and_flags_never_bytes(served, tmp_path, monkeypatch, capsys):
    serve_with_new_flag(served)
    log = tmp_path / "overlay" / "misses.jsonl"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(served))
    monkeypatch.setenv("CACHEBAKE_MISS_LOG", str(log))
    monkeypatch.setattr(sys, "argv", SERVER_ARGV)
    vm.record_at_exit()
    raw = log.read_bytes()
    assert b"OPAQUE" not in raw and str(served).encode() not in raw
    lines = [json.loads(x) for x in raw.splitlines()]
    assert {(e["unit"], e.get("backend_dir") or e.get("aot")) for e in lines} == {
        ("backend", NEW_BACKEND), ("aot", NEW_AOT)}
    for e in lines:
        assert e["kind"] == "vllm" and e["role"] == "vllm" and line_problem(e) is None
        assert e["serve_args"] == {"max_num_seqs": 64, "mamba_ssm_cache_dtype": "bfloat16"}
        assert e["model"] == "/models/nemotron-h-8b"
    report = merge([str(log)])
    assert report.malformed == 0 and {g.kind for g in report.groups} == {"vllm"}
    assert "--mamba-ssm-cache-dtype bfloat16" in report.groups[0].specialization


def test_exit_hook_in_an_image_volume_pod_takes_what_was_there_at_start(base_art, tmp_path, monkeypatch):
    """The image-volume Pod: the layer's vllm role copied (its init container's `cp -a`) into an
    emptyDir, no install.json anywhere.  What the copy held when the server parsed its command
    line is the bake; what the server wrote after it is logged."""
    import shutil

    install_artifact(base_art, tmp_path / "layer", target="sm_90")
    pod_cache = tmp_path / "emptydir" / "vllm"
    shutil.copytree(tmp_path / "layer" / "vllm", pod_cache, symlinks=True)
    assert vm.installed_inventory(str(pod_cache)) is None
    log = tmp_path / "overlay" / "misses.jsonl"
    monkeypatch.setattr(vm, "_hooked", False)
    monkeypatch.setattr(vm, "_present_at_start", None)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(pod_cache))
    monkeypatch.setenv("CACHEBAKE_MISS_LOG", str(log))
    monkeypatch.setattr(sys, "argv", SERVER_ARGV)
    registered = []
    monkeypatch.setattr("atexit.register", registered.append)
    assert vm.install_exit_hook() is True and registered == [vm.record_at_exit]
    serve_with_new_flag(pod_cache)
    vm.record_at_exit()
    lines = [json.loads(x) for x in log.read_bytes().splitlines()]
    assert {e.get("backend_dir") or e.get("aot") for e in lines} == {NEW_BACKEND, NEW_AOT}


def test_exit_hook_not_registered_on_a_hostile_cache_at_start(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "vllm"
    (cache / "torch_compile_cache").mkdir(parents=True)
    (cache / "torch_compile_cache" / "0123456789").symlink_to(tmp_path)
    monkeypatch.setattr(vm, "_hooked", False)
    monkeypatch.setattr(vm, "_present_at_start", None)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(cache))
    monkeypatch.setattr(sys, "argv", SERVER_ARGV)
    assert vm.install_exit_hook() is False
    assert "not logged" in capsys.readouterr().err


def test_exit_hook_only_in_the_vllm_serve_process(monkeypatch):
    monkeypatch.setattr(vm, "_hooked", False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/x")
    monkeypatch.setattr(sys, "argv", ["python", "-m", "vllm.v1.engine.core"])
    assert vm.install_exit_hook() is False
    assert vm.server_flags(["vllm", "serve", "--model", "m", "--tp=2"]) == ("m", {"tp": 2})
    assert vm.server_flags(["vllm", "bench"]) is None
    main_py = "/opt/site/vllm/entrypoints/cli/main.py"
    assert vm.server_flags([main_py, "serve", "/m", "--enable-prefix-caching"]) == ("/m", {"enable_prefix_caching": True})


@pytest.mark.parametrize("plant", ["link_unit", "link_inside", "fifo", "odd_name", "odd_inner", "deep"])
def test_hostile_trees_are_refused_never_followed(served, tmp_path, plant, monkeypatch, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"not the server's")
    tcc = served / "torch_compile_cache"
    if plant == "link_unit":
        (tcc / "0123456789").symlink_to(outside)
    elif plant == "link_inside":
        write_unit(served, NEW_BACKEND, {"a.py": b"x"})
        (served / NEW_BACKEND / "b.py").symlink_to(outside / "victim")
    elif plant == "fifo":
        write_unit(served, NEW_AOT, {"rank_0_0/model": b"x"})
        os.mkfifo(served / NEW_AOT / "inductor_cache")
    elif plant == "odd_name":
        (tcc / "evil\x1b[2J").mkdir()
    elif plant == "odd_inner":
        write_unit(served, NEW_AOT, {"..hidden": b"x"})
        (served / NEW_AOT / "..hidden").rename(served / NEW_AOT / ".hidden")
    else:
        write_unit(served, NEW_AOT, {"/".join(["d"] * (vm.MAX_DEPTH + 2)) + "/f": b"x"})
    with pytest.raises(vm.VllmCacheRefused) as e:
        vm.scan(str(served), vm.installed_inventory(str(served)))
    assert e.value.code == 6 and "\x1b" not in str(e.value)
    # in the server: one stderr line, nothing logged
    log = tmp_path / "misses.jsonl"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(served))
    monkeypatch.setenv("CACHEBAKE_MISS_LOG", str(log))
    monkeypatch.setattr(sys, "argv", SERVER_ARGV)
    vm.record_at_exit()
    assert not log.exists() and "nothing was logged" in capsys.readouterr().err
    assert (outside / "victim").read_bytes() == b"not the server's"


def test_huge_tree_is_refused(served, monkeypatch):
    write_unit(served, NEW_AOT, {f"inductor_cache/f{i}": b"x" for i in range(40)})
    monkeypatch.setattr(vm, "MAX_ENTRIES", 30)
    with pytest.raises(vm.VllmCacheRefused, match="huge tree"):
        vm.scan(str(served), vm.installed_inventory(str(served)))


def test_forged_vllm_lines_are_malformed(tmp_path):
    good = {"cachebake_miss": 1, "kind": "vllm", "role": "vllm", "unit": "aot", "kernel": "torch_aot_compile",
            "key": "ab" * 32, "aot": NEW_AOT, "files": 3, "bytes": 9, "serve_args": {}, "seconds": None}
    assert line_problem(good) is None
    for bad in ({"aot": "torch_compile_cache/torch_aot_compile/../../etc"}, {"aot": "/etc/passwd"},
                {"key": "cd" * 32}, {"role": "triton"}, {"unit": "pickle"}, {"files": -1},
                {"serve_args": ["--x"]}, {"unit": "backend"}):
        assert line_problem({**good, **bad}) is not None, bad


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_misses_vllm_cache_appends_once(served, tmp_path):
    serve_with_new_flag(served)
    log = tmp_path / "misses.jsonl"
    flags = "--max-num-seqs 64 --mamba-ssm-cache-dtype bfloat16"
    r = run("misses", log, "--vllm-cache", served, "--serve-args", flags, "--model-ref", "/models/m", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert len(doc["vllm_cache"]["logged"]) == 2 and doc["misses"] == 2
    r = run("misses", log, "--vllm-cache", served, "--serve-args", flags, "--json")
    assert r.exit_code == 0 and json.loads(r.output)["vllm_cache"]["already"] == 2
    assert len(list(read_lines(log, MissReport(logs=[])))) == 2


def test_cli_misses_vllm_cache_refusals(served, base_art, tmp_path):
    copy = tmp_path / "copy"  # a copy taken from a pod: not an install, the bake given
    write_unit(copy, BAKED_BACKEND, {"x": b"1"})
    write_unit(copy, NEW_BACKEND, {"y": b"2"})
    r = run("misses", tmp_path / "l1.jsonl", "--vllm-cache", copy)
    assert r.exit_code == 3 and "--bake ART" in r.output
    r = run("misses", tmp_path / "l1.jsonl", "--vllm-cache", copy, "--bake", base_art, "--json")
    assert r.exit_code == 0, r.output
    assert [x["backend_dir"] for x in json.loads(r.output)["vllm_cache"]["logged"]] == [NEW_BACKEND]
    (copy / "torch_compile_cache" / "fedcba9876").symlink_to("/etc")
    r = run("misses", tmp_path / "l2.jsonl", "--vllm-cache", copy, "--bake", base_art)
    assert r.exit_code == 6 and "symbolic link" in r.output and not (tmp_path / "l2.jsonl").exists()
    r = run("misses", tmp_path, "--vllm-cache", copy)
    assert r.exit_code == 2
    r = run("misses", tmp_path / "l1.jsonl", "--serve-args", "--x 1")
    assert r.exit_code == 2
    r = run("misses", tmp_path / "l3.jsonl", "--vllm-cache", copy, "--bake", base_art, "--serve-args", "--x '")
    assert r.exit_code == 2 and "no closing quotation" in r.output and not (tmp_path / "l3.jsonl").exists()
