"""Before the server starts: the bake's torch.compile identity travels (serve-args, the
installer entrypoint), ``verify --check-only`` names what differs, ``verify --driver vllm``
fails when torch.compile did not load (cachebake.vllm.compile_check, bake.verify).

The identity here is a real bake's where it can be: tests/data's excerpt of the H200 bake
(vLLM 0.24.0) holds vLLM's own cache_key_factors.json; its HOME-derived factors
(VLLM_CONFIG_ROOT, VLLM_XLA_CACHE_PATH: vllm/envs.py) and the two variables its round set
(CUDA_HOME, VLLM_USE_FLASHINFER_SAMPLER: their values differ from vLLM's defaults) are what a
round of today's driver records for them (the vllm-marked tests in
tests/test_vllm_identity.py derive such records with real vLLM).  The server side of a
comparison needs vLLM; ``compare`` takes its values as data, so the verdicts are tested here
without it, and with it under the ``vllm`` marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from installkit import REPO, cli, env_with
from test_artifact_torch_paths import excerpt
from test_install_relocate_vllm import bake as pack_bake, triton_cache  # noqa: F401 (fixture)
from cachebake.bake.rounds import RoundReport
from cachebake.verify import VerifyReport
from cachebake.capture.events import EventSummary
from cachebake.vllm import identity as vi
from cachebake.vllm.engine import bake_record
from cachebake.errors import CompilesSeen, ExitCode, InvalidDocument, PreflightMismatch
from cachebake.recipes import load_recipe
from cachebake.serve.command import serve_command
from cachebake.vllm.compile_check import COST_AOT, COST_BACKEND, compare, identity_from_tree
from cachebake.vllm.serveargs import identity_serve_env

FACTORS = "vllm/torch_compile_cache/b5f17cf9b9/rank_0_0/backbone/cache_key_factors.json"
AOT_DIR = "a81caeba2363250f00754b85433a6af692f9977a61d73995655567320d0b0d0c"
PATH_FACTORS = {"VLLM_CONFIG_ROOT": "/root/.config/vllm",
                "VLLM_XLA_CACHE_PATH": "/root/.cache/vllm/xla_cache"}
SET_FACTORS = {"CUDA_HOME": "/usr/local/cuda", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
VLLM_PYTHON = os.environ.get("CACHEBAKE_VLLM_PYTHON", "")


def real_identity(**extra) -> dict:
    doc = json.loads(excerpt()[FACTORS])
    # vLLM 0.24.0's NemotronHModel.forward, line 592 (tests/test_vllm_identity.py)
    model_key = hashlib.sha256(b"0.24.0NemotronHModel.forward592").hexdigest()
    ident = {"schema": 1, "vllm_version": "0.24.0", "env_factors": vi.env_factor_values(doc["env"]),
             "env_hash": vi.hash_factors(doc["env"]), "path_factors": dict(PATH_FACTORS),
             "set_factors": dict(SET_FACTORS),
             "model": {"requested": "/models/nemotron-h-8b", "resolved": "/models/nemotron-h-8b",
                       "hf_hub_cache": None},
             "config_hash": doc["config_hash"], "code_hash": doc["code_hash"],
             "compiler_hash": doc["compiler_hash"], "backend_dirs": ["b5f17cf9b9/rank_0_0/backbone"],
             "aot": [{"hash": AOT_DIR, "rank": "rank_0_0",
                      "factors": [vi.hash_factors(doc["env"]), doc["config_hash"], model_key]}]}
    ident.update(extra)
    return ident


def server(identity: dict, **changes) -> dict:
    """What ``server_side`` would compute on a machine set up as the bake was."""
    env = dict(identity["env_factors"])
    env.update(changes.pop("env", {}))
    raw = {**json.loads(excerpt()[FACTORS])["env"], **{k: v for k, v in env.items()}}
    out = {"vllm_version": "0.24.0", "env_factors": env, "env_hash": vi.hash_factors(raw),
           "engine_args": None, "frontend_flags": [], "vllm_cache_root": None}
    out.update(changes)
    return out


# ---- the verdicts -------------------------------------------------------------------------

def test_as_the_bake_had_it_vllm_computes_the_bakes_dirs():
    ident = real_identity()
    report = compare(ident, server(ident), source="test", model="/models/nemotron-h-8b")
    assert report.ok and report.differences == []
    assert report.predicted == {"backend_dirs": ["b5f17cf9b9"], "aot": [AOT_DIR]}
    assert "would load the bake here: vLLM computes torch_compile_cache/b5f17cf9b9" in report.summary()
    report.check()  # no error


def test_another_home_names_each_factor_and_what_it_costs():
    ident = real_identity()
    moved = {"VLLM_CONFIG_ROOT": "/home/server/.config/vllm",
             "VLLM_XLA_CACHE_PATH": "/home/server/.cache/vllm/xla_cache"}
    report = compare(ident, server(ident, env=moved), source="test", model="/models/nemotron-h-8b")
    assert [d.factor for d in report.differences] == ["env VLLM_CONFIG_ROOT", "env VLLM_XLA_CACHE_PATH"]
    first = report.differences[0]
    assert (first.baked, first.here) == ("/root/.config/vllm", "/home/server/.config/vllm")
    assert first.cost.startswith(COST_AOT) and "~9 s at every start (8.2-9.5 s measured" in first.cost
    assert "export it as `cachebake serve-args` prints it" in first.cost
    assert report.predicted.get("aot") != [AOT_DIR]
    with pytest.raises(PreflightMismatch) as e:
        report.check()
    assert e.value.code == ExitCode.PREFLIGHT == 4
    assert e.value.details()[0].startswith("env VLLM_CONFIG_ROOT: /root/.config/vllm in the bake, "
                                           "/home/server/.config/vllm here: the torch.compile cache")


def test_a_variable_the_bake_set_and_the_server_did_not():
    ident = real_identity()
    report = compare(ident, server(ident, env={"VLLM_USE_FLASHINFER_SAMPLER": True}), source="t", model=None)
    assert [(d.factor, d.baked, d.here) for d in report.differences] == [
        ("env VLLM_USE_FLASHINFER_SAMPLER", False, True)]


def test_engine_arguments_name_the_config_part_that_hashes_them():
    engine = {"model": "/models/nemotron-h-8b", "tensor_parallel_size": 1, "max_num_seqs": 256,
              "served_model_name": None, "load_format": "dummy"}
    parts = {"parallel_config": {"hash": "x", "factors": {"tensor_parallel_size": 1}},
             "model_config": {"hash": "y", "factors": {"model": "/models/nemotron-h-8b"}}}
    ident = real_identity(engine_args=engine, config_parts=parts)
    baked_args = {"tensor_parallel_size": 1, "max_num_seqs": 256}
    here = {**engine, "tensor_parallel_size": 2, "max_num_seqs": 128, "served_model_name": "n",
            "load_format": "auto"}
    report = compare(ident, server(ident, engine_args=here, frontend_flags=["port"]), source="t",
                     model="/models/nemotron-h-8b", baked_serve_args=baked_args)
    got = {d.factor: d.cost for d in report.differences}
    assert set(got) == {"serve arg max_num_seqs", "serve arg tensor_parallel_size"}
    assert "parallel_config hash holds it" in got["serve arg tensor_parallel_size"]
    assert "Triton kernels" in got["serve arg max_num_seqs"]  # a serve arg no config part hashes by name
    assert any("--port" in u for u in report.unchecked)
    assert "predicted" not in report.to_dict() or not report.predicted.get("aot")
    path = compare(ident, server(ident, engine_args={**engine, "model": "/srv/m"}), source="t",
                   model="/srv/m", baked_serve_args=baked_args)
    assert [d.factor for d in path.differences] == ["model (ModelConfig.model)"]


def test_another_install_path_is_a_code_hash_miss_the_aot_artifact_survives():
    ident = real_identity(roots={"vllm": "/tmp/vsite/vllm"}, traced_files=[])
    here = server(ident, code_hash="0" * 64, roots={"vllm": "/usr/lib/python3/dist-packages/vllm"},
                  changed_files=[])
    report = compare(ident, here, source="t", model=None)
    (diff,) = report.differences
    assert diff.factor == "code hash (traced source files)" and diff.cost.startswith(COST_BACKEND)
    assert "install paths vllm /tmp/vsite/vllm -> /usr/lib/python3/dist-packages/vllm" in diff.cost
    assert report.predicted.get("aot") == [AOT_DIR]  # the AOT hash holds no code hash


def test_the_installed_tree_is_checked_for_the_predicted_dirs(tmp_path):
    ident = real_identity()
    root = tmp_path / "vllm"
    report = compare(ident, server(ident, vllm_cache_root=str(root)), source="t", model=None,
                     cache_root=str(root))
    assert {d.factor for d in report.differences} == {"installed backend dir", "installed AOT artifact"}
    elsewhere = compare(ident, server(ident, vllm_cache_root="/root/.cache/vllm"), source="t",
                        model=None, cache_root=str(root))
    assert [d.factor for d in elsewhere.differences] == ["VLLM_CACHE_ROOT"]


def test_vllms_own_files_in_the_tree_are_an_identity(tmp_path):
    for name, data in excerpt().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    ident = identity_from_tree(str(tmp_path / "vllm"))
    assert ident["backend_dirs"] == ["b5f17cf9b9/rank_0_0/backbone"] and ident["aot"] == [{"hash": AOT_DIR}]
    report = compare(ident, server(real_identity(), vllm_cache_root=str(tmp_path / "vllm")),
                     source="tree", model=None, cache_root=str(tmp_path / "vllm"))
    assert report.ok and report.predicted == {"backend_dirs": ["b5f17cf9b9"]}
    assert any("pass --artifact" in u for u in report.unchecked)


# ---- it travels ---------------------------------------------------------------------------

def test_the_env_a_server_needs_comes_from_the_record_and_only_from_it():
    assert identity_serve_env({"compile_identity": real_identity()}) == PATH_FACTORS
    assert identity_serve_env({}) == {}
    hub = real_identity(model={"requested": "org/m", "resolved": "/hf/hub/models--org--m/snapshots/ab",
                               "hf_hub_cache": "/hf/hub"})
    assert identity_serve_env({"compile_identity": hub}) == {**PATH_FACTORS, "HF_HUB_CACHE": "/hf/hub",
                                                             "HF_HUB_OFFLINE": "1"}
    for bad in ({"path_factors": {"LD_PRELOAD": "/x.so"}},
                {"path_factors": {"VLLM_CONFIG_ROOT": "/elsewhere"}},  # not the value it hashed
                {"path_factors": {"VLLM_CONFIG_ROOT": "relative"}, "env_factors": {"VLLM_CONFIG_ROOT": "relative"}},
                {"path_factors": {"VLLM_CONFIG_ROOT": "/a\nb"}, "env_factors": {"VLLM_CONFIG_ROOT": "/a\nb"}},
                {"model": {"hf_hub_cache": "hub"}}, {"path_factors": []}):
        with pytest.raises(InvalidDocument):
            identity_serve_env({"compile_identity": real_identity(**bad)})


def _manifest(identity: dict | None = None) -> dict:
    r = load_recipe("nemotron-h")
    rec = bake_record(r, r.serve_args, "/models/nemotron-h-8b",
                      {"TRITON_CACHE_DIR": "/var/cache/cachebake/triton", "VLLM_USE_V2_MODEL_RUNNER": "1"})
    if identity is not None:
        rec["compile_identity"] = identity
    return {"roles": ["triton", "vllm"], "bake": rec}


def test_serve_args_exports_the_path_factors_and_says_what_it_cannot():
    cmd = serve_command(_manifest(real_identity()), root="/srv/cache")
    assert {k: cmd.env[k] for k in PATH_FACTORS} == PATH_FACTORS
    assert cmd.env["VLLM_CACHE_ROOT"] == "/srv/cache/vllm" and cmd.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "CUDA_HOME" not in cmd.env  # a compile factor the bake set: named, not exported
    notes = " ".join(cmd.notes)
    assert "pass the model exactly as /models/nemotron-h-8b" in notes
    assert "CUDA_HOME=/usr/local/cuda, VLLM_USE_FLASHINFER_SAMPLER=0 set" in notes
    hostile = real_identity(set_factors={"VLLM_X": "a\nrm -rf /"})
    assert all("\n" not in n for n in serve_command(_manifest(hostile)).notes)
    assert serve_command(_manifest(), root="/srv/cache").notes == []  # an older record: nothing to add


def test_serve_args_env_file_and_the_installer_entrypoint(tmp_path, triton_cache):  # noqa: F811
    art = tmp_path / "art"
    src = tmp_path / "filled"
    for name, data in excerpt().items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    pack_artifact([CacheRoot("triton", triton_cache), CacheRoot("vllm", src / "vllm")], art,
                  target="sm_90", layer_root="/var/cache/cachebake",
                  bake=_manifest(real_identity())["bake"])
    env_file = tmp_path / "serve.env"
    r = cli("serve-args", art, "--root", "/srv/cache", "--env-file", env_file, check=True)
    assert "export VLLM_CONFIG_ROOT=/root/.config/vllm" in r.stdout
    sourced = sourced_env(env_file, home="/nonexistent")
    assert {k: sourced[k] for k in PATH_FACTORS} == PATH_FACTORS
    assert sourced["VLLM_CACHE_ROOT"] == "/srv/cache/vllm"

    # the installer image's entrypoint: install, then DIR/cachebake-serve.env
    dest = tmp_path / "volume"
    run = subprocess.run(["sh", str(REPO / "docker" / "cachebake-init.sh")], capture_output=True, text=True,
                         env=env_with(CACHEBAKE_ARTIFACT=art, CACHEBAKE_DIR=dest, CACHEBAKE_TARGET="sm_90",
                                      CACHEBAKE_SERVE_AT="/var/cache/cachebake",
                                      PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"),
                         cwd="/")
    assert run.returncode == 0, run.stderr
    sourced = sourced_env(dest / "cachebake-serve.env", home="/home/someone-else")
    assert {k: sourced[k] for k in PATH_FACTORS} == PATH_FACTORS
    assert sourced["TRITON_CACHE_DIR"] == "/var/cache/cachebake/triton"
    assert (dest / "vllm" / "torch_compile_cache" / "b5f17cf9b9").is_dir()


def sourced_env(env_file: Path, home: str) -> dict:
    r = subprocess.run(["sh", "-c", '. "$1" && env -0', "sh", str(env_file)], capture_output=True,
                       env={"PATH": os.environ["PATH"], "HOME": home})
    assert r.returncode == 0, r.stderr
    return dict(item.split("=", 1) for item in r.stdout.decode().split("\0") if "=" in item)


def test_an_env_file_with_a_name_that_is_no_variable_is_refused(tmp_path):
    from cachebake.cli.serve import write_env_file
    from cachebake.errors import BadInput

    with pytest.raises(BadInput, match="no variable names"):
        write_env_file(str(tmp_path / "e"), {"A;rm -rf /": "x"})
    assert not (tmp_path / "e").exists()


# ---- verify --driver vllm: torch.compile must have loaded ----------------------------------

def _verify_report(outcome: dict | None) -> VerifyReport:
    rnd = RoundReport(index=1, exit_code=0, seconds=1.0, summary=EventSummary.of([]), log="/dev/null")
    return VerifyReport(cache="/c", roles=["triton", "vllm"], round=rnd, torch_compile=outcome)


def test_verify_fails_when_torch_compile_did_not_load():
    ok = _verify_report({"aot": "loaded", "graphs_compiled": 0})
    assert ok.ok
    ok.check()
    miss = _verify_report({"aot": "compiled", "aot_paths": ["/c/vllm/torch_compile_cache/torch_aot_compile/x/rank_0_0/model"],
                           "graphs_compiled": 5})
    assert not miss.ok and miss.lines()[-1].startswith("torch.compile: no AOT artifact at the path")
    with pytest.raises(CompilesSeen) as e:
        miss.check()
    assert e.value.code == ExitCode.COMPILES_SEEN == 8
    assert miss.to_dict()["torch_compile"]["aot"] == "compiled"
    assert _verify_report(None).ok  # not the vllm driver


def test_check_only_options(tmp_path):
    r = cli("verify", "--check-only", "--cache", tmp_path, "--driver", "vllm")
    assert r.returncode == ExitCode.USAGE and "no round runs with --check-only" in r.stderr  # options that do not mix
    r = cli("verify", "--cache", tmp_path, "--model-ref", "x")
    assert r.returncode == ExitCode.USAGE and "are for --check-only" in r.stderr
    r = cli("verify", "--check-only", "--cache", tmp_path)
    assert r.returncode == ExitCode.BAD_INPUT and "no vllm role here" in r.stderr


# ---- with real vLLM: the check in a serving environment -------------------------------------

@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not os.access(VLLM_PYTHON or "/nonexistent", os.X_OK),
                    reason="set CACHEBAKE_VLLM_PYTHON to an interpreter with vLLM")
def test_check_only_with_real_vllm_on_an_installed_real_bake(tmp_path, triton_cache):  # noqa: F811
    """vLLM 0.24's own compile_factors() here, against the H200 bake's factors in the installed
    tree: as the bake had it, it would hit; another HOME names the two path factors; the
    variables serve-args exports make it hit again, whatever the HOME."""
    if "0.24" not in subprocess.run([VLLM_PYTHON, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                                    capture_output=True, text=True).stdout:
        pytest.skip("the H200 bake's factors are vLLM 0.24.0's")
    art = pack_bake(tmp_path, triton_cache)
    to = tmp_path / "cache"
    cli("install", art, "--to", to, "--target", "sm_90", check=True)

    def check(**env):
        base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_", "CUDA_"))}
        base.update(PYTHONPATH=str(REPO), VLLM_CACHE_ROOT=str(to / "vllm"), **SET_FACTORS, **env)
        return subprocess.run([VLLM_PYTHON, "-m", "cachebake.cli", "verify", "--check-only", "--cache",
                               str(to), "--json"], capture_output=True, text=True, env=base, cwd="/",
                              timeout=600)

    hit = check(HOME="/root")
    assert hit.returncode == 0, hit.stderr
    assert json.loads(hit.stdout)["predicted"]["backend_dirs"] == ["b5f17cf9b9"]
    miss = check(HOME="/home/server")
    assert miss.returncode == ExitCode.PREFLIGHT, miss.stderr
    assert [d["factor"] for d in json.loads(miss.stdout)["differences"]] == [
        "env VLLM_CONFIG_ROOT", "env VLLM_XLA_CACHE_PATH"]
    fixed = check(HOME="/home/server", **PATH_FACTORS)
    assert fixed.returncode == 0, fixed.stderr


def test_traced_files_a_record_names_are_read_as_files_only(tmp_path):
    """A hostile record naming a device or a FIFO as a traced file: read as unreadable (vLLM's
    own fallback for a file it cannot read), never blocking or endless."""
    from cachebake.vllm.compile_check import _traced_here

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    src = tmp_path / "site" / "vllm" / "model.py"
    src.parent.mkdir(parents=True)
    src.write_text("x = 1\n")
    here = tmp_path / "here" / "vllm" / "model.py"
    here.parent.mkdir(parents=True)
    here.write_text("x = 2\n")
    ident = {"roots": {"vllm": str(src.parent)},
             "traced_files": [{"path": "/dev/zero", "sha256": "0" * 64}, {"path": str(fifo), "sha256": None},
                              {"path": str(src), "sha256": hashlib.sha256(b"x = 1\n").hexdigest()},
                              {"path": f"{src.parent}/../../etc/passwd", "sha256": None}]}
    paths, changed = _traced_here(ident, {"vllm": str(here.parent)})
    assert paths[:3] == ["/dev/zero", str(fifo), str(here)]  # the vLLM file at this install's path
    assert paths[3] == f"{src.parent}/../../etc/passwd"  # not joined to this install: ".." in it
    assert changed == ["/dev/zero", str(here)]


# ---- the real --driver vllm artifact of 2026-12-01 (tests/data) --------------------------

REAL_ART = Path(__file__).parent / "data" / "nemotron-h-8b-vllm-0.24-sm_90-2026-12-01.artifact.tar"


@pytest.fixture(scope="module")
def real_bake(tmp_path_factory):
    """The artifact README's first command made on the H200 (tests/data/README.md), unpacked:
    its manifest, read by today's strict reader, and its bake section."""
    import tarfile

    d = tmp_path_factory.mktemp("real")
    with tarfile.open(REAL_ART) as tar:
        for m in tar.getmembers():  # Debian 12's tarfile has no filter=; the archive is ours
            assert not m.name.startswith("/") and ".." not in m.name.split("/")
        tar.extractall(d)
    from cachebake.artifact.reader import open_source

    art = d / "cachebake-nemotron-h"
    return art, open_source(str(art)).select("cuda:90").manifest


