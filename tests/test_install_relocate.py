"""Install a real AOT bake at another path than it was baked at: every compile must hit."""

import json
import subprocess
import sys

from installkit import baked, cli, compile_kernels  # noqa: F401  (baked is a fixture)

from cachebake.install.relocate import relocate_tree


def test_installed_elsewhere_every_kernel_hits(baked, tmp_path):
    to = tmp_path / "serve" / "cache"
    r = cli("install", baked["artifact"], "--to", to, "--target", "sm_90", "--json", check=True)
    report = json.loads(r.stdout)
    assert report["status"] == "installed"
    assert report["groups_relocated"] == 3
    assert report["env"]["TRITON_CACHE_DIR"] == str(to / "triton")
    result = compile_kernels(report["env"]["TRITON_CACHE_DIR"])
    assert (result["hits"], result["misses"]) == (3, 0)


def test_without_relocation_the_same_cache_misses(baked, tmp_path):
    """The control: a plain `zstd -d | tar -x` of the same layer at the same kind of path misses,
    because the group files still point at the (deleted) bake root.  Proves the test above can
    fail; relocate_tree on the extracted tree then makes it hit."""
    from badlayers import layer_blob

    to = tmp_path / "plain"
    to.mkdir()
    subprocess.run(f"zstd -dc {layer_blob(baked['artifact'])} | tar -x -C {to}", shell=True, check=True)
    result = compile_kernels(to / "triton")
    assert result["misses"] == 3 and result["hits"] == 0

    to2 = tmp_path / "plain2"
    to2.mkdir()
    subprocess.run(f"zstd -dc {layer_blob(baked['artifact'])} | tar -x -C {to2}", shell=True, check=True)
    assert relocate_tree(str(to2 / "triton")) == 3
    result = compile_kernels(to2 / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)


def test_serve_at_relocates_for_the_serving_mount(baked, tmp_path):
    """Init container sees the volume at /init/x, the server at another path: --serve-at."""
    init_view, serve_view = tmp_path / "init", tmp_path / "served"
    cli("install", baked["artifact"], "--to", init_view, "--target", "sm_90",
        "--serve-at", serve_view, check=True)
    init_view.rename(serve_view)  # the same volume, mounted elsewhere
    result = compile_kernels(serve_view / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)


def test_repeat_install_is_a_noop_and_new_digest_replaces(baked, tmp_path):
    to = tmp_path / "c"
    first = json.loads(cli("install", baked["artifact"], "--to", to, "--target", "sm_90", "--json",
                           check=True).stdout)
    again = cli("install", baked["artifact"], "--to", to, "--target", "sm_90", check=True)
    assert again.stdout.startswith("already installed")
    second = json.loads(cli("install", baked["artifact2"], "--to", to, "--target", "sm_90", "--json",
                            check=True).stdout)
    assert second["status"] == "replaced" and second["groups_relocated"] == 4
    assert first["version_dir"] != second["version_dir"]
    versions = list((to / ".cachebake" / "versions").iterdir())
    assert [v.name for v in versions] == [second["version_dir"].rsplit("/", 1)[1]]
    assert len(list((to / "triton").iterdir())) == 4
    result = compile_kernels(to / "triton")
    assert (result["hits"], result["misses"]) == (3, 0)


def test_cachebake_verify_passes_after_install_and_fails_after_a_plain_copy(baked, tmp_path):
    """End to end with the project's own checker: `cachebake verify` runs the same kernels
    under the compile monitor against DIR."""
    from badlayers import layer_blob

    from cachebake.errors import ExitCode
    from installkit import KERNELS

    to = tmp_path / "served"
    cli("install", baked["artifact"], "--to", to, "--target", "sm_90", check=True)
    r = cli("verify", "--cache", to, "--", sys.executable, KERNELS)
    assert r.returncode == 0 and "0 compiles, 3 cache hits" in r.stdout, r.stdout + r.stderr

    plain = tmp_path / "plain"
    plain.mkdir()
    subprocess.run(f"zstd -dc {layer_blob(baked['artifact'])} | tar -x -C {plain}", shell=True, check=True)
    r = cli("verify", "--cache", plain, "--", sys.executable, KERNELS)
    assert r.returncode == ExitCode.COMPILES_SEEN and "3 real compiles" in r.stderr, r.stderr
