"""Exit codes and the errors that carry them: cachebake's one error boundary.

Every refusal cachebake makes is a ``CachebakeError`` with a one-line message and an exit
code from ``ExitCode`` (the habit of click's ``exceptions.py``: the exception knows its exit
code; one handler, ``cachebake.cli.main``, prints it).  Scripts and init containers branch on
these numbers, so they never change meaning (README lists them).

Rules every module follows:

* raise a ``CachebakeError`` subclass for anything the user can fix or should know; never
  let an ``OSError`` about a user's path escape unnamed: ``from_os_error`` names the path the
  user gave, not an internal temp file;
* refusals of an artifact's *content* are one class per kind of refusal, carrying the
  offending item, as CPython's tarfile filters do (``MemberRefused.member``,
  ``InvalidDocument.document``/``.field``), so tests and callers can tell them apart without
  parsing messages;
* anything else is a bug: the CLI prints one line, writes the traceback to a log file and
  exits 1 (``ExitCode.FAILURE``); Ctrl-C exits 130 (``ExitCode.INTERRUPTED``), saying what
  state it left.

``print_error`` is the one printer of a refusal: the CLI's boundary, the round child's and
every other entry point (a driver's own ``main``) print through it, so a user and a script
parsing stderr see one form wherever it came from.
"""

from __future__ import annotations

import enum
import os
import signal
import sys
import threading
from typing import TextIO


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1  # an unexpected error: a bug, or an OS error we did not anticipate
    USAGE = 2  # click's own code for bad options
    BAD_INPUT = 3  # missing path, empty dir, not a cache, unreadable file, --out in the way
    PREFLIGHT = 4  # the artifact was baked for another environment: it would not hit
    CORRUPT = 5  # a digest, size, stream or document does not match what the artifact declares
    UNSAFE = 6  # the layer tries to escape DIR, holds links/devices/setuid, or is a bomb
    UNSUPPORTED = 7  # unknown format version, no bake for this GPU target, missing dependency
    COMPILES_SEEN = 8  # verify: the sweep compiled or autotuned something
    COMMAND_FAILED = 9  # build: the warmup command or driver failed
    NOT_STABLE = 10  # build: still compiling after --max-rounds
    LOCKED = 11  # install: could not take the install lock in time
    STALLED = 12  # install docker://...: the registry stopped sending (--stall-timeout)
    SIGNATURE = 13  # install --verify-key: no signature by a trusted key over the image's digest
    DIFFERENT = 14  # diff: the two bakes differ (not a failure: the report says how)
    NOT_COMPARABLE = 15  # diff: no pair of bakes to compare (no common target, several each)
    INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + 2, as shells report it


# The import names of what pyproject.toml's `dependencies` list, beyond click (without which no
# command starts), -> the distribution to install.  Optional ones are refused where they are
# imported, naming their extra.
REQUIRED_MODULES = {"zstandard": "zstandard", "rich": "rich"}


class CachebakeError(Exception):
    """A refusal with a clear one-line message and a distinct exit code.

    ``hint``: an optional second sentence telling the user what to do; rendered after the
    message on the same line (text) or as its own field (JSON)."""

    code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, code: ExitCode | None = None, *, hint: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.hint = hint

    @property
    def kind(self) -> str:
        """A stable name for JSON output: the class name in kebab case."""
        name = type(self).__name__
        return "".join("-" + c.lower() if c.isupper() and i else c.lower()
                       for i, c in enumerate(name))

    def line(self) -> str:
        """The one line the CLI prints (without the ``cachebake: error:`` prefix)."""
        msg = " ".join(str(self).split("\n")[0].split())
        return f"{msg}; {self.hint}" if self.hint else msg

    def details(self) -> list[str]:
        """Extra lines a few errors carry (preflight lists each difference); never a traceback."""
        return [ln.strip() for ln in str(self).split("\n")[1:] if ln.strip()]

    def to_dict(self) -> dict:
        d = {"code": int(self.code), "kind": self.kind, "message": self.line()}
        extra = self.details()
        if extra:
            d["details"] = extra
        return d


class UsageError(CachebakeError):
    """A malformed command line (click's own refusals are turned into this at the boundary)."""

    code = ExitCode.USAGE


class BadInput(CachebakeError):
    code = ExitCode.BAD_INPUT


