"""serve-args: what `eval "$(cachebake serve-args ART)"` runs is exactly the exports and the one
`vllm serve` command the bake records, whatever the artifact holds.  Checked with the real
parser: bash evaluates the real command's output, with `vllm` a shell function that records
its arguments, and a canary file that any injected command would create."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachebake.artifact.pack import CacheRoot, pack_artifact
from cachebake.errors import ExitCode
from cachebake.serve.command import ServeCommand, comment, one_line

REPO = Path(__file__).resolve().parent.parent

# An injected command would create CANARY (the tests run it in a temp dir, cwd).
INJECT = "$(touch CANARY)"
HOSTILE_VALUES = {
    "VLLM_SUBST": INJECT, "VLLM_BACKTICK": "`touch CANARY`", "VLLM_QUOTES": "'\"'\"; touch CANARY; '\\",
    "VLLM_NEWLINES": "a\nexport EVIL=1\n---\ntouch CANARY", "VLLM_ESC": "\x1b]0;t\x07\x1b[2J",
    "VLLM_CR": "a\rb", "VLLM_EMPTY": "", "VLLM_SPACES": "  x  y ", "VLLM_UNICODE": "é\u2028\u2029\x85",
    "VLLM_GLOB": "*", "VLLM_DOLLAR": "$HOME ${PATH}", "VLLM_SEMI": "x; touch CANARY",
}
HOSTILE_KEYS = ["X;touch CANARY;Y", "A=B", "$(touch CANARY)", "PATH\nexport EVIL", "1X", "X Y", "`id`",
                "X-Y", "", "É"]


def _bake(**extra) -> dict:
    return {"driver": "vllm", "model": {"path": "/models/m"}, "serve_args": {"max_num_seqs": 8},
            "serve_env": {"TRITON_CACHE_AUTOTUNING": "1"}, **extra}


def _artifact(triton_cache, tmp_path, bake) -> Path:
    art = tmp_path / "art"
    pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90", bake=bake)
    return art


def _manifest_file(tmp_path, doc) -> Path:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(doc))
    return path


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "CACHEBAKE_", "VLLM_"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


# vllm is a function that writes its argv (NUL-separated); cachebake one that runs the real CLI
# and keeps its exit status (eval's own is the last command's); the env before and after eval.
_EVAL = ('vllm() { printf "%s\\0" "$@" > argv.bin; }; '
         'cachebake() { "$PY" -m cachebake.cli "$@"; echo $? > rc; }; '
         'env -0 > before.bin; eval "$(cachebake serve-args "$ART" "${EXTRA[@]}")"; '
         'env -0 > after.bin; exit "$(cat rc)"')


def _eval(art, cwd: Path, *extra):
    """bash -c 'eval "$(cachebake serve-args ART)"': (rc, argv vllm got, env it added/changed)."""
    script = f"EXTRA=({' '.join(map(repr, extra))}); " + _EVAL
    r = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                       env=_env(PY=sys.executable, ART=str(art)), timeout=120)

    def parse(name):
        data = (cwd / name).read_bytes() if (cwd / name).exists() else b""
        return [x.decode() for x in data.split(b"\0")[:-1]]
    before = dict(x.split("=", 1) for x in parse("before.bin"))
    after = dict(x.split("=", 1) for x in parse("after.bin"))
    changed = {k: v for k, v in after.items() if before.get(k) != v and k != "_"}
    return r, parse("argv.bin"), changed


def test_eval_runs_exactly_the_exports_and_the_command_of_a_hostile_artifact(triton_cache, tmp_path):
    # one line: a model path with a line break is refused (test_a_model_path_with_a_line_break...)
    model = "/models/m $(touch CANARY)`touch CANARY`; touch CANARY"
    # (the hostile values ride on cache-invalidating names: serve_env passes only the vllm
    # driver's own few names since issue 31, test_every_route_refuses_what_the_rules_refuse)
    hostile = {"TRITON_" + k[len("VLLM_"):]: v for k, v in HOSTILE_VALUES.items()}
    # (hostile serve args are refused whole since issue 31: test_serve_args_off_the_allowlist...)
    bake = _bake(model={"path": model}, invalidating_env_vars=hostile,
                 serve_args={"max_num_seqs": 8, "dtype": "bfloat16"})
    art = _artifact(triton_cache, tmp_path, bake)
    work = tmp_path / "work"
    work.mkdir()
    r, argv, changed = _eval(art, work)
    assert r.returncode == 0, r.stderr
    assert not (work / "CANARY").exists()
    from cachebake.artifact.fingerprint import current_fingerprint
    from cachebake.roles import DEFAULT_ROOT, serving_env
    expected = {**hostile, **serving_env(str(DEFAULT_ROOT), ["triton"])}  # the roles at the layer root
    expected.update(current_fingerprint("sm_90").env)  # the bake's cache-invalidating variables
    assert changed == expected
    assert argv == ["serve", model, "--dtype", "bfloat16", "--max-num-seqs", "8"]  # as packed: sorted


@pytest.mark.parametrize("serve_args, named", [
    ({"trust_remote_code": True}, "--trust-remote-code is not one"),
    ({"download_dir": "/tmp/evil"}, "--download-dir is not one"),
    ({"tokenizer": INJECT}, "--tokenizer is not one"),
    ({"hf_overrides": {"architectures": ["Evil"]}}, "--hf-overrides is not one"),
    ({"worker_cls": "evil.Worker"}, "--worker-cls is not one"),
    ({"weird_key; touch CANARY": "x\ny"}, "--weird-key; touch CANARY is not one"),
    ({"max_num_seqs": "8; touch CANARY"}, "--max-num-seqs has a value an artifact may not carry: must be an integer"),
    ({"dtype": "$(touch CANARY)"}, "--dtype has a value an artifact may not carry: must be one of"),
    ({"gpu_memory_utilization": True}, "--gpu-memory-utilization has a value"),
    ({"compilation_config": {"cache_dir": "/tmp/evil"}}, "holds 'cache_dir'"),
    ({"compilation_config": {"inductor_compile_config": {"post_grad_custom_post_pass": "evil.p"}}},
     "holds 'inductor_compile_config'"),
    ({"compilation_config": {"backend": "evil.module.backend"}}, "backend must be one of"),
    ({"compilation_config": {"splitting_ops": ["$(touch CANARY)"]}}, "splitting_ops must be a list of op names"),
    ({"speculative_config": {"method": "draft_model", "model": "/tmp/evil"}}, "--speculative-config has a value"),
    ({"speculative_config": {"method": "ngram", "model": "/tmp/evil"}}, "holds 'model'"),
])
def test_serve_args_off_the_allowlist_are_refused_naming_the_arg(triton_cache, tmp_path, serve_args, named):
    """An artifact's serve args become the server's command: only those on the one allowlist
    (serveargs.SERVE_ARG_KINDS), each with a value of its kind; anything else is refused, exit 6,
    one line naming the arg, and `eval` runs nothing."""
    bake = _bake(serve_args={"max_num_seqs": 8, **serve_args})
    art = _artifact(triton_cache, tmp_path, bake)
    work = tmp_path / "work"
    work.mkdir()
    r, argv, changed = _eval(art, work)
    assert r.returncode == ExitCode.UNSAFE, r.stderr
    assert r.stderr.count("\n") == 1 and named in r.stderr and "bake.serve_args" in r.stderr, r.stderr
    assert argv == [] and changed == {} and not (work / "CANARY").exists()


def test_the_allowlist_takes_what_real_bakes_and_recipes_record(tmp_path):
    """Every recipe's serve args and the serve args of the real bakes in tests/data pass: no
    real bake is refused by the allowlist."""
    from cachebake.recipes import list_recipes
    from cachebake.vllm.serveargs import carried_serve_args

    seen = 0
    for recipe in list_recipes():
        assert carried_serve_args(recipe.serve_args, recipe.ref, "serve_args") == recipe.serve_args
        seen += 1
    for tar in sorted((Path(__file__).parent / "data").glob("*.artifact.tar")):
        import tarfile

        with tarfile.open(tar) as tf:
            member = next(m for m in tf.getmembers() if m.name.endswith("/cachebake.json"))
            doc = json.load(tf.extractfile(member))
        for bake in doc["bakes"].values():
            args = bake["bake"]["serve_args"]
            assert args and carried_serve_args(args, tar.name, "bake.serve_args") == args
            seen += 1
    assert seen >= 12


@pytest.mark.parametrize("key, where", [*((k, "serve_env") for k in HOSTILE_KEYS),
                                        *((k, w) for k in HOSTILE_KEYS[:3]
                                          for w in ("invalidating_env_vars", "env.invalidating_env_vars"))])
def test_a_key_that_is_no_variable_name_is_refused_naming_it(triton_cache, tmp_path, key, where):
    section = {key: "1"}
    bake = _bake(env={"invalidating_env_vars": section}) if where.startswith("env.") else _bake(**{where: section})
    art = _artifact(triton_cache, tmp_path, bake)
    work = tmp_path / "work"
    work.mkdir()
    r, argv, changed = _eval(art, work)
    assert r.returncode == ExitCode.CORRUPT, r.stderr
    assert r.stderr.count("\n") == 1 and ascii(key) in r.stderr and f"bake.{where}" in r.stderr
    assert "Traceback" not in r.stderr and "\x1b" not in r.stderr
    assert argv == [] and changed == {} and not (work / "CANARY").exists()


def test_a_manifest_json_file_gets_the_same_checks_and_the_strict_reader(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    doc = {"bake": _bake(), "fingerprint": {"env": {"X;touch CANARY": "1"}}}
    r, argv, changed = _eval(_manifest_file(tmp_path, doc), work)
    assert r.returncode == ExitCode.CORRUPT and "fingerprint.env['X;touch CANARY']" in r.stderr
    assert argv == [] and changed == {} and not (work / "CANARY").exists()
    # the strict reader: duplicate keys (two parsers, two values) and NaN are refused
    path = tmp_path / "dup.json"
    path.write_text('{"bake": {"driver": "vllm", "model": {"path": "/m"}, "serve_args": {}, '
                    '"serve_env": {"A": "1", "A": "$(touch CANARY)"}}}')
    r, argv, changed = _eval(path, work)
    assert r.returncode == ExitCode.CORRUPT and "appears twice" in r.stderr and changed == {}
    path.write_text('{"bake": {"driver": "vllm", "model": {"path": "/m"}, "serve_args": {"x": NaN}}}')
    assert _eval(path, work)[0].returncode == ExitCode.CORRUPT
    # a value of the wrong type is a malformed document, never a crash
    for bad in ({"serve_env": {"A": 1}}, {"serve_env": ["A"]}, {"model": {"path": 7}},
                {"env": {"root": ["x"]}}, {"env": {"root": "relative"}}, {"roles": ["triton", "x"]}):
        r, argv, changed = _eval(_manifest_file(tmp_path, {"bake": _bake(**bad)}), work)
        assert r.returncode == ExitCode.CORRUPT, (bad, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and changed == {}


def test_a_note_from_a_hostile_install_json_is_one_comment_line(triton_cache, tmp_path):
    """install.json sits in a shared volume: a reason it records becomes a comment, folded."""
    from installkit import cli

    art = _artifact(triton_cache, tmp_path, _bake())
    to = tmp_path / "installed"
    cli("install", art, "--to", to, "--target", "sm_90", check=True)
    marker = next((to / ".cachebake" / "versions").glob("*/install.json"))
    doc = json.loads(marker.read_text())
    why = "no vllm\nexport EVIL=1\ntouch CANARY\x1b[2J"
    doc["left_out"] = {"vllm": why}
    marker.write_text(json.dumps(doc))
    work = tmp_path / "work"
    work.mkdir()
    r, argv, changed = _eval(art, work, "--root", str(to))
    assert r.returncode == 0, r.stderr
    assert "EVIL" not in changed and not (work / "CANARY").exists() and argv[0] == "serve"
    out = subprocess.run([sys.executable, "-m", "cachebake.cli", "serve-args", str(art), "--root", str(to)],
                         capture_output=True, text=True, env=_env(), cwd=work).stdout
    comments = [ln for ln in out.splitlines() if ln.startswith("#")]
    assert comments == [comment(f"the vllm role was left out at install ({why}): not exported")]
    assert "VLLM_CACHE_ROOT" not in changed and changed["TRITON_CACHE_DIR"] == f"{to}/triton"
    doc["left_out"] = {"../etc": "x"}  # not a role: a malformed document
    marker.write_text(json.dumps(doc))
    r, argv, changed = _eval(art, work, "--root", str(to))
    assert r.returncode == ExitCode.CORRUPT and "left_out" in r.stderr and changed == {}


def test_one_line_escapes_every_line_break_and_control_character():
    text = "a\nb\rc\x85d\u2028e\u2029f\x1b[2J\x00\x7f\x9b"
    out = one_line(text)
    assert out == "a\\nb\\rc\\x85d\\u2028e\\u2029f\\x1b[2J\\x00\\x7f\\x9b"
    assert len(out.splitlines()) == 1 and out.isprintable()


def test_shell_refuses_a_key_added_after_the_manifest_was_read():
    from cachebake.errors import CorruptArtifact

    cmd = ServeCommand("/m", [], env={"OK": "1", "BAD;touch CANARY": "1"})
    with pytest.raises(CorruptArtifact, match="BAD;touch CANARY"):
        cmd.shell()


def test_on_a_terminal_the_text_is_printable(triton_cache, tmp_path):
    """Piped (eval), the bytes are exact; on a terminal, a quoted ESC is shown, not acted on."""
    import io

    from rich.console import Console

    from cachebake.cli.render import render_serve_command

    cmd = ServeCommand("/m", [], env={"A": "x\x1b[2Jy\rz"})
    piped, tty = io.StringIO(), io.StringIO()
    render_serve_command(cmd, Console(file=piped, force_terminal=False))
    render_serve_command(cmd, Console(file=tty, force_terminal=True))
    assert piped.getvalue() == cmd.shell() + "\n" and "\x1b[2J" in piped.getvalue() and "\r" in piped.getvalue()
    assert "\x1b" not in tty.getvalue() and "\r" not in tty.getvalue() and "export A=" in tty.getvalue()


def _kernels_bake_section() -> dict:
    """A --driver kernels bake section as build writes it: the driver's description, then the
    driver's record (cachebake.vllm.kernels.driver.bake_record) with the stored engine plan."""
    from cachebake.vllm.kernels.driver import bake_record
    from cachebake.vllm.kernels.plan.store import stored_plan
    from cachebake.vllm.serveargs import resolve

    recipe, args, _ = resolve("nemotron-h")
    plan = stored_plan(recipe, args)
    return {"driver": "kernels", "function": "cachebake.vllm.kernels.driver:run_sweep", "model": "nemotron-h",
            **bake_record(recipe, plan, "stored", [])}


