"""The round child: ``python -m cachebake.drivers.child MODULE:FUNCTION JSON_KWARGS``.

One warmup round of an in-process driver (cachebake.drivers.registry.InProcessDriver) runs
here, in a fresh process under the bake env: the monitor on (from the env), then the driver's
function.  ``main`` is the child's error boundary.
"""

from __future__ import annotations

import importlib
import json
import shlex
import sys

from cachebake.errors import CachebakeError, CommandFailed, Interrupted, Unsupported, print_error


def _run_function(target: str, kwargs: dict) -> None:
    module_name, _, func_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise Unsupported(f"driver module {module_name} is not available: {e}") from e
        raise
    getattr(module, func_name)(**kwargs)


def main(argv: list[str] | None = None) -> int:
    """Child side of an InProcessDriver round: monitor on (from the env), then the function.

    The child's boundary, like cachebake.cli's: a CachebakeError is one line and its code; an
    unexpected exception is one line naming a log file that holds the traceback (the round's
    output is shown to the user, and a traceback is not a message); Ctrl-C is 130."""
    import cachebake.capture.activate  # noqa: F401  (before any kernel module is imported)
    from cachebake.errors import ExitCode, write_crash_log

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m cachebake.drivers.child MODULE:FUNCTION JSON_KWARGS",
              file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        _run_function(args[0], json.loads(args[1]))
    except CachebakeError as e:
        print_error(e)
        return int(e.code)
    except KeyboardInterrupt:
        print_error(Interrupted())
        return int(ExitCode.INTERRUPTED)
    except Exception as e:  # noqa: BLE001 - the child's boundary: the driver's bug, in one line
        log = write_crash_log(e, f"python -m cachebake.drivers.child {shlex.join(args)}")
        print_error(CommandFailed(f"driver {args[0]} failed: {type(e).__name__}: "
                                  f"{' '.join(str(e).split())}" + (f" (traceback in {log})" if log else "")))
        return int(ExitCode.COMMAND_FAILED)
    return 0


if __name__ == "__main__":
    sys.exit(main())
