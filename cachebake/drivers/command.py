"""The command driver: any command line as a bake's warmup (``cachebake build -- CMD...``).

Each round runs ``CMD`` as a fresh process in the bake env; whatever Python processes it starts
are monitored through the env's PYTHONPATH (cachebake.capture.env).  What the command needs is
its own business: preflight only checks that it can be started by this uid.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from cachebake.errors import BadInput


@dataclass
class CommandDriver:
    argv: list[str]
    model: str | None = None  # recorded only: which model the command serves
    name: str = "command"
    runs_on_gpu: bool = False  # unknown: it may compile ahead of time for any --target

    def round_argv(self) -> list[str]:
        return list(self.argv)

    def label(self) -> str:
        return shlex.join(self.argv)

    def describe(self) -> dict:
        d = {"driver": "command", "command": list(self.argv), "command_line": shlex.join(self.argv)}
        if self.model:
            d["model"] = self.model
        return d

    def preflight(self) -> None:
        exe = self.argv[0]
        if shutil.which(exe) is not None:
            return
        if os.sep in exe:
            try:
                os.stat(exe)
                reachable = os.access(exe, os.X_OK)
            except FileNotFoundError:
                raise BadInput(f"cannot run {exe!r}: no such command") from None
            except OSError:  # EACCES on the way: a directory this uid cannot search
                reachable = False
            if not reachable:
                raise BadInput(f"cannot run {exe!r}: it is not executable by uid {os.geteuid()} "
                               "(the file, or a directory on its path such as a 0700 home, is "
                               "out of that user's reach)")
        raise BadInput(f"cannot run {exe!r}: no such command" + ("" if os.sep in exe else " on PATH"))

    def recorded(self, work_dir: Path) -> dict:
        return {}
