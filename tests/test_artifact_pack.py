"""pack: real caches in, artifacts that skopeo and umoci accept out, byte-reproducible."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aot
import pytest
from click.testing import CliRunner
from conftest import NOBODY, as_nobody, tool

from cachebake.artifact.oci import open_artifact
from cachebake.artifact.pack import pack_artifact, parse_root
from cachebake.cli import main
from cachebake.errors import BadInput, ExitCode

LAYER_ROOT = "/var/cache/cachebake"


def _files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def _pack(cache: Path, out: Path, target="sm_90", **kw):
    return pack_artifact([parse_root(f"triton={cache}")], out, target=target, **kw)


def test_skopeo_and_umoci_accept_it_and_the_tree_matches(triton_cache, tmp_path):
    out = tmp_path / "art"
    report = _pack(triton_cache, out)
    info = json.loads(subprocess.run([tool("skopeo"), "inspect", f"oci:{out}:sm_90"], check=True,
                                     capture_output=True, text=True).stdout)
    assert info["Layers"] == [report.manifest.layer.digest]
    assert info["Labels"]["dev.cachebake.target"] == "cuda:90"
    bundle = tmp_path / "bundle"
    subprocess.run([tool("umoci"), "unpack", "--rootless", "--image", f"{out}:sm_90", str(bundle)],
                   check=True, capture_output=True)
    unpacked, source = _files(bundle / "rootfs" / "triton"), _files(triton_cache)
    assert unpacked.keys() == source.keys()
    for rel, path in source.items():
        if Path(rel).name.startswith("__grp__"):
            # Group files are normalized to the serving root: same children, canonical paths.
            src = json.loads(path.read_text())["child_paths"]
            got = json.loads(unpacked[rel].read_text())["child_paths"]
            key_dir = rel.rsplit("/", 1)[0]
            assert got == {name: f"{LAYER_ROOT}/triton/{key_dir}/{name}" for name in src}
        else:
            assert unpacked[rel].read_bytes() == path.read_bytes(), rel


def test_same_tree_packs_to_identical_layer_from_anywhere(triton_cache, tmp_path):
    other = tmp_path / "elsewhere" / "deeper" / "triton"
    shutil.copytree(triton_cache, other)
    past = time.time() - 86400 * 30
    for p in other.rglob("*"):
        os.utime(p, (past, past))
        os.chown(p, 65534, 65534)
        if p.is_file():
            p.chmod(0o600)
    a = _pack(triton_cache, tmp_path / "a")
    time.sleep(1.1)
    b = _pack(other, tmp_path / "b")
    assert a.manifest.layer.digest == b.manifest.layer.digest
    assert a.manifest.layer.diff_id == b.manifest.layer.diff_id
    la = open_artifact(tmp_path / "a").select("sm_90")
    assert (tmp_path / "a" / "blobs" / "sha256" / la.layer_digest.split(":")[1]).read_bytes() == \
        (tmp_path / "b" / "blobs" / "sha256" / la.layer_digest.split(":")[1]).read_bytes()
    # Only the recorded bake path differs between the two manifests.
    fa, fb = a.manifest.fingerprint, b.manifest.fingerprint
    assert fa.bake_paths != fb.bake_paths
    assert dataclasses.replace(fa, bake_paths={}) == dataclasses.replace(fb, bake_paths={})
    # Packing the very same path twice gives the same image manifest digest too.
    c = _pack(triton_cache, tmp_path / "c")
    assert c.manifest_digest == a.manifest_digest


def test_fingerprint_and_inventory(triton_cache, tmp_path):
    m = _pack(triton_cache, tmp_path / "art").manifest
    fp = m.fingerprint
    assert fp.target == "cuda:90" and fp.triton_version == "3.6.0"
    assert fp.triton_key.startswith("3.6.0")
    assert "release 12.8" in fp.ptxas and fp.ptxas.endswith("-90")
    assert fp.python_tag.startswith(sys.implementation.cache_tag)
    assert fp.bake_paths == {"triton": str(triton_cache.resolve())}
    names = sorted(k.name for k in m.inventory.kernels)
    assert names == sorted(s[0] for s in aot.SPECS)
    warps = sorted((k.name, k.num_warps) for k in m.inventory.kernels if k.name == "add_kernel")
    assert warps == [("add_kernel", 4), ("add_kernel", 8)]
    assert all(k.target == "cuda:90" and k.key_dir.startswith("triton/") for k in m.inventory.kernels)
    [tune] = m.inventory.autotune
    assert tune.kernel == "add_kernel" and tune.tuning_key == [4096, "torch.float32"] and tune.configs == 2
    assert tune.best["kwargs"] == {"BLOCK": 1024}


def test_set_invalidating_env_var_is_recorded(triton_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    m = _pack(triton_cache, tmp_path / "art").manifest
    # recorded as Triton puts it into the key (it normalizes booleans)
    assert m.fingerprint.env == {"TRITON_DEFAULT_FP_FUSION": "true"}


def test_cleaning_drops_leftovers_orphans_and_topology(triton_cache, tmp_path):
    key_dirs = sorted(p for p in triton_cache.iterdir() if p.is_dir() and len(p.name) == 52)
    (key_dirs[0] / "tmp.pid_123_abc").mkdir()
    (key_dirs[0] / "tmp.pid_123_abc" / "half.cubin").write_bytes(b"x")
    orphan = key_dirs[1]
    for cubin in orphan.glob("*.cubin"):
        cubin.unlink()
    vllm = tmp_path / "vllm"
    (vllm / "torch_compile_cache").mkdir(parents=True)
    (vllm / "torch_compile_cache" / "graph.py").write_text("x = 1\n")
    (vllm / "gpu_p2p_access_cache_for_0,1.json").write_text("{}")
    report = pack_artifact([parse_root(f"triton={triton_cache}"), parse_root(f"vllm={vllm}")],
                           tmp_path / "art", target="sm_90")
    art = tmp_path / "art"
    bundle = tmp_path / "bundle"
    subprocess.run([tool("umoci"), "unpack", "--rootless", "--image", f"{art}:sm_90", str(bundle)],
                   check=True, capture_output=True)
    got = _files(bundle / "rootfs")
    assert not any("tmp.pid_" in k for k in got)
    assert not any(k.startswith(f"triton/{orphan.name}") for k in got)
    assert "vllm/torch_compile_cache/graph.py" in got
    assert not any("gpu_p2p_access_cache" in k for k in got)
    dropped = {d["path"]: d["reason"] for d in report.manifest.inventory.dropped}
    assert any(orphan.name in p and "no binary" in r for p, r in dropped.items())
    assert any("gpu_p2p_access_cache" in p for p in dropped)
    assert len(report.manifest.inventory.kernels) == len(aot.SPECS) - 1
    assert report.manifest.roles == ["triton", "vllm"]


def test_second_target_adds_an_index_entry(triton_cache, tmp_path):
    sm120 = tmp_path / "sm120" / "triton"
    aot.compile_in_subprocess(sm120, specs=aot.SPECS[:2], target=("cuda", 120, 32))
    out = tmp_path / "art"
    _pack(triton_cache, out, target="sm_90")
    first = open_artifact(out).select("sm_90").manifest_digest
    report = _pack(sm120, out, target="sm_120")
    assert report.targets == ["cuda:120", "cuda:90"]
    art = open_artifact(out)
    assert art.select("sm_90").manifest_digest == first
    assert art.select("cuda:120").manifest.fingerprint.ptxas.startswith("ptxas-blackwell")
    for ref in ("sm_90", "sm_120"):
        subprocess.run([tool("skopeo"), "inspect", f"oci:{out}:{ref}"], check=True, capture_output=True)
    # Re-packing a target replaces its entry rather than adding a third.
    _pack(triton_cache, out, target="sm_90")
    assert open_artifact(out).targets() == ["cuda:120", "cuda:90"]
    summary = json.loads((out / "cachebake.json").read_text())
    assert sorted(summary["bakes"]) == ["cuda:120", "cuda:90"]


def test_prune_ir_keeps_binaries_and_rewrites_groups(triton_cache, tmp_path):
    full = _pack(triton_cache, tmp_path / "full").manifest
    pruned = _pack(triton_cache, tmp_path / "pruned", prune_ir=True).manifest
    assert pruned.layer.uncompressed_size < full.layer.uncompressed_size / 2
    assert len(pruned.inventory.kernels) == len(full.inventory.kernels)


@pytest.mark.parametrize("case", ["missing", "empty", "not_a_cache", "file", "out_is_a_file", "out_is_other_dir",
                                  "bad_role", "out_links_to_an_empty_dir", "out_links_to_an_artifact"])
def test_bad_input_one_line_exit_3_nothing_written(case, triton_cache, tmp_path):
    out = tmp_path / "out"
    root = str(triton_cache)
    if case == "missing":
        root = str(tmp_path / "nope")
    elif case == "empty":
        (tmp_path / "empty").mkdir()
        root = str(tmp_path / "empty")
    elif case == "not_a_cache":
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "README").write_text("hi")
        root = str(tmp_path / "docs")
    elif case == "file":
        root = str(next(triton_cache.rglob("*.cubin")))
    elif case == "out_is_a_file":
        out.write_text("precious")
    elif case == "out_is_other_dir":
        out.mkdir()
        (out / "precious.txt").write_text("keep me")
    elif case == "bad_role":
        root = f"cuda={triton_cache}"
    elif case.startswith("out_links_to"):  # the swap would replace the link and leave it beside
        target = tmp_path / "elsewhere"
        if case.endswith("artifact"):
            _pack(triton_cache, target)
        else:
            target.mkdir()
        out.symlink_to(target)
        snapshot_target = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    before = sorted(p.name for p in tmp_path.iterdir())
    snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} if out.is_dir() else None
    result = CliRunner().invoke(main, ["pack", root, "--out", str(out), "--target", "sm_90"])
    # a value of the wrong form (an unknown role) is a usage error, caught while parsing
    code = ExitCode.USAGE if case == "bad_role" else ExitCode.BAD_INPUT
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("cachebake: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temp dir left behind
    if case == "out_is_a_file":
        assert out.read_text() == "precious"
    if case.startswith("out_links_to"):
        assert out.is_symlink() and "symbolic link" in lines[0]
        assert {p: p.read_bytes() for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()} == snapshot_target
    if snapshot is not None:
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == snapshot


def test_unreadable_file_is_refused_for_a_non_root_user(_built_cache, public_tmp):
    tmp_path = public_tmp
    triton_cache = tmp_path / "triton"
    shutil.copytree(_built_cache, triton_cache)
    for p in [tmp_path, *tmp_path.rglob("*")]:
        os.chown(p, NOBODY, NOBODY)
    victim = next(triton_cache.rglob("*.cubin"))
    victim.chmod(0)
    out = tmp_path / "out"
    r = as_nobody([sys.executable, "-m", "cachebake.cli", "pack", str(triton_cache), "--out", str(out),
                   "--target", "sm_90"], env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == ExitCode.BAD_INPUT, r.stderr
    assert "not readable" in r.stderr and victim.name in r.stderr
    assert not out.exists()


def test_failed_pack_leaves_an_existing_artifact_untouched(triton_cache, tmp_path, monkeypatch):
    out = tmp_path / "art"
    _pack(triton_cache, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    from cachebake.artifact import layer

    def boom(self, snap, progress=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(layer.LayerWriter, "write", boom)
    with pytest.raises(BadInput, match=f"{out}: cannot write the artifact: No space left") as exc:
        _pack(triton_cache, out, target="sm_90")
    assert ".tmp-" not in str(exc.value)  # the user's path, never our temp dir
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["art", "cache"])


def test_inspect_json_and_text(triton_cache, tmp_path):
    out = tmp_path / "art"
    _pack(triton_cache, out)
    r = CliRunner().invoke(main, ["inspect", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    [bake] = data["bakes"]
    assert bake["summary"]["kernels"] == len(aot.SPECS) and bake["summary"]["autotune"] == 1
    assert bake["layer_digest"].startswith("sha256:") and bake["manifest"]["layer"]["size"] > 0
    r = CliRunner().invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0 and "add_kernel" in r.stdout and "3.6.0" in r.stdout


def test_unknown_target_is_a_clear_error():
    with pytest.raises(BadInput, match="unrecognised GPU target"):
        from cachebake.gpu import GPUTargetSpec
        GPUTargetSpec.parse("h200")


def test_a_group_file_naming_a_child_outside_its_key_dir_is_refused(triton_cache, tmp_path):
    grp = next(triton_cache.rglob("__grp__*.json"))
    grp.write_text(json.dumps({"child_paths": {"../../etc/passwd": "/etc/passwd"}}))
    with pytest.raises(BadInput, match="not a plain file name"):
        _pack(triton_cache, tmp_path / "art")
    assert not (tmp_path / "art").exists()


def test_the_target_is_the_caches_own(triton_cache, tmp_path, monkeypatch):
    """Kernels record the target they were compiled for: --target must agree, and without it
    (and without a GPU) that is the target."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: no visible GPU
    with pytest.raises(BadInput, match=r"--target gfx942 \(hip:gfx942\) does not match the cache: "
                                       r"its kernels were compiled for cuda:90"):
        _pack(triton_cache, tmp_path / "a", target="gfx942")
    with pytest.raises(BadInput, match="does not match"):
        _pack(triton_cache, tmp_path / "a", target="sm_120")
    assert not (tmp_path / "a").exists()
    assert _pack(triton_cache, tmp_path / "a", target=None).target == "cuda:90"
    with pytest.raises(BadInput, match="unknown GPU target 'sm_999'"):
        _pack(triton_cache, tmp_path / "b", target="sm_999")