class PreflightMismatch(CachebakeError):
    code = ExitCode.PREFLIGHT


class CorruptArtifact(CachebakeError):
    code = ExitCode.CORRUPT


class InvalidDocument(CorruptArtifact):
    """A JSON document of the artifact (index, image manifest, config, label, cachebake.json,
    a group file) has the wrong shape: ``document`` names it, ``field`` the JSON path."""

    def __init__(self, document: str, field: str, reason: str):
        super().__init__(f"{document}: {field or '(top level)'}: {reason}")
        self.document, self.field, self.reason = document, field, reason


class UnsafeArtifact(CachebakeError):
    code = ExitCode.UNSAFE


class MemberRefused(UnsafeArtifact):
    """One layer entry refused; subclasses say why (one class per refusal, as tarfile's
    ``FilterError`` family does).  ``member`` is the entry's name as the tar gives it."""

    reason = "is refused"

    def __init__(self, member: str, detail: str | None = None):
        super().__init__(f"layer entry {member!r} {detail or self.reason}")
        self.member = member


class Unsupported(CachebakeError):
    code = ExitCode.UNSUPPORTED


class CompilesSeen(CachebakeError):
    code = ExitCode.COMPILES_SEEN


class CommandFailed(CachebakeError):
    code = ExitCode.COMMAND_FAILED


class NotStable(CachebakeError):
    code = ExitCode.NOT_STABLE


class Locked(CachebakeError):
    code = ExitCode.LOCKED


class Stalled(CachebakeError):
    """A registry that stopped sending: less than a minimum of bytes within the stall timeout
    (a slow-loris registry, a dead connection that never closes).  Its own code, apart from
    bad input, because a retry later may well succeed."""

    code = ExitCode.STALLED


class SignatureRefused(CachebakeError):
    """``install --verify-key``: the image is unsigned, or no signature verifies with a trusted key."""

    code = ExitCode.SIGNATURE


class Different(CachebakeError):
    """``diff``: the two bakes differ; the report (printed before) says how and why."""

    code = ExitCode.DIFFERENT


class NotComparable(CachebakeError):
    """``diff``: the two artifacts hold no pair of bakes to compare (each has several bakes
    and they share no GPU target)."""

    code = ExitCode.NOT_COMPARABLE


class Interrupted(CachebakeError):
    """Ctrl-C.  ``state`` says what the interrupted command left (e.g. whether an install's
    switch happened), so the operator knows whether to re-run."""

    code = ExitCode.INTERRUPTED

    def __init__(self, state: str = ""):
        super().__init__("interrupted" + (f": {state}" if state else ""))
        self.state = state


def _sigterm_as_interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, ``docker stop``, the kubelet ending an init container) handled as
    Ctrl-C: a KeyboardInterrupt in the main thread, so every command's Ctrl-C path runs for it
    too: it removes what it made, says what it left, exits 130.  Killed by the default action
    instead, a pack or an install would leave its temp dirs behind.  An ignored SIGTERM stays
    ignored; other threads do nothing."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


