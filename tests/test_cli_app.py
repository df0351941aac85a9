"""The command line as docs/concepts.md summarizes it: its table of the commands at a glance
lists every command and every option of every click command, and nothing the CLI lacks (the
full reference, docs/commands.md, is generated from --help: tests/test_docs.py); `cachebake --help` shows each
command's summary whole (click cuts a first sentence that does not fit to "...")."""

import json
import re

import click
import pytest
from installkit import REPO

from cachebake.cli import main

README = (REPO / "docs" / "concepts.md").read_text()  # the commands at a glance
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _usages() -> list[str]:
    """The `cachebake ...` code spans of the first cells of README's Commands table."""
    section = README.split("\n## The commands at a glance\n", 1)[1].split("\n## ", 1)[0]
    spans = []
    for row in section.splitlines():
        if row.startswith("| `cachebake "):
            spans += [s for s in re.findall(r"`([^`]*)`", row.split(" | ", 1)[0])
                      if s.split()[:1] == ["cachebake"] and len(s.split()) > 1]
    return spans


def _readme_commands() -> dict[str, set[str]]:
    """command -> the options its rows of README's Commands table name (first cell only)."""
    found: dict[str, set[str]] = {}
    for span in _usages():
        found.setdefault(span.split()[1], set()).update(_OPTION.findall(span))
    return found


def _readme_values(name: str, option: str) -> set[str]:
    """The values README shows for ``option`` of ``name``: ``--driver vllm\\|kernels``."""
    values: set[str] = set()
    for span in _usages():
        if span.split()[1] == name:
            for m in re.finditer(rf"{re.escape(option)}[ =]([\w.\\|-]+)", span):
                values.update(v for v in re.split(r"\\?\|", m[1]) if v)
    return values


def _cli_options(command: click.Command) -> list[list[str]]:
    """Each option's long names (``--until-stable``, ``--no-until-stable``), --help aside."""
    return [[n for n in (*p.opts, *p.secondary_opts) if n.startswith("--")]
            for p in command.params if isinstance(p, click.Option) and "--help" not in p.opts]


def test_readme_lists_every_command_and_no_other():
    assert set(_readme_commands()) == set(main.commands)


@pytest.mark.parametrize("name", sorted(main.commands))
def test_readme_lists_every_option_of_each_command_and_no_other(name):
    documented = _readme_commands().get(name, set())
    options = _cli_options(main.commands[name])
    missing = [names[0] for names in options if not documented.intersection(names)]
    assert not missing, f"README's Commands table lacks `cachebake {name}` {', '.join(missing)}"
    for p in main.commands[name].params:
        if isinstance(p, click.Option) and isinstance(p.type, click.Choice):
            shown = _readme_values(name, p.opts[0])
            assert set(p.type.choices) <= shown, (
                f"README shows `cachebake {name} {p.opts[0]}` {sorted(shown)}, not {list(p.type.choices)}")
    unknown = documented - {n for names in options for n in names}
    assert not unknown, f"README lists `cachebake {name}` {', '.join(sorted(unknown))}, which it lacks"


def test_the_readme_parser_sees_the_table():
    """The check above is only as good as the parser: it must find the rows it checks."""
    rows = _readme_commands()
    assert {"--model", "--driver", "--out", "--keep-root"} <= rows["build"]
    assert "--pull-secret" in rows["k8s"]


def test_top_level_help_shows_each_summary_whole():
    from click.testing import CliRunner

    text = CliRunner().invoke(main, ["--help"], terminal_width=80).output
    lines = text.split("Commands:\n", 1)[1].splitlines()
    shown = {ln.split()[0]: ln for ln in lines if ln.strip()}
    assert set(shown) == set(main.commands)
    for name, line in shown.items():
        assert not line.rstrip().endswith("..."), f"`cachebake --help` cuts the summary of {name}: {line!r}"
        assert line.rstrip().endswith("."), line


def test_k8s_bake_job_is_the_bake_job_command():
    """`cachebake k8s --bake-job ...` (issue 32's spelling) runs bake-job with those options;
    after `--` the flag is a build argument, and k8s's own options do not apply."""
    from click.testing import CliRunner

    from cachebake.cli import main
    from cachebake.cli.app import bake_job_alias

    args = ["--gpu", "NVIDIA-H200=sm_90", "--model", "nemotron-h", "--builder-image", "reg.io/b:1",
            "--repository", "docker://reg.io/bakes", "--json"]
    alias = CliRunner().invoke(main, ["k8s", "--bake-job", *args])
    direct = CliRunner().invoke(main, ["bake-job", *args])
    assert alias.exit_code == direct.exit_code == 0, alias.output
    assert json.loads(alias.stdout) == json.loads(direct.stdout)
    assert json.loads(alias.stdout)["command"] == "bake-job"
    assert bake_job_alias(["k8s", "--artifact", "x", "--", "--bake-job"]) == \
        ["k8s", "--artifact", "x", "--", "--bake-job"]
    assert bake_job_alias(["bake-job", "--bake-job"]) == ["bake-job", "--bake-job"]
    bad = CliRunner().invoke(main, ["k8s", "--bake-job", "--serving-image", "x"])
    assert bad.exit_code == 2