def test_a_cache_mixing_targets_is_refused(triton_cache, tmp_path):
    aot.compile_in_subprocess(triton_cache, specs=aot.SPECS[:1], target=("cuda", 120, 32))
    with pytest.raises(BadInput, match="holds kernels for cuda:120, cuda:90"):
        _pack(triton_cache, tmp_path / "a")


def test_cli_says_created_added_replaced(triton_cache, tmp_path):
    sm120 = tmp_path / "sm120" / "triton"
    aot.compile_in_subprocess(sm120, specs=aot.SPECS[:1], target=("cuda", 120, 32))
    out = tmp_path / "art"
    runner = CliRunner()

    def pack(cache, target, *extra):
        r = runner.invoke(main, ["pack", str(cache), "--out", str(out), "--target", target, *extra])
        assert r.exit_code == 0, r.output
        return r

    assert pack(triton_cache, "sm_90").stdout.startswith(f"packed the cuda:90 bake in {out}")
    assert pack(sm120, "sm_120").stdout.startswith(f"added the cuda:120 bake in {out}")
    first = open_artifact(out).select("sm_90").manifest_digest
    (next(triton_cache.rglob("*.ttir"))).write_text("changed")  # another bake of the same target
    again = json.loads(pack(triton_cache, "sm_90", "--json").stdout)
    assert again["status"] == "replaced" and again["replaced_manifest_digest"] == first
    assert again["targets"] == ["cuda:120", "cuda:90"] and again["manifest_digest"] != first
    assert again["layer_digest"] == again["manifest"]["layer"]["digest"]
    (next(triton_cache.rglob("*.ttir"))).write_text("changed again")
    text = pack(triton_cache, "sm_90").stdout
    assert text.startswith(f"replaced the cuda:90 bake in {out}")
    assert f"replaced image {again['manifest_digest']}" in text
    # the same cache packed again is the same image: nothing was replaced, and pack says so
    latest = open_artifact(out).select("sm_90").manifest_digest
    same = json.loads(pack(triton_cache, "sm_90", "--json").stdout)
    assert same["status"] == "unchanged" and same["manifest_digest"] == latest
    assert "replaced_manifest_digest" not in same
    text = pack(triton_cache, "sm_90").stdout
    assert text.startswith(f"the cuda:90 bake in {out} (targets: cuda:120, cuda:90) is unchanged")
    assert "replaced" not in text


