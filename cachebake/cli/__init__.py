"""The ``cachebake`` command line: one module per command family, thin on top of the rooms.

``app`` holds the click group and the one error boundary; each family module registers its
commands on it when imported (below).  Every command builds a report and hands it to
``output(as_json).emit(report, render=...)``: rich text for people (``render``), one JSON
envelope for scripts (``output``); option values are converted and refused at parse time
(``params``); progress goes to stderr (``progress``).
"""

try:
    from cachebake.cli import (artifact, bake, distribute, fleet, install, recipes,  # noqa: F401,E402
                               replay, serve, sign)
    from cachebake.cli.app import main
except KeyboardInterrupt:  # Ctrl-C while the command line is still being imported: one line
    from cachebake.errors import ExitCode, Interrupted, print_error

    print_error(Interrupted("stopped while starting; nothing was done"))
    raise SystemExit(int(ExitCode.INTERRUPTED)) from None

__all__ = ["main"]
