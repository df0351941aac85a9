"""verify: one round against an installed cache; any real compile or benchmark fails it."""

import json
import sys
from pathlib import Path

import pytest
import servekit
from click.testing import CliRunner

from cachebake.bake.rounds import run_rounds
from cachebake.verify import verify
from cachebake.capture.env import bake_env
from cachebake.cli import main
from cachebake.drivers.command import CommandDriver
from cachebake.errors import BadInput, CommandFailed, CompilesSeen, ExitCode

TESTS = servekit.kernels_dir()  # where every process of the session imports the test kernels

WARMUP = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import aot
for block in sys.argv[1:]:
    aot.aot_compile(None, constexprs={{"BLOCK": int(block)}})
"""


def warmup(tmp_path, *blocks):
    script = tmp_path / "warmup.py"
    script.write_text(WARMUP)
    return [sys.executable, str(script), *map(str, blocks)]


@pytest.fixture
def baked(tmp_path):
    """A cache root filled by a build with BLOCK 64 and 128."""
    root = tmp_path / "root"
    benv = bake_env(root, ("triton",), monitor_log=tmp_path / "bake/events.jsonl")
    assert run_rounds(CommandDriver(warmup(tmp_path, 64, 128)), benv).stable
    return root


def test_complete_cache_verifies(tmp_path, baked):
    report = verify(CommandDriver(warmup(tmp_path, 64, 128)), baked)
    assert report.ok and report.work == [] and report.roles == ["triton"]
    assert report.round.summary.cache_hits == 2
    report.check()


def test_missing_specialization_is_listed(tmp_path, baked):
    report = verify(CommandDriver(warmup(tmp_path, 64, 256)), baked)
    assert not report.ok
    (line,) = report.lines()
    assert line.startswith("compile") and "add_kernel[BLOCK=256]" in line
    with pytest.raises(CompilesSeen, match="1 real compiles") as exc:
        report.check()
    assert exc.value.code == ExitCode.COMPILES_SEEN == 8


def test_not_a_cache_root(tmp_path):
    with pytest.raises(BadInput, match="no cache roles"):
        verify(CommandDriver(["true"]), tmp_path)
    with pytest.raises(BadInput, match="no such directory"):
        verify(CommandDriver(["true"]), tmp_path / "missing")


def test_failing_round(tmp_path, baked):
    with pytest.raises(CommandFailed):
        verify(CommandDriver([sys.executable, "-c", "raise SystemExit(1)"]), baked)


def test_cli_verify(tmp_path, baked, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))
    (tmp_path / "systmp").mkdir()
    runner = CliRunner()
    ok = runner.invoke(main, ["verify", "--cache", str(baked), "--", *warmup(tmp_path, 128)])
    assert ok.exit_code == 0, ok.output
    assert "0 compiles, 1 cache hits" in ok.output
    bad = runner.invoke(main, ["verify", "--cache", str(baked), "--",
                               *warmup(tmp_path, 32, 64, 512)])
    assert bad.exit_code == 8, bad.output
    assert "add_kernel[BLOCK=32]" in bad.output and "add_kernel[BLOCK=512]" in bad.output
    assert "cachebake: error: the cache at" in bad.output
    as_json = runner.invoke(main, ["verify", "--json", "--cache", str(baked), "--",
                                   *warmup(tmp_path, 16)])
    assert as_json.exit_code == 8
    doc = json.loads(as_json.stdout)  # one document: the report, ok false; the error on stderr
    assert (doc["command"], doc["ok"], doc["compiles"]) == ("verify", False, 1)
    assert "cachebake: error: the cache at" in as_json.stderr
    assert list((tmp_path / "systmp").iterdir()) == []  # no work dir left behind


LISTENING = WARMUP + """
import triton
heard = []
triton.knobs.compilation.listener = lambda **kw: heard.append(kw["cache_hit"])
for block in sys.argv[1:]:
    aot.aot_compile(None, constexprs={"BLOCK": int(block) * 2})