def test_a_kernels_bake_names_the_flags_its_plan_was_computed_for(triton_cache, tmp_path):
    from cachebake.vllm.serveargs import BAKE_ONLY, serve_args_to_flags

    bake = _kernels_bake_section()
    flags = serve_args_to_flags({k: v for k, v in bake["plan"]["serve_args"].items() if k not in BAKE_ONLY})
    assert "--max-num-batched-tokens" in flags
    for source in (_artifact(triton_cache, tmp_path, bake), _manifest_file(tmp_path, {"bake": bake})):
        r = subprocess.run([sys.executable, "-m", "cachebake.cli", "serve-args", str(source)],
                           capture_output=True, text=True, env=_env(), cwd=tmp_path)
        assert r.returncode == ExitCode.BAD_INPUT and r.stdout == "" and r.stderr.count("\n") == 1
        assert f"`vllm serve MODEL {' '.join(flags)}` on NVIDIA H200" in r.stderr
        assert "--driver kernels bake" in r.stderr and "--driver vllm bake gives the whole command" in r.stderr


def test_a_kernels_bakes_flags_from_a_hostile_manifest_stay_on_one_line(tmp_path):
    bake = _kernels_bake_section()
    bake["plan"]["serve_args"] = {"max_num_seqs\nexport EVIL=1": "8\x1b[2J\n---"}
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "serve-args",
                        str(_manifest_file(tmp_path, {"bake": bake}))], capture_output=True, text=True,
                       env=_env(), cwd=tmp_path)
    # refused by the allowlist (issue 31), named on one line, escaped
    assert r.returncode == ExitCode.UNSAFE and r.stderr.count("\n") == 1, r.stderr
    assert "\x1b" not in r.stderr and "--max-num-seqs\\nexport EVIL=1 is not one" in r.stderr
    bake["plan"]["serve_args"] = {"max_num_seqs": "8\x1b[2J\n---"}
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "serve-args",
                        str(_manifest_file(tmp_path, {"bake": bake}))], capture_output=True, text=True,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == ExitCode.UNSAFE and r.stderr.count("\n") == 1, r.stderr
    assert "\x1b" not in r.stderr and "--max-num-seqs has a value an artifact may not carry" in r.stderr
    bake["plan"] = {"serve_args": ["not", "an", "object"]}
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "serve-args",
                        str(_manifest_file(tmp_path, {"bake": bake}))], capture_output=True, text=True,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == ExitCode.CORRUPT and "bake.plan.serve_args" in r.stderr


