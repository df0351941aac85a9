"""docs/commands.md, generated from the click commands themselves: every command's ``--help``
exactly as ``COLUMNS=80 cachebake COMMAND --help`` prints it, so the reference cannot drift
from the CLI (tests/test_docs.py holds the file equal to this module's output, and each block
equal to a real ``--help``).

    python3 -m cachebake.cli.reference docs/commands.md
"""

from __future__ import annotations

import click

from cachebake.cli import main

# click's width for a pipe or an 80-column terminal: min(columns, max_content_width 80) - 2
WIDTH = 78

HEADER = """\
[cachebake](../README.md) / [docs](README.md) / commands

# Command reference

Generated from the command line itself (`python3 -m cachebake.cli.reference docs/commands.md`;
tests/test_docs.py keeps this file equal to every command's `--help`). A summary of all commands
in one table: [concepts](concepts.md#the-commands-at-a-glance); exit codes:
[exit codes](exit-codes.md).

With `--json`, every command prints exactly one JSON object on stdout, success or failure:
`{"cachebake": 1, "command": "pack", "ok": true, ...}`, or `"ok": false` with
`"error": {"code": 3, "kind": "bad-input", "message": "..."}`. The same things have the same
names in every command: `target` (`cuda:90`), `layer_digest`, `manifest_digest` (the OCI image
manifest). Warnings and progress go to stderr; progress bars only on a terminal. `pack`,
`inspect`, `install`, `fingerprint`, `recipes` and `serve-args` never import torch or vLLM.
"""


def command_help(name: str | None) -> str:
    """``cachebake [NAME] --help`` as click prints it at WIDTH columns."""
    # each context with its command's context_settings, as click's own make_context gives it
    root = click.Context(main, info_name="cachebake", terminal_width=WIDTH, **main.context_settings)
    if name is None:
        return main.get_help(root)
    command = main.get_command(root, name)
    return command.get_help(click.Context(command, info_name=name, parent=root, terminal_width=WIDTH,
                                          **command.context_settings))


def commands() -> list[str]:
    return main.list_commands(click.Context(main, info_name="cachebake"))


def reference() -> str:
    parts = [HEADER]
    names = commands()
    parts.append("Commands: " + ", ".join(f"[`{n}`](#cachebake-{n})" for n in names) + ".\n")
    for name in [None, *names]:
        title = f"cachebake {name}" if name else "cachebake"
        parts.append(f"## {title}\n\n```text\n{command_help(name).rstrip()}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if len(sys.argv) != 2:
        raise SystemExit("usage: python3 -m cachebake.cli.reference docs/commands.md")
    Path(sys.argv[1]).write_text(reference())