def test_the_real_bakes_identity_travels_as_recorded(real_bake):
    art, manifest = real_bake
    bake = manifest.bake.to_json()
    assert bake["compile_identity"]["path_factors"] == {"VLLM_CONFIG_ROOT": "/root/.config/vllm",
                                  "VLLM_XLA_CACHE_PATH": "/root/.cache/vllm/xla_cache"}
    env = identity_serve_env(bake)
    assert env["VLLM_CONFIG_ROOT"] == "/root/.config/vllm"
    assert env["VLLM_XLA_CACHE_PATH"] == "/root/.cache/vllm/xla_cache"
    # what serve-args prints for an install at another path: the roles there, the factors as baked
    r = cli("serve-args", art, "--root", "/srv/cb", "--json", check=True)
    printed = json.loads(r.stdout)["env"]
    assert printed["VLLM_CACHE_ROOT"] == "/srv/cb/vllm" and printed["TRITON_CACHE_DIR"] == "/srv/cb/triton"
    assert printed["VLLM_CONFIG_ROOT"] == "/root/.config/vllm"


@pytest.mark.vllm
@pytest.mark.skipif(not os.access(VLLM_PYTHON or "/nonexistent", os.X_OK),
                    reason="set CACHEBAKE_VLLM_PYTHON to an interpreter with vLLM")