class DeferredInterrupt:
    """Ctrl-C taken at step boundaries only, for the steps that write what a user keeps (an
    install's switch, pack's swap of --out).

    Python raises KeyboardInterrupt between any two bytecodes, finalizers included, and one
    raised inside a ``__del__`` or a generator's close is printed as "Exception ignored in ...
    KeyboardInterrupt" and dropped: the interrupted command then carries on and reports
    success.  While this is active (``with``, on the main thread; elsewhere it does nothing),
    SIGINT (and SIGTERM, see ``stop_on_sigterm``) only records itself; ``check()`` raises KeyboardInterrupt where the caller can say
    what it left.  One still pending when the block ends without an error is raised then: the
    command finished its work, and its Ctrl-C line says so rather than the work being silently
    done after the user asked to stop."""

    def __init__(self):
        self.pending = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "DeferredInterrupt":
        if threading.current_thread() is threading.main_thread():
            # SIGTERM too, where ``stop_on_sigterm`` made it a Ctrl-C
            for signum, ours in ((signal.SIGINT, signal.default_int_handler),
                                 (signal.SIGTERM, _sigterm_as_interrupt)):
                if signal.getsignal(signum) is ours:
                    self._previous[signum] = signal.signal(signum, self._record)
        return self

    def _record(self, _signum, _frame) -> None:
        self.pending = True

    def check(self) -> None:
        """Raise the recorded Ctrl-C now (main thread only; other threads never raise it)."""
        if self.pending and threading.current_thread() is threading.main_thread():
            self.pending = False
            raise KeyboardInterrupt

    def __exit__(self, exc_type, *_exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if exc_type is None:
            self.check()


def from_os_error(e: OSError, path: os.PathLike | str | None = None, what: str = "",
                  error_class: type[CachebakeError] = BadInput, *, hint: str | None = None) -> CachebakeError:
    """An ``OSError`` on a path the user gave, as one line naming that path (not an
    internal temp file the OS error may name); ``hint``: what the failed command left."""
    where = os.fspath(path) if path is not None else (e.filename or "")
    reason = e.strerror or str(e)
    text = ": ".join(part for part in (where, what, reason) if part)
    return error_class(text, hint=hint)


ERROR_PREFIX = "cachebake: error: "


# C0 and C1 control characters and DEL: what a terminal acts on (ESC starts a control
# sequence that can move the cursor, rewrite what is shown, set the title, or on some
# terminals write files).  Kernel names, keys, paths and registry messages come from
# artifacts, logs and other programs.
# Lone surrogates too (a file name read with surrogateescape, a str built in memory): no UTF-8
# stream can encode one, and a print of it raises instead of showing it.
_CONTROL = dict.fromkeys([*range(0x00, 0x20), 0x7f, *range(0x80, 0xa0), *range(0xD800, 0xE000)], "\ufffd")


def printable(value) -> str:
    """``value`` as text a terminal only shows: every control character (and lone surrogate)
    replaced by U+FFFD.
    The text views' ``cli.render.safe`` adds rich markup escaping on top."""
    return str(value).translate(_CONTROL)


def shorten(text: str, limit: int, *, keep: int | None = None, mark: str = "...") -> str:
    """``text`` as it is when it has at most ``limit`` characters, else its first ``keep``
    (default: room for ``mark`` within ``limit``) followed by ``mark``.  The one rule for
    cutting a value down to fit a message; what makes it safe to show is ``printable``'s (or
    the caller's escaping)."""
    if len(text) <= limit:
        return text
    keep = limit - len(mark) if keep is None else keep
    return text[:max(keep, 0)] + mark


def print_error(err: CachebakeError, stream: TextIO | None = None) -> None:
    """``err`` as its one line (``cachebake: error: ...``), then its detail lines indented
    (preflight's differences), on ``stream`` (default: stderr), flushed.  Plain text, no rich:
    the error that rich itself is missing must print too."""
    stream = sys.stderr if stream is None else stream
    stream.write(ERROR_PREFIX + printable(err.line()) + "\n")
    for line in err.details():
        stream.write(f"  {printable(line)}\n")
    stream.flush()


# Where crash logs go: $CACHEBAKE_LOG_DIR, else the temp dir.
LOG_DIR_ENV = "CACHEBAKE_LOG_DIR"


def write_crash_log(exc: BaseException, command: str | None = None) -> str | None:
    """Write ``exc``'s traceback to a fresh ``cachebake-crash-*.log``; its path, or None if
    nothing could be written.  The one place a traceback goes: never the terminal."""
    import tempfile
    import traceback

    try:
        fd, path = tempfile.mkstemp(prefix="cachebake-crash-", suffix=".log",
                                    dir=os.environ.get(LOG_DIR_ENV) or None)
        with os.fdopen(fd, "w") as f:
            f.write(f"{command if command is not None else 'cachebake ' + ' '.join(sys.argv[1:])}\n")
            f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return path
    except OSError:
        return None


def missing_dependency(e: ModuleNotFoundError) -> "Unsupported | None":
    """A required package missing from this interpreter (a broken install, an init image built
    without it) is the user's to fix, not a bug: UNSUPPORTED, naming the package and the
    interpreter; any other missing module (a typo in our imports) stays a bug."""
    top = (e.name or "").partition(".")[0]
    dist = REQUIRED_MODULES.get(top)
    if dist is None:
        return None
    return Unsupported(f"the Python package {dist!r} is missing from {sys.executable}",
                       hint=f"install cachebake with its dependencies there (pip install {dist})")
