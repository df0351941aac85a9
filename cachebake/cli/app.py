"""The ``cachebake`` command line: parse, call one function, emit its report.  No logic here.

Every command builds a report (a dataclass with ``to_dict()``) and hands it to
``output(as_json).emit(report, render=...)``: rich text for people, one JSON envelope for
scripts (cachebake.cli.output).  Option values are checked by click parameter types while parsing
(cachebake.cli.params).  Every refusal is a CachebakeError: one line on stderr, the exit code README
documents (``CachebakeGroup.main`` is the one handler; see cachebake.errors for the rules).

Light commands stay light: ``pack``, ``inspect``, ``install``, ``fingerprint``, ``recipes``
and ``serve-args`` import neither torch nor vllm (tests/test_cli_imports.py holds them to it).
"""

from __future__ import annotations

import sys

import click

from cachebake.cli.output import Output
from cachebake.errors import (CachebakeError, ExitCode, Interrupted, UsageError, from_os_error,
                              missing_dependency, stop_on_sigterm, write_crash_log)

# click >= 8.2 raises this for a command given no arguments at all (it shows the help)
_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())


class CachebakeGroup(click.Group):
    """The one error boundary (cachebake.errors): every exception becomes one line on stderr
    and a documented exit code; under ``--json`` the error is also the JSON envelope on
    stdout.  Never a traceback: an unexpected exception's traceback goes to a log file whose
    path the one line names."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = bake_job_alias(list(sys.argv[1:] if args is None else args))
        options = args[:args.index("--")] if "--" in args else args
        command = next((a for a in options if not a.startswith("-")), "")
        out = Output(command, as_json="--json" in options)
        stop_on_sigterm()  # SIGTERM takes the Ctrl-C path: what was made is removed, and said
        try:
            code = super().main(args=args, prog_name=prog_name or "cachebake",
                                complete_var=complete_var, standalone_mode=False, obj=out, **extra)
        except click.exceptions.Exit as e:  # --help, --version
            code = e.exit_code
        except _NoArgsIsHelp as e:  # bare `cachebake` or `cachebake pack`: the help, as click
            e.show()
            code = e.exit_code
        except click.ClickException as e:  # bad options: click's message, one line, exit 2
            hint = f"see `cachebake {command} --help`" if command in self.commands else \
                "see `cachebake --help`"
            message = " ".join(e.format_message().split()).rstrip(".")
            out.error(UsageError(message, ExitCode(e.exit_code), hint=hint))
            code = e.exit_code
        except (click.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            out.error(Interrupted())
            code = int(ExitCode.INTERRUPTED)
        except CachebakeError as e:
            out.error(e)
            code = int(e.code)
        except OSError as e:
            # An OS refusal we did not foresee (disk full, permissions on a path we did not
            # check): still one line naming the path, never a traceback.
            out.error(from_os_error(e, what="", error_class=CachebakeError))
            code = int(ExitCode.FAILURE)
        except Exception as e:  # noqa: BLE001 - the boundary: a bug, reported in one line
            error = missing_dependency(e) if isinstance(e, ModuleNotFoundError) else None
            if error is None:
                log = write_crash_log(e)
                error = CachebakeError(f"internal error: {type(e).__name__}: {e}"
                                       + (f" (traceback in {log})" if log else ""))
            out.error(error)
            code = int(error.code)
        code = code if isinstance(code, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


BAKE_JOB_FLAG = "--bake-job"


def bake_job_alias(args: list[str]) -> list[str]:
    """``cachebake k8s --bake-job OPTIONS...`` is ``cachebake bake-job OPTIONS...`` (the spelling
    of issue 32): the flag, before any ``--``, turns the k8s command into the bake-job command,
    whose options then apply (k8s's own are for a server's manifests and do not mix with them)."""
    if not args or args[0] != "k8s":
        return args
    options = args[:args.index("--")] if "--" in args else args
    if BAKE_JOB_FLAG not in options:
        return args
    i = options.index(BAKE_JOB_FLAG)
    return ["bake-job", *args[1:i], *args[i + 1:]]


@click.group(cls=CachebakeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cachebake")
def main():
    """Bake Triton kernels and autotune results for a vLLM deployment at image-build time."""


def output(as_json: bool = False) -> Output:
    """The boundary's Output for this invocation (one per command run, so an error after a
    report was emitted does not print a second JSON document)."""
    ctx = click.get_current_context(silent=True)
    out = ctx.find_object(Output) if ctx is not None else None
    if out is None:
        out = Output(ctx.info_name if ctx is not None else "", as_json)
    out.as_json = out.as_json or as_json
    return out


JSON_OPTION = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON object (the cachebake envelope) on stdout.")