LOADERS = {"serve_env": ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PATH", "CC",
                         "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND", "TRITON_PTXAS_PATH",
                         "VLLM_PLUGINS", "HOME",
                         # found by an independent attack corpus (issue 20): a place, a service, a
                         # credential, a knob that swaps the baked kernels or opens the server
                         "TRITON_HOME", "TRITON_KERNEL_OVERRIDE", "TRITON_KERNEL_DUMP",
                         "TRITON_ALWAYS_COMPILE", "TRITON_INTERPRET", "TRITON_REDIS_HOST",
                         "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_SERVER_DEV_MODE", "VLLM_API_KEY",
                         "VLLM_HOST_IP", "HF_ENDPOINT", "HF_TOKEN", "HF_HOME"],
           "invalidating_env_vars": ["LLVM_PASS_PLUGIN_PATH", "TRITON_CACHE_MANAGER", "LD_PRELOAD",
                                     "MLIR_DUMP_PATH", "PYTHONPATH", "TRITON_HOME", "TRITON_KERNEL_OVERRIDE"]}


@pytest.mark.parametrize("key, where", [(k, w) for w, ks in LOADERS.items() for k in ks])
def test_a_variable_that_loads_code_is_never_handed_to_the_server(triton_cache, tmp_path, key, where):
    """A well-formed name an artifact must still not set in the server: a library to preload,
    a Python path, a class to import, a binary or compiler to run, a plugin: refused (exit 5)
    naming it, nothing printed for eval."""
    bake = _bake(**{where: {key: str(tmp_path / "evil.so")}})
    art = _artifact(triton_cache, tmp_path, bake)
    work = tmp_path / "work"
    work.mkdir()
    r, argv, changed = _eval(art, work)
    assert r.returncode == ExitCode.CORRUPT, r.stderr
    assert f"bake.{where}.{key}" in r.stderr and "may set in the server" in r.stderr
    assert argv == [] and changed == {}


