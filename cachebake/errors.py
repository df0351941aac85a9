"""Exit codes and the errors that carry them.

Every refusal cachebake makes is a ``CachebakeError`` with a one-line message and an exit
code from ``ExitCode``; the CLI prints the message and exits with the code.  Scripts and init
containers branch on these numbers, so they never change meaning (README lists them).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1  # an unexpected error: a bug, or an OS error we did not anticipate
    USAGE = 2  # click's own code for bad options
    BAD_INPUT = 3  # missing path, empty dir, not a cache, unreadable file, --out in the way
    PREFLIGHT = 4  # the artifact was baked for another environment: it would not hit
    CORRUPT = 5  # a digest, size or stream does not match what the artifact declares
    UNSAFE = 6  # the layer tries to escape DIR, holds links/devices/setuid, or is a bomb
    UNSUPPORTED = 7  # unknown format version, or no bake for this GPU target
    COMPILES_SEEN = 8  # verify: the sweep compiled or autotuned something
    COMMAND_FAILED = 9  # build: the warmup command or driver failed
    NOT_STABLE = 10  # build: still compiling after --max-rounds
    LOCKED = 11  # install: could not take the install lock in time


class CachebakeError(Exception):
    """A refusal with a clear one-line message and a distinct exit code."""

    code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, code: ExitCode | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class BadInput(CachebakeError):
    code = ExitCode.BAD_INPUT


class PreflightMismatch(CachebakeError):
    code = ExitCode.PREFLIGHT


class CorruptArtifact(CachebakeError):
    code = ExitCode.CORRUPT


class UnsafeArtifact(CachebakeError):
    code = ExitCode.UNSAFE


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