def test_pack_without_triton_refuses_rather_than_record_an_empty_fingerprint(triton_cache, tmp_path,
                                                                             monkeypatch):
    # A venv without the `triton` extra: the fingerprint would carry no Triton version or key,
    # and every install that has Triton would then refuse the artifact (exit 4).
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` fails, as it does there
    out = tmp_path / "art"
    r = CliRunner().invoke(main, ["pack", str(triton_cache), "--out", str(out), "--target", "sm_90"])
    assert r.exit_code == ExitCode.UNSUPPORTED, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cachebake: error: Triton is not installed"), r.stderr
    assert "the `triton` extra" in lines[0] and "exit 4" in lines[0]
    assert not out.exists()


def test_pack_progress_is_drawn_on_a_terminal_only(triton_cache, tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from cachebake.cli.progress import PackProgress

    assert PackProgress(Console(file=io.StringIO(), force_terminal=False)).factory is None
    monkeypatch.setenv("TERM", "dumb")
    assert PackProgress(Console(file=io.StringIO(), force_terminal=True)).factory is None
    monkeypatch.setenv("TERM", "xterm-256color")
    term = io.StringIO()
    with PackProgress(Console(file=term, force_terminal=True, width=100)) as bar:
        report = _pack(triton_cache, tmp_path / "art", progress=bar.factory)
    assert f"packing {report.manifest.layer.files} files" in term.getvalue()
    # the CLI under a pipe (CliRunner): nothing but the report
    r = CliRunner().invoke(main, ["pack", str(triton_cache), "--out", str(tmp_path / "b"),
                                  "--target", "sm_90"])
    assert r.exit_code == 0 and r.stderr == ""


def test_a_bake_whose_events_hold_infinities_installs_and_inspects(triton_cache, tmp_path):
    """A real vLLM bake's events hold constexprs like dt_max=inf and MASK_VALUE=-inf, and
    events logged before the monitor wrote them as strings still do.  What pack writes is
    strict JSON all the same (they become "inf"), so inspect and install read it; on the
    H200 (2026-11-30) such an artifact was refused by both until this."""
    from cachebake.install import install_artifact
    from cachebake.jsonio import parse_json

    bake = {"events": [{"kind": "compile", "constexprs": {"dt_max": float("inf"), "MASK_VALUE": float("-inf")}}],
            "seconds": float("nan")}
    art = tmp_path / "art"
    pack_artifact([parse_root(f"triton={triton_cache}")], art, target="sm_90", bake=bake)
    label = open_artifact(art).select().manifest
    assert label.bake.events[0]["constexprs"] == {"dt_max": "inf", "MASK_VALUE": "-inf"}
    assert label.bake.extra["seconds"] == "nan"
    for blob in (art / "blobs" / "sha256").iterdir():
        if blob.stat().st_size < 1 << 20 and blob.read_bytes()[:1] == b"{":
            parse_json(blob.read_bytes(), blob.name)  # every JSON blob, strictly
    r = CliRunner().invoke(main, ["inspect", str(art), "--json"])
    assert r.exit_code == 0, r.output
    report = install_artifact(art, tmp_path / "to", target="sm_90")
    assert report.status == "installed"


# -- the swap into --out, killed or interrupted at each step -----------------------------------
def _two_bakes(triton_cache, tmp_path):
    """--out holding bake A, and a cache B (A's kernels plus a copied key dir) to pack over it."""
    out = tmp_path / "art"
    old = _pack(triton_cache, out).layer_digest
    other = tmp_path / "other"
    shutil.copytree(triton_cache, other)
    shutil.copytree(sorted(p for p in other.iterdir() if p.is_dir())[0], other / ("Z" * 52))
    new = _pack(other, tmp_path / "probe").layer_digest
    return out, other, old, new


def _siblings(out):
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


SWAP_STEPS = {"exchange": ["written", "swapped", "old-removed"], "two renames": ["written", "aside", "swapped", "old-removed"]}


@pytest.mark.parametrize("how", SWAP_STEPS, ids=list(SWAP_STEPS))
def test_a_kill_at_any_step_of_the_swap_leaves_the_old_artifact_or_the_new(triton_cache, tmp_path, how):
    """SIGKILL at each step of pack's swap of an existing --out: --out is the old artifact or the
    new one, whole (every blob verified); the next pack removes what the killed one left beside
    it.  With two renames (a kernel or filesystem without RENAME_EXCHANGE, stood in for by
    turning it off) a kill between them leaves the old artifact aside, and the next pack puts it
    back first."""
    from installkit import env_with, spawn_at_checkpoint

    out, other, old, new = _two_bakes(triton_cache, tmp_path)
    env = env_with(**({"NOEXCHANGE": "1"} if how == "two renames" else {}))
    for at, step in enumerate(SWAP_STEPS[how], 1):
        shutil.rmtree(out)
        _pack(triton_cache, out)
        p = spawn_at_checkpoint("pack", f"triton={other}", "--out", out, "--target", "sm_90", at=at, env=env)
        assert p.wait() == -9, (step, p.stderr.read())
        if step == "aside":
            assert not out.exists() and any(n.startswith(".art.old-") for n in _siblings(out))
        else:
            assert open_artifact(out).select().layer_digest == (old if step == "written" else new), step
        report = _pack(other, out)
        assert report.layer_digest == new and _siblings(out) == [], (step, _siblings(out))
        assert bool(report.cleaned) == (step != "old-removed"), (step, report.cleaned)
        if step == "aside":
            assert report.status == "replaced" and "put back" in report.cleaned[0]


def test_ctrl_c_at_each_step_says_what_it_left_and_it_is_so(triton_cache, tmp_path):
    from installkit import spawn_at_checkpoint

    out, other, old, new = _two_bakes(triton_cache, tmp_path)
    for at, step in enumerate(SWAP_STEPS["exchange"], 1):
        shutil.rmtree(out)
        _pack(triton_cache, out)
        p = spawn_at_checkpoint("pack", f"triton={other}", "--out", out, "--target", "sm_90", at=at, action="INT")
        _, err = p.communicate()
        assert p.returncode == 130 and "Traceback" not in err and "Exception ignored" not in err, err
        (line,) = err.splitlines()
        digest = open_artifact(out).select().layer_digest
        if step == "written":
            assert line == f"cachebake: error: interrupted: nothing written: {out} is as it was" and digest == old
        else:
            assert f"{out} holds the new artifact" in line and digest == new, line
        assert _siblings(out) == [], _siblings(out)  # an interrupted pack removes what it made itself


def test_a_live_packs_temp_dir_is_left_alone(triton_cache, tmp_path):
    """Leftovers are removed only once no pack holds them (flock on the temp dir: the kernel
    drops it when its pack dies)."""
    import fcntl

    out = tmp_path / "art"
    live, dead = tmp_path / ".art.tmp-live", tmp_path / ".art.tmp-dead"
    live.mkdir()
    (dead / "blobs").mkdir(parents=True)
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        report = _pack(triton_cache, out)
        assert report.cleaned == [".art.tmp-dead"] and live.is_dir() and not dead.exists()
    finally:
        os.close(fd)
    assert _pack(triton_cache, out).cleaned == [".art.tmp-live"]
