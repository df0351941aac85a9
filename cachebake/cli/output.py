"""One output object for every command: rich text for people, one JSON envelope for scripts.

The habit of huggingface_hub's ``cli/_output.py``: a command builds a report (a dataclass with
``to_dict()`` and, for people, ``render(console)``) and hands it to ``Output.emit``; nothing
else prints results.  Under ``--json`` every command prints exactly one JSON object on stdout,
success or failure, in the same envelope::

    {"cachebake": 1, "command": "install", "ok": true, ...the report's fields...}
    {"cachebake": 1, "command": "install", "ok": false,
     "error": {"code": 6, "kind": "unsafe-artifact", "message": "..."}}

Field names are shared across commands (``layer_digest``, ``manifest_digest``, ``target``).

The Output owns stderr as well: errors (``error``, through cachebake.errors.print_error),
warnings (``warn``), notes (``note``), progress lines (``progress``) and the live progress of
cachebake.cli.progress (``err_console``); no command writes cachebake's lines to stderr another
way.  None of it goes into the JSON on stdout.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Protocol

from cachebake.errors import print_error, printable
from cachebake.jsonio import dumps

ENVELOPE_VERSION = 1
ENVELOPE_KEYS = ("cachebake", "command", "ok")


class Report(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def envelope(command: str, ok: bool, body: dict[str, Any]) -> dict[str, Any]:
    clash = set(body) & set(ENVELOPE_KEYS)
    if clash:  # a report field would overwrite the envelope's: a bug in that report
        raise ValueError(f"report fields {sorted(clash)} collide with the JSON envelope")
    return {"cachebake": ENVELOPE_VERSION, "command": command, "ok": ok, **body}


class Output:
    """Where a command's result goes: ``emit`` once per command (or ``error``)."""

    def __init__(self, command: str, as_json: bool = False):
        self.command = command
        self.as_json = as_json
        self._stderr = None
        self._stdout = None
        self.emitted = False  # a report went out: a later error adds its line, not a 2nd JSON

    @property
    def console(self):
        """stdout console for text reports (rich; width follows the terminal)."""
        if self._stdout is None:
            from rich.console import Console

            self._stdout = Console(highlight=False, soft_wrap=True)
        return self._stdout

    @property
    def err_console(self):
        if self._stderr is None:
            from rich.console import Console

            self._stderr = Console(stderr=True, highlight=False, soft_wrap=True)
        return self._stderr

    def emit(self, report: Report, ok: bool | None = None,
             render: Callable[[Any, Any], None] | None = None) -> None:
        """Print ``report``: its JSON envelope under ``--json``; else ``render(report,
        console)`` when given (text views live in cachebake.cli.render, so report dataclasses
        from lower modules need not know about rich), else ``report.render(console)``."""
        if ok is None:
            ok = bool(getattr(report, "ok", True))
        if self.as_json:
            doc = envelope(self.command, ok, report.to_dict())
            self.emitted = True
            self.print_json(doc)
            return
        self.emitted = True
        if render is not None:
            render(report, self.console)
        elif getattr(report, "render", None) is not None:
            report.render(self.console)
        else:  # a report without a text form: its dict, readably
            self.print_json(report.to_dict())

    def warn(self, text: str) -> None:
        """A warning line on stderr (never on stdout, which may be JSON)."""
        # preflight's differences quote the artifact's values (its vLLM version, GPU name): a
        # C0/C1 control there must not reach the terminal
        self.err_console.print(f"cachebake: warning: {printable(text)}", markup=False, highlight=False)

    def note(self, text: str) -> None:
        """Something the user should know that is not a problem (k8s: an assumption made)."""
        self.err_console.print(f"cachebake: note: {printable(text)}", markup=False, highlight=False)

    def progress(self, line: str) -> None:
        """One line of a long command's progress (replay's compiles), as it happens."""
        self.err_console.print(printable(line), markup=False, highlight=False)

    def error(self, err) -> None:
        """A ``CachebakeError`` as one line on stderr, and under ``--json`` as the envelope on
        stdout too (scripts read stdout; people read stderr)."""
        print_error(err, sys.stderr)
        if self.as_json and not self.emitted:
            self.print_json(envelope(self.command, False, {"error": err.to_dict()}))

    @staticmethod
    def print_json(obj: dict[str, Any]) -> None:
        sys.stdout.write(dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()