def test_a_bake_root_with_a_line_break_is_refused(triton_cache, tmp_path):
    """Every role's variable is made of the recorded root: one with a control character is a
    malformed document (exit 5), as the user's own --root is for k8s."""
    bake = _bake(env={"root": "/r\ntouch /tmp/x", "roles": ["triton"]})
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "serve-args",
                        str(_manifest_file(tmp_path, {"bake": bake}))], capture_output=True, text=True,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == ExitCode.CORRUPT and "bake.env.root" in r.stderr and r.stdout == "", r.stderr


def test_a_model_path_with_a_line_break_is_refused(tmp_path):
    bake = _bake(model={"path": "/m; touch /tmp/x\n$(touch /tmp/x)"})
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "serve-args",
                        str(_manifest_file(tmp_path, {"bake": bake}))], capture_output=True, text=True,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == ExitCode.CORRUPT and "bake.model.path" in r.stderr and r.stdout == "", r.stderr


def test_the_variables_a_bake_runs_with_still_travel(triton_cache, tmp_path):
    """vLLM's switches and Triton's cache-invalidating variables pass, as the server needs them."""
    bake = _bake(serve_env={"TRITON_CACHE_AUTOTUNING": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"},
                 invalidating_env_vars={"TRITON_DEFAULT_FP_FUSION": "0", "DISABLE_PTXAS_OPT": "1"})
    art = _artifact(triton_cache, tmp_path, bake)
    work = tmp_path / "work"
    work.mkdir()
    r, argv, changed = _eval(art, work)
    assert r.returncode == 0, r.stderr
    assert changed["VLLM_USE_V2_MODEL_RUNNER"] == "1" and changed["TRITON_DEFAULT_FP_FUSION"] == "0"
    assert changed["DISABLE_PTXAS_OPT"] == "1"


@pytest.mark.parametrize("env_root, code", [("/etc", ExitCode.OK), ("/tmp/evil/root", ExitCode.OK),
                                            ("relative/root", ExitCode.CORRUPT),
                                            ("/var/cache/cachebake/../../../etc", ExitCode.CORRUPT)])
def test_without_root_the_bakes_own_env_root_never_chooses_where_the_roles_point(triton_cache, tmp_path,
                                                                                env_root, code):
    """serve-args without --root points the roles at the layer root (the default serving root
    here), never at the root the bake record names: a forged bake.env.root is ignored, or refused
    when it is no absolute path (exit 5)."""
    from cachebake.roles import DEFAULT_ROOT, serving_env

    art = _artifact(triton_cache, tmp_path, _bake(env={"root": env_root, "roles": ["triton"]}))
    work = tmp_path / "work"
    work.mkdir()
    r, argv, changed = _eval(art, work)
    assert r.returncode == code, r.stderr
    if code == ExitCode.OK:
        assert changed["TRITON_CACHE_DIR"] == serving_env(str(DEFAULT_ROOT), ["triton"])["TRITON_CACHE_DIR"]
        assert not any(env_root in v for v in changed.values())
    else:
        assert "bake.env.root" in r.stderr and changed == {} and argv == []


@pytest.mark.parametrize("layer_root", ["/etc", "/var/run/secrets/kubernetes.io/serviceaccount"])
def test_a_layer_root_other_than_the_default_serving_root_needs_root(triton_cache, tmp_path, layer_root):
    """An artifact packed for another root does not choose where the roles point: without
    --root, exit 3 asking for it (nothing printed to eval); with --root, the roles go there."""
    art = tmp_path / "art"
    pack_artifact([CacheRoot("triton", triton_cache)], art, target="sm_90",
                  bake=_bake(env={"root": layer_root}), layer_root=layer_root)
    work = tmp_path / "work"
    work.mkdir()
    r, argv, changed = _eval(art, work)
    assert r.returncode == ExitCode.BAD_INPUT and "give --root DIR" in r.stderr, r.stderr
    assert changed == {} and argv == []
    r, argv, changed = _eval(art, work, "--root", "/srv/cb")
    assert r.returncode == 0 and changed["TRITON_CACHE_DIR"] == "/srv/cb/triton", r.stderr


def test_a_manifest_document_without_a_layer_root_takes_only_the_default_root_from_its_bake():
    """A manifest JSON with no layer_root: its bake's env.root stands in only when it is the
    default serving root; any other is exit 3 asking for --root, none at all exports no role."""
    from cachebake.errors import BadInput
    from cachebake.roles import DEFAULT_ROOT
    from cachebake.serve.command import serve_command

    def doc(env):
        return {"bake": _bake(env=env)}
    assert serve_command(doc({"root": str(DEFAULT_ROOT)})).env["TRITON_CACHE_DIR"] == f"{DEFAULT_ROOT}/triton"
    with pytest.raises(BadInput, match="give --root DIR"):
        serve_command(doc({"root": "/etc"}))
    assert "TRITON_CACHE_DIR" not in serve_command(doc({})).env
    assert serve_command(doc({"root": "/etc"}), root="/srv").env["TRITON_CACHE_DIR"] == "/srv/triton"