print("heard", heard)
"""


def test_a_command_that_assigns_its_own_compilation_listener_is_still_watched(tmp_path, baked):
    """Programs assign triton.knobs.compilation.listener to watch compiles: the monitor is
    chained, not replaced, so verify still sees every hit (and the program its events)."""
    script = tmp_path / "listening.py"
    script.write_text(LISTENING)
    r = CliRunner().invoke(main, ["verify", "--cache", str(baked), "--work-dir", str(tmp_path / "w"),
                                  "--", sys.executable, str(script), "64"])
    assert r.exit_code == 0, r.output
    assert "0 compiles, 2 cache hits" in r.stdout
    assert "heard [True]" in (tmp_path / "w" / "round-1.log").read_text()


def test_the_triton_dir_of_an_install_names_the_install_dir(tmp_path, baked):
    """`verify --cache DIR/triton`, the value of TRITON_CACHE_DIR install prints: exit 3, one
    line naming DIR; DIR itself verifies."""
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    art, to = tmp_path / "art", tmp_path / "to"
    pack_artifact([CacheRoot("triton", baked / "triton")], art, target="sm_90")
    runner = CliRunner()
    installed = runner.invoke(main, ["install", str(art), "--to", str(to), "--target", "sm_90"])
    assert installed.exit_code == 0, installed.output
    assert f"TRITON_CACHE_DIR={to}/triton" in installed.stdout
    r = runner.invoke(main, ["verify", "--cache", f"{to}/triton", "--", *warmup(tmp_path, 128)])
    assert r.exit_code == ExitCode.BAD_INPUT and r.stdout == ""
    assert r.stderr == (f"cachebake: error: {to}/triton is the triton role of a cache root: give the "
                        f"install dir {to}, not {to}/triton (verify --cache takes install's --to DIR)\n")
    ok = runner.invoke(main, ["verify", "--cache", str(to), "--", *warmup(tmp_path, 128)])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("bake, note", [
    ({"driver": "kernels", "model": "nemotron-h", "tp": 1, "serve_args": {"max_num_seqs": 256}},
     "--driver kernels --model nemotron-h"),
    # the vllm driver records its recipe and the path it served from inside `model`
    ({"driver": "vllm", "model": {"recipe": "nemotron-h:8b", "path": "/models/nemotron-h-8b"},
      "serve_args": {"max_num_seqs": 256, "tensor_parallel_size": 1}},
     "--driver vllm --model nemotron-h:8b --model-dir /models/nemotron-h-8b"),
])
def test_verify_takes_the_warmup_the_installed_bake_recorded(tmp_path, baked, bake, note):
    """`verify --cache DIR` (no --model, no command) runs the installed bake's own warmup: on
    this machine without a GPU that driver's preflight refuses (exit 7), not 'nothing to run'."""
    from cachebake.artifact.pack import CacheRoot, pack_artifact
    from cachebake.install.inventory import InstallMarker
    from cachebake.verify import installed_warmup

    art, to = tmp_path / "art", tmp_path / "to"
    pack_artifact([CacheRoot("triton", baked / "triton")], art, target="sm_90", bake=bake)
    runner = CliRunner()
    assert runner.invoke(main, ["install", str(art), "--to", str(to), "--target", "sm_90"]).exit_code == 0
    recorded = installed_warmup(to)
    assert recorded["driver"] == bake["driver"] and recorded["serve_args"] == bake["serve_args"]
    doc = json.loads((to / ".cachebake" / "current" / "install.json").read_text())
    assert InstallMarker.from_json(doc).warmup == recorded
    for args in ([], ["--driver", bake["driver"]]):
        r = runner.invoke(main, ["verify", "--cache", str(to), *args])
        assert r.exit_code == ExitCode.UNSUPPORTED, r.output
        assert f"cachebake: note: the installed bake's warmup: {note}" in r.stderr
        assert f"--driver {bake['driver']} cannot run here" in r.stderr


@pytest.mark.parametrize("serve_args, flag", [({"trust_remote_code": True}, "--trust-remote-code"),
                                              ({"max_num_seqs": "256; rm -rf /"}, "--max-num-seqs")])
def test_verify_refuses_an_installed_warmup_whose_serve_args_are_off_the_allowlist(tmp_path, baked, serve_args,
                                                                                 flag):
    """verify runs the installed bake's warmup (vLLM's engine, here): the artifact's serve args
    go through the one allowlist first, exit 6 naming the arg, nothing run."""
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    art, to = tmp_path / "art", tmp_path / "to"
    bake = {"driver": "vllm", "model": {"recipe": "nemotron-h:8b", "path": "/models/nemotron-h-8b"},
            "serve_args": {"tensor_parallel_size": 1, **serve_args}}
    pack_artifact([CacheRoot("triton", baked / "triton")], art, target="sm_90", bake=bake)
    runner = CliRunner()
    assert runner.invoke(main, ["install", str(art), "--to", str(to), "--target", "sm_90"]).exit_code == 0
    r = runner.invoke(main, ["verify", "--cache", str(to)])
    assert r.exit_code == ExitCode.UNSAFE, r.output
    assert "warmup.serve_args" in r.stderr and flag in r.stderr and "cannot run here" not in r.stderr