def test_the_checks_compiler_factors_are_the_engines(real_bake):
    """Found on the H200: the engine takes vLLM's compiler hash inside torch's AOT compile,
    whose functorch patch is part of the hashed config; a check outside it computed another
    functorch digest and said every AOT bake would miss.  Under the same patch the check's
    digest is the recorded one (same torch build: 2.11.0)."""
    _, manifest = real_bake
    bake = manifest.bake.to_json()
    recorded = bake["compile_identity"]["compiler_factors"]["functorch_config"]
    code = ("import json, torch; from cachebake.vllm import identity as vi; "
            "print(json.dumps([torch.__version__, vi.compiler_factors(aot_compile=True)['functorch_config'], "
            "vi.compiler_factors()['functorch_config']]))")
    r = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    version, under_aot, plain = json.loads(r.stdout.strip().splitlines()[-1])
    if not version.startswith("2.11.0"):
        pytest.skip(f"the bake's torch is 2.11.0, this one {version}")
    assert under_aot == recorded and plain != recorded


def test_the_real_bakes_dirs_are_predicted_from_the_engines_config_hash(real_bake):
    """Found on the H200: the engine resolves more of its config during start-up than the
    round's own VllmConfig (its hash differs); the dirs a server with the bake's inputs
    computes are the ones the engine's hash names, in the installed tree."""
    _, manifest = real_bake
    identity = manifest.bake.to_json()["compile_identity"]
    assert identity["engine"]["config_hash"] != identity["config_hash"]
    server = {"env_hash": identity["engine"]["env_hash"], "env_factors": identity["env_factors"],
              "vllm_version": identity["vllm_version"], "code_hash": identity["code_hash"],
              "compiler_factors": identity["compiler_factors"]}
    report = compare(identity, server, source="test", model=None)
    assert not report.differences, [str(d) for d in report.differences]
    assert report.predicted["backend_dirs"] == ["b5f17cf9b9"]
    assert [h[:12] for h in report.predicted["aot"]] == ["a81caeba2363"]


def test_k8s_gives_the_server_the_bakes_torch_compile_variables(real_bake):
    """``cachebake k8s --bake ART``: the server container's env carries the bake's
    torch.compile variables as recorded (serve-args' env), the roles at the serving root."""
    from cachebake.distribute.k8s import PodPlan, pod_spec

    art, _ = real_bake
    r = cli("k8s", "--artifact", "docker://registry.example/bakes/nemotron:sm_90", "--serving-image", "vllm",
            "--target", "sm_90", "--install-in-serving-image", "--bake", art, "--model-pvc", "models",
            "--format", "json", check=True)
    doc = json.loads(r.stdout)
    (server,) = doc["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["VLLM_CONFIG_ROOT"] == "/root/.config/vllm"
    assert env["VLLM_XLA_CACHE_PATH"] == "/root/.cache/vllm/xla_cache"
    assert env["VLLM_CACHE_ROOT"] == "/var/cache/cachebake/vllm"
    spec, _ = pod_spec(PodPlan(artifact="docker://r.example/b:sm_90", serving_image="v", target="sm_90",
                               install_in_serving_image=True, command=["true"]))
    assert "VLLM_CONFIG_ROOT" not in {e["name"] for e in spec["containers"][0]["env"]}
