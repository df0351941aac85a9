"""Turning the layered cache on without a code change: install/serve-args --overlay hand the
server its environment; verify never writes into the cache it checks."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import servekit
from click.testing import CliRunner
from conftest import as_nobody
from test_vllm_engine import _manifest
from test_serve_layered import IN_BAKE, NOT_IN_BAKE

from cachebake.artifact.pack import CacheRoot, pack_artifact
from cachebake.cli import main
from cachebake.roles import MANAGER_CLASS


def test_install_overlay_env_serves_misses(installed, tmp_path):
    art = tmp_path / "art"
    pack_artifact([CacheRoot("triton", installed)], art, target="sm_90")
    srv, overlay = tmp_path / "srv", tmp_path / "overlay"
    res = CliRunner().invoke(main, ["install", str(art), "--to", str(srv), "--target", "sm_90",
                                    "--overlay", str(overlay), "--json"])
    assert res.exit_code == 0, res.output
    env = json.loads(res.output)["env"]
    assert env["TRITON_CACHE_DIR"] == str(srv / "triton")
    assert env["TRITON_CACHE_MANAGER"] == MANAGER_CLASS
    assert env["CACHEBAKE_OVERLAY_DIR"] == str(overlay)
    assert env["CACHEBAKE_MISS_LOG"] == str(overlay / "misses.jsonl")
    assert not overlay.exists()  # the server makes it; install (an init container) may not see it

    # The server gets exactly that environment, nothing else of cachebake.
    server_env = {**servekit.serve_env(srv), **env}
    out = servekit.run_server([IN_BAKE, NOT_IN_BAKE], server_env)
    assert out["cache_hits"] == [True, False] and out["error"] is None, out["stderr"]
    (line,) = servekit.miss_lines(overlay / "misses.jsonl")
    assert line["kernel"] == "add_kernel" and line["record"]["constexprs"] == [[[4], 2048]]

    text = CliRunner().invoke(main, ["install", str(art), "--to", str(srv), "--target", "sm_90",
                                     "--overlay", str(overlay)])
    assert text.exit_code == 0 and f"CACHEBAKE_OVERLAY_DIR={overlay}" in text.output


def test_install_overlay_refusals(installed, tmp_path):
    art = tmp_path / "art"
    pack_artifact([CacheRoot("triton", installed)], art, target="sm_90")
    runner = CliRunner()
    # a malformed value is a usage error (2, refused by the option's type), a well-formed one
    # that cannot work is bad input (3)
    for overlay, message, code in (("relative/dir", "is not an absolute path", 2),
                                   (str(tmp_path / "srv" / "overlay"), "inside the installed tree", 3)):
        res = runner.invoke(main, ["install", str(art), "--to", str(tmp_path / "srv"),
                                   "--target", "sm_90", "--overlay", overlay])
        assert res.exit_code == code and message in res.output, res.output
        assert not (tmp_path / "srv").exists()  # refused before anything was written


@pytest.mark.parametrize("via", ["link into the tree", "tree through a link"])
def test_install_overlay_resolving_into_the_tree_is_refused(installed, tmp_path, via):
    """A symlink into the installed tree, or the tree reached through one: the overlay would be
    the tree once resolved.  Refused (3) before anything is written, and the line says where
    it resolves to."""
    art = tmp_path / "art"
    pack_artifact([CacheRoot("triton", installed)], art, target="sm_90")
    srv = tmp_path / "srv"
    to, overlay = srv, tmp_path / "overlay"
    if via == "link into the tree":
        os.symlink(srv / "scratch", overlay)
        message = f"inside the installed tree {srv} (it resolves to {srv / 'scratch'})"
    else:
        srv.mkdir()
        os.symlink(srv, tmp_path / "srv-link")
        to, overlay = tmp_path / "srv-link", srv / "scratch"
        message = f"inside the installed tree {srv}"
    res = CliRunner().invoke(main, ["install", str(art), "--to", str(to), "--target", "sm_90",
                                    "--overlay", str(overlay)])
    assert res.exit_code == 3 and message in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not srv.exists() or list(srv.iterdir()) == []


def test_serve_args_overlay(triton_cache, tmp_path):
    art = tmp_path / "artifact"
    pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90",
                  bake=_manifest(tmp_path)["bake"])
    res = CliRunner().invoke(main, ["serve-args", str(art), "--root", "/srv/c", "--overlay",
                                    "/overlay", "--json"])
    assert res.exit_code == 0, res.output
    env = json.loads(res.output)["env"]
    assert env["TRITON_CACHE_DIR"] == "/srv/c/triton" and env["TRITON_CACHE_MANAGER"] == MANAGER_CLASS
    assert env["CACHEBAKE_MISS_LOG"] == "/overlay/misses.jsonl"
    res = CliRunner().invoke(main, ["serve-args", str(art), "--root", "/srv/c", "--overlay", "/srv/c/o"])
    assert res.exit_code == 3


WARMUP = """
import sys
sys.path.insert(0, {tests!r})
import aot
for block in sys.argv[1:]:
    aot.aot_compile(None, constexprs={{"BLOCK": int(block)}})
"""


@pytest.mark.slow
def test_verify_read_only_cache_as_nobody(public_tmp):
    """verify against an installed cache uid 65534 cannot write: a miss is a verdict (exit 8,
    the kernel listed), not a PermissionError (exit 9), and the cache is left byte-identical."""
    root = public_tmp / "root"
    script = public_tmp / "warmup.py"
    script.write_text(WARMUP.format(tests=str(servekit.kernels_dir())))
    env = {**servekit.serve_env(root / "triton"), "TRITON_CACHE_AUTOTUNING": "1"}
    import subprocess

    subprocess.run([sys.executable, str(script), "64"], env=env, check=True, capture_output=True)
    os.system(f"chmod -R a-w,a+rX {root}")
    before = servekit.tree_state(root)
    work = public_tmp / "work"
    work.mkdir()
    os.chown(work, 65534, 65534)
    cli = [sys.executable, "-m", "cachebake.cli", "verify", "--cache", str(root),
           "--work-dir", str(work), "--json", "--", sys.executable, str(script)]
    env = {k: v for k, v in servekit.serve_env(root).items() if k != "TRITON_CACHE_DIR"}
    ok = as_nobody(cli + ["64"], env=env, cwd="/")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = as_nobody(cli + ["64", "256"], env=env, cwd="/")
    assert bad.returncode == 8, bad.stdout + bad.stderr
    doc = json.loads(bad.stdout)
    assert [w["kernel"] for w in doc["work"] if w["kind"] == "compile"] == ["add_kernel"]
    assert servekit.tree_state(root) == before
    shutil.rmtree(work, ignore_errors=True)