@pytest.mark.parametrize("path", ["/etc", "/models/../root/.ssh", "../etc/x", "/models/x\x9b2J"])
def test_verify_refuses_an_installed_warmup_whose_model_dir_is_not_under_models(tmp_path, baked, path):
    """The vllm driver writes the model's config.json into its model dir: a path the artifact
    recorded must be a hub id or under /models (the fold rule, one home), exit 6, nothing run."""
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    art, to = tmp_path / "art", tmp_path / "to"
    bake = {"driver": "vllm", "model": {"recipe": "nemotron-h:8b", "path": path},
            "serve_args": {"tensor_parallel_size": 1}}
    pack_artifact([CacheRoot("triton", baked / "triton")], art, target="sm_90", bake=bake)
    runner = CliRunner()
    assert runner.invoke(main, ["install", str(art), "--to", str(to), "--target", "sm_90"]).exit_code == 0
    r = runner.invoke(main, ["verify", "--cache", str(to)])
    assert r.exit_code == ExitCode.UNSAFE, r.output
    assert "is not under /models" in r.stderr and "cannot run here" not in r.stderr
    assert "\x9b" not in r.stderr


def test_a_command_bake_records_no_warmup_and_verify_asks_for_one(tmp_path, baked):
    # a command line from a file in a shared volume is never what verify executes
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    art, to = tmp_path / "art", tmp_path / "to"
    pack_artifact([CacheRoot("triton", baked / "triton")], art, target="sm_90",
                  bake={"driver": "command", "command": ["rm", "-rf", "/"], "model": "nemotron-h"})
    runner = CliRunner()
    assert runner.invoke(main, ["install", str(art), "--to", str(to), "--target", "sm_90"]).exit_code == 0
    r = runner.invoke(main, ["verify", "--cache", str(to)])
    assert r.exit_code == ExitCode.USAGE and "nothing to run" in r.stderr, r.output


@pytest.mark.parametrize("warmup, field", [
    ({"driver": "command", "model": "nemotron-h"}, "warmup.driver"),
    ({"driver": "kernels", "model": "/etc/passwd"}, "warmup.model"),
    ({"driver": "kernels", "model": "nemotron-h", "command": ["sh"]}, "warmup"),
    ({"driver": "kernels", "model": "nemotron-h", "tp": "1"}, "warmup.tp"),
])
def test_a_forged_warmup_in_install_json_is_refused_by_name(warmup, field):
    from cachebake.errors import InvalidDocument
    from cachebake.install.inventory import InstallMarker

    doc = {"layer_digest": "sha256:" + "0" * 64, "target": "cuda:90", "roles": ["triton"],
           "serve_at": "/x", "sealed_ctime_ns": 1, "dirs": [], "files": {}, "warmup": warmup}
    with pytest.raises(InvalidDocument) as e:
        InstallMarker.from_json(doc)
    assert e.value.field == field


def test_the_real_h200_bakes_warmup_resolves_to_the_serve_args_it_ran_with(tmp_path):
    """tests/data's --driver vllm bake (README's first command on the H200): what install
    records for verify, resolved as the vllm driver resolves it, is the bake's own serve args
    and model path, byte for byte (both enter torch.compile's key)."""
    import tarfile

    from cachebake.artifact.reader import open_source
    from cachebake.install.inventory import warmup_of
    from cachebake.vllm.serveargs import resolve

    with tarfile.open(Path(__file__).parent / "data" / "nemotron-h-8b-vllm-0.24-sm_90-2026-12-01.artifact.tar") as tar:
        for m in tar.getmembers():  # Debian 12's tarfile has no filter=; the archive is ours
            assert not m.name.startswith("/") and ".." not in m.name.split("/")
        tar.extractall(tmp_path)
    bake = open_source(str(tmp_path / "cachebake-nemotron-h")).select("cuda:90").manifest.bake
    warmup = warmup_of(bake)
    assert warmup == {"driver": "vllm", "model": "nemotron-h:8b", "serve_args": dict(bake.serve_args),
                      "model_dir": "/models/nemotron-h-8b"}
    recipe, args, model_dir = resolve(warmup["model"], serve_args=warmup["serve_args"],
                                      model_dir=warmup["model_dir"])
    # the recipe now sets gpu_memory_utilization 0.92, vLLM 0.24's own default: the same run
    from cachebake.vllm.kernels.plan.store import normalized_args

    assert args == {**dict(bake.serve_args), "gpu_memory_utilization": 0.92}
    assert normalized_args(args, "0.24.0") == normalized_args(dict(bake.serve_args), "0.24.0")
    assert model_dir == bake.model["path"]
