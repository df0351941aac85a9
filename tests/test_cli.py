"""The CLI's one error boundary, walked: every command with bad input gives one line, a
documented exit code, no traceback, and under --json the envelope on stdout; Ctrl-C (a real
SIGINT) is 130 and leaves nothing behind; tables fit the terminal."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebake.artifact.pack import pack_artifact, parse_root
from cachebake.cli import main
from cachebake.errors import ExitCode
from conftest import NOBODY, as_nobody

REPO = Path(__file__).resolve().parent.parent
DOCUMENTED = {int(c) for c in ExitCode}


def _readme_codes() -> set[int]:
    text = (REPO / "docs" / "exit-codes.md").read_text().split("# Exit codes", 1)[1]
    return {int(line.split("|")[1]) for line in text.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()}


def test_every_exit_code_is_in_the_readme():
    assert _readme_codes() == DOCUMENTED


@pytest.fixture
def world(triton_cache, tmp_path, monkeypatch):
    """An artifact, a file, a dir in the way, no visible GPU, and a private temp dir."""
    art = tmp_path / "art"
    pack_artifact([parse_root(f"triton={triton_cache}")], art, target="sm_90")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep").write_text("x")
    monkeypatch.setenv("PATH", f"{tmp_path / 'nobin'}{os.pathsep}/usr/bin:/bin")
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    return {"cache": triton_cache, "art": art, "tmp": tmp_path, "systmp": systmp}


U, B, C, S = ExitCode.USAGE, ExitCode.BAD_INPUT, ExitCode.CORRUPT, ExitCode.UNSUPPORTED
# (args with {placeholders}, the exit code): every command, bad input of every kind
CASES = [
    (["nope"], U),
    (["pack", "{tmp}/missing", "--out", "{tmp}/o"], B),
    (["pack", "{tmp}/afile", "--out", "{tmp}/o"], B),
    (["pack", "/proc/self", "--out", "{tmp}/o"], B),
    (["pack", "cuda={cache}", "--out", "{tmp}/o"], U),
    (["pack", "{cache}", "--out", "/proc/cachebake-out"], B),
    (["pack", "{cache}", "--out", "{tmp}/afile"], B),
    (["pack", "{cache}", "--out", "{tmp}/busy"], B),
    (["pack", "{cache}", "--out", "{tmp}/afile/below"], B),
    (["pack", "{cache}", "--out", "{tmp}/o", "--target", "sm_999"], U),
    (["pack", "{cache}", "--out", "{tmp}/o", "--target", "gfx942"], B),
    (["pack", "{cache}", "--out", "{tmp}/o", "--layer-root", "rel/path"], U),
    (["pack", "--out", "{tmp}/o"], U),
    (["inspect", "{tmp}/missing"], B),
    (["inspect", "{tmp}/afile"], B),
    (["inspect", "/proc"], B),
    (["inspect", "{art}", "--target", "sm_999"], U),
    (["inspect", "{art}", "--target", "sm_120"], S),
    (["build", "--out", "{tmp}/o", "--target", "sm_90", "--root", "{tmp}/r"], U),  # no model, no command
    (["build"], U),
    (["build", "--driver", "command", "--out", "{tmp}/o"], U),  # and no -- CMD
    (["build", "--driver", "kernels", "--out", "{tmp}/o", "--", "true"], U),  # both
    (["verify", "--cache", "{tmp}"], U),  # no model, no command
    (["build", "--model", "nemotron-hh", "--out", "{tmp}/o", "--root", "{tmp}/r"], B),
    (["build", "--model", "nemotron-h", "--out", "{tmp}/o", "--root", "{tmp}/r"], S),
    (["build", "--model", "nemotron-h", "--driver", "kernels", "--out", "{tmp}/o"], S),
    (["build", "--out", "{tmp}/busy", "--target", "sm_90", "--root", "{tmp}/r", "--", "true"], B),
    (["build", "--out", "/proc/x", "--target", "sm_90", "--root", "{tmp}/r", "--", "true"], B),
    (["build", "--out", "{tmp}/o", "--target", "sm_90", "--root", "/proc/r", "--", "true"], B),
    (["build", "--out", "{tmp}/o", "--root", "{tmp}/r", "--", "true"], B),  # no GPU, no --target
    (["build", "--out", "{tmp}/o", "--target", "sm_90", "--root", "{tmp}/r", "--", "{tmp}/nope"], B),
    (["build", "--max-rounds", "0", "--", "true"], U),
    (["build", "--max-rounds", "-3", "--", "true"], U),
    (["build", "--quiet-rounds", "two", "--", "true"], U),
    (["build", "--tp", "0", "--model", "nemotron-h"], U),
    (["build", "--serve-args", '{"enforce_eager": true}', "--model", "nemotron-h"], U),
    (["build", "--serve-args", "{broken", "--model", "nemotron-h"], U),
    (["build", "--serve-args", "--dtype 'bfloat16", "--model", "nemotron-h"], U),  # no closing quote
    (["build", "--serve-args", "--dtype bf16 \\", "--model", "nemotron-h"], U),  # trailing backslash
    (["build", "--driver", "magic", "--model", "nemotron-h"], U),
    (["build", "--layer-root", "here", "--", "true"], U),
    (["build", "--image", "img", "--keep-root", "--", "true"], U),
    (["verify", "--cache", "{tmp}/missing", "--", "true"], B),
    (["verify", "--cache", "/proc", "--", "true"], B),
    (["verify", "--cache", "{tmp}/busy", "--", "true"], B),
    (["verify", "--", "true"], U),
    (["verify", "--cache", "{tmp}", "--tp", "-1", "--model", "nemotron-h"], U),
    (["install", "{tmp}/missing", "--to", "{tmp}/c"], B),
    (["install", "{tmp}/afile", "--to", "{tmp}/c"], B),
    (["install", "{art}", "--to", "{tmp}/c", "--serve-at", "relative/path", "--target", "sm_90"], U),
    (["install", "{art}", "--to", "{tmp}/c", "--lock-timeout", "-5", "--target", "sm_90"], U),
    (["install", "{art}", "--to", "{tmp}/c", "--target", "sm_999"], U),
    (["install", "{art}", "--to", "{tmp}/c", "--fingerprint", "{tmp}/missing.json"], B),
    (["install", "registry.example.com/cache:sm_90", "--to", "{tmp}/c"], B),  # no docker://: a path that is not there
    (["install", "{art}", "--to", "{tmp}/c"], B),  # no GPU, no --target
    (["recipes", "--bogus"], U),
    (["serve-args", "{tmp}/missing"], B),
    (["serve-args", "{art}"], B),  # not a vllm bake
    (["serve-args", "{art}", "--root", "rel"], U),
    (["fingerprint", "--target", "sm_999"], U),
    (["fingerprint"], B),  # no GPU, no --target
    (["fingerprint", "--target", "sm_90", "--out", "/proc/fp.json"], B),
    (["fingerprint", "--target", "sm_90", "--out", "{tmp}/busy"], U),
    # options that do not mix, and a missing argument, are usage errors in every command
    (["build", "--image", "img", "--seed", "{art}", "--", "true"], U),
    (["build", "--image", "img", "--work-dir", "{tmp}/w", "--", "true"], U),
    (["build", "--driver", "kernels", "--out", "{tmp}/o", "--", "true"], U),
    (["build", "--driver", "command", "--out", "{tmp}/o"], U),
    (["build", "--model", "nemotron-h", "--driver", "kernels", "--model-dir", "/m", "--out", "{tmp}/o"], U),
    (["build", "--model", "nemotron-h", "--driver", "vllm", "--plan", "{tmp}/afile", "--out", "{tmp}/o"], U),
    (["build", "--max-rounds", "1", "--quiet-rounds", "2", "--out", "{tmp}/o", "--target", "sm_90",
      "--root", "{tmp}/r", "--", "true"], U),
    (["replay", "{art}", "--base", "{art}", "--misses", "{tmp}", "--out", "{tmp}/o"], U),
    (["replay", "--base", "{art}", "--out", "{tmp}/o"], U),
]


def _fill(args, world):
    out = []
    for a in args:
        for k, v in world.items():
            a = a.replace("{" + k + "}", str(v))
        out.append(a)
    return out


@pytest.mark.parametrize("args,code", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_and_a_documented_code(world, args, code):
    argv = _fill(args, world)
    before = sorted(os.listdir(world["tmp"]))
    runner = CliRunner()
    r = runner.invoke(main, argv)
    assert r.exit_code == code, (argv, r.output)
    assert isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stdout == ""
    first, *rest = r.stderr.splitlines()
    assert first.startswith("cachebake: error: ") and all(x.startswith("  ") for x in rest), r.stderr
    if code != ExitCode.USAGE or args[0] != "nope":
        assert sorted(os.listdir(world["tmp"])) == before  # nothing written next to the inputs
    assert os.listdir(world["systmp"]) == []  # no temp dir left behind

    # the same under --json: one envelope on stdout, the same line on stderr
    split = argv.index("--") if "--" in argv else len(argv)
    j = runner.invoke(main, argv[:split] + ["--json"] + argv[split:])
    assert j.exit_code == code
    doc = json.loads(j.stdout)
    assert (doc["cachebake"], doc["ok"]) == (1, False)
    assert doc["command"] == argv[0] and doc["error"]["code"] == code
    assert doc["error"]["message"] in j.stderr


def test_only_the_output_object_writes_to_stderr():
    """The Output owns stderr (errors, warnings, notes, progress): no other CLI module writes
    cachebake's lines there itself, so every such line has one form and --json's stdout stays
    one document."""
    offenders = []
    for path in sorted((REPO / "cachebake" / "cli").glob("*.py")):
        if path.name == "output.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"sys\.stderr|\berr=True|\bstderr=True|(?<![\w.])(?<!def )print\(|click\.echo|click\.secho", line):
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []


def test_success_is_the_same_envelope_everywhere(world):
    runner = CliRunner()
    docs = {}
    for args in (["pack", "{cache}", "--out", "{tmp}/o2"], ["inspect", "{art}"],
                 ["install", "{art}", "--to", "{tmp}/c", "--target", "sm_90"],
                 ["fingerprint", "--target", "sm_90"], ["recipes"]):
        argv = _fill(args, world) + ["--json"]
        r = runner.invoke(main, argv)
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert (doc["cachebake"], doc["command"], doc["ok"]) == (1, argv[0], True)
        docs[argv[0]] = doc
    # shared names for the same things
    layer = docs["pack"]["layer_digest"]
    assert docs["inspect"]["bakes"][0]["layer_digest"] == layer == docs["install"]["layer_digest"]
    assert docs["inspect"]["bakes"][0]["manifest_digest"] == docs["pack"]["manifest_digest"]
    assert {docs[c]["target"] for c in ("pack", "install", "fingerprint")} == {"cuda:90"}
    assert isinstance(docs["recipes"]["recipes"], list)


def test_fingerprint_out_creates_its_directory_and_install_reads_it(world):
    fp = world["tmp"] / "new" / "dir" / "fp.json"
    r = CliRunner().invoke(main, ["fingerprint", "--target", "sm_90", "--out", str(fp)])
    assert r.exit_code == 0 and r.stdout.startswith(f"wrote {fp}")
    assert json.loads(fp.read_text())["target"] == "cuda:90"  # the fingerprint itself
    r = CliRunner().invoke(main, ["install", str(world["art"]), "--to", str(world["tmp"] / "c"),
                                  "--fingerprint", str(fp)])
    assert r.exit_code == 0, r.output


def test_an_unwritable_out_and_an_unreadable_cache_for_a_non_root_user(triton_cache, public_tmp):
    cache = public_tmp / "cache"
    shutil.copytree(triton_cache, cache)
    os.chmod(cache, 0o755)
    locked = public_tmp / "locked"
    locked.mkdir(mode=0o700)

    def pack(*args):
        return as_nobody([sys.executable, "-m", "cachebake.cli", "pack", *map(str, args),
                          "--target", "sm_90"], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")

    r = pack(cache, "--out", public_tmp / "art")  # public_tmp is root's, 0755
    assert r.returncode == ExitCode.BAD_INPUT, r.stderr
    assert r.stderr == (f"cachebake: error: --out {public_tmp / 'art'}: cannot write in "
                        f"{public_tmp}: Permission denied\n")
    r = pack(locked / "triton", "--out", "/tmp/never")
    assert r.returncode == ExitCode.BAD_INPUT
    assert r.stderr == f"cachebake: error: {locked / 'triton'}: Permission denied\n"


def test_recipes_piped_prints_each_recipes_serve_args_whole():
    """A program (or a person copying from a pager) gets each recipe's flags on one line, at
    any COLUMNS: rich used to fold them at 80, mid-flag."""
    from cachebake.recipes import list_recipes
    from cachebake.vllm.serveargs import serve_args_to_flags

    for columns in (60, 80, 200):
        r = subprocess.run([sys.executable, "-m", "cachebake.cli", "recipes"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(REPO),
                                           "COLUMNS": str(columns)})
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        for recipe in list_recipes():
            assert f"  serve args: {' '.join(serve_args_to_flags(recipe.serve_args))}" in lines


@pytest.mark.parametrize("columns", [60, 80, 120, 200])
def test_recipes_on_a_terminal_break_serve_args_only_between_flags(columns, monkeypatch):
    import io

    # rich takes TERM=dumb (a CI runner's, an Emacs shell's) as 80 columns whatever width= says
    monkeypatch.setenv("TERM", "xterm-256color")

    from rich.console import Console

    from cachebake.cli.render import WIDE, render_recipes
    from cachebake.cli.reports import RecipesReport
    from cachebake.recipes import list_recipes
    from cachebake.vllm.serveargs import serve_args_to_flags

    buf = io.StringIO()
    recipes = list_recipes()
    render_recipes(RecipesReport(recipes), Console(file=buf, force_terminal=True, width=columns,
                                                   color_system=None))
    text = buf.getvalue()
    assert "nemotron-h:8b" in text
    for recipe in recipes:  # every flag and its value stay on one line
        flags = serve_args_to_flags(recipe.serve_args)
        pairs = [f"{f} {v}" for f, v in zip(flags, flags[1:]) if f.startswith("--") and not v.startswith("--")]
        assert all(p in text for p in pairs), recipe.ref
    if columns < WIDE:  # blocks; on a wide terminal a table, one flag per line of its cell
        serve_lines = [ln for ln in text.splitlines() if ln.startswith("    --")]
        assert serve_lines and all(len(ln) <= columns for ln in serve_lines)
    else:
        assert "default serve args" in text and max(map(len, text.splitlines())) <= columns


def _sigint_when(proc, ready: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)


@pytest.mark.parametrize("command", ["build", "verify"])
def test_ctrl_c_is_130_stops_the_round_and_leaves_nothing(tmp_path, command):
    """A real SIGINT to cachebake while a round runs: exit 130, one line saying what state it
    left, the round's processes stopped, no temp dir, no artifact."""
    ready, pid_file = tmp_path / "ready", tmp_path / "child.pid"
    warmup = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              f"open({str(ready)!r}, 'w').close(); time.sleep(120)")
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    (tmp_path / "cache" / "triton").mkdir(parents=True)
    args = (["build", "--out", str(tmp_path / "art"), "--root", str(tmp_path / "root"),
             "--target", "sm_90"] if command == "build" else ["verify", "--cache", str(tmp_path / "cache")])
    proc = subprocess.Popen([sys.executable, "-m", "cachebake.cli", *args, "--json", "--",
                             sys.executable, "-c", warmup], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(systmp)})
    _sigint_when(proc, ready)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED == 130, err
    assert "Traceback" not in out + err
    (line,) = err.splitlines()
    assert line.startswith("cachebake: error: interrupted: ")
    doc = json.loads(out)
    assert doc["ok"] is False and doc["error"]["kind"] == "interrupted"
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    assert os.listdir(systmp) == [] and not (tmp_path / "art").exists()


def test_ctrl_c_in_a_light_command_is_130(tmp_path):
    """Ctrl-C anywhere else (here: while `install` waits for a lock) is 130 and one line."""
    import fcntl

    art = tmp_path / "art"
    cache = tmp_path / "cache" / "triton"
    import aot

    aot.compile_in_subprocess(cache, specs=aot.SPECS[:1])
    pack_artifact([parse_root(f"triton={cache}")], art, target="sm_90")
    to = tmp_path / "to"
    (to / ".cachebake").mkdir(parents=True)
    with open(to / ".cachebake" / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, "-m", "cachebake.cli", "install", str(art), "--to",
                                 str(to), "--target", "sm_90"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        time.sleep(3)  # imports, preflight, layer checks: then it waits on the lock
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("cachebake: error: interrupted")
    shutil.rmtree(to)


@pytest.mark.parametrize("module", ["click", "cachebake.cli.app", "cachebake.cli.params"])
def test_ctrl_c_while_the_command_line_is_still_importing_is_one_line(module):
    """A real SIGINT, sent the moment MODULE is imported on the way to the CLI (the window a
    Ctrl-C right after Enter lands in): exit 130 and one line, never a KeyboardInterrupt
    traceback from an import."""
    prog = ("import builtins, os, signal, sys\n"
            "real = builtins.__import__\n"
            "def importing(name, *a, **kw):\n"
            "    if name == sys.argv[1]:\n"
            "        builtins.__import__ = real\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "    return real(name, *a, **kw)\n"
            "builtins.__import__ = importing\n"
            "from cachebake.cli import main\n"
            "sys.exit(main(['recipes']))\n")
    r = subprocess.run([sys.executable, "-c", prog, module], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert r.returncode == 130 and r.stdout == "", r.stderr
    assert r.stderr == "cachebake: error: interrupted: stopped while starting; nothing was done\n"


@pytest.mark.parametrize("blocked,code,says", [
    ("zstandard", ExitCode.UNSUPPORTED, "the Python package 'zstandard' is missing from"),
    ("cachebake_no_such_module", ExitCode.FAILURE, "internal error: ModuleNotFoundError"),
])
def test_a_missing_dependency_is_one_line_not_a_bug(world, blocked, code, says):
    """A required package the interpreter lacks (an init image built without it) is UNSUPPORTED
    and named; a module that is not a dependency is still reported as a bug, with its log."""
    shadow = world["tmp"] / "shadow"
    (shadow / "zstandard").mkdir(parents=True)
    # a package that fails to import as a missing one does (the real one stays installed)
    (shadow / "zstandard" / "__init__.py").write_text(
        f"raise ModuleNotFoundError({f'No module named {blocked!r}'!r}, name={blocked!r})\n")
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "install", str(world["art"]), "--to",
                        str(world["tmp"] / "to"), "--target", "sm_90"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{REPO}",
                            "TMPDIR": str(world["systmp"])})
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (world["tmp"] / "to").exists()
