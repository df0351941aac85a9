"""The error model's one printer: the CLI boundary and the round child print a refusal the
same way, and an OS error without a path is still a readable line."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

from cachebake.errors import BadInput, PreflightMismatch, from_os_error, print_error

REPO = Path(__file__).resolve().parent.parent


def test_one_line_then_the_details_indented():
    stream = io.StringIO()
    print_error(PreflightMismatch("bake for cuda:90 was made elsewhere:\n  ptxas: differs\n  env: differs",
                                  hint="--allow-mismatch installs anyway"), stream)
    assert stream.getvalue() == ("cachebake: error: bake for cuda:90 was made elsewhere:; --allow-mismatch "
                                 "installs anyway\n  ptxas: differs\n  env: differs\n")


def test_the_round_child_prints_what_the_cli_prints(tmp_path):
    (tmp_path / "drv.py").write_text(
        "from cachebake.errors import PreflightMismatch\n"
        "def refuse(**kw):\n    raise PreflightMismatch('differs:\\n  ptxas: a\\n  env: b')\n")
    r = subprocess.run([sys.executable, "-m", "cachebake.drivers.child", "drv:refuse", "{}"],
                       env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"},
                       capture_output=True, text=True, timeout=120)
    stream = io.StringIO()
    print_error(PreflightMismatch("differs:\n  ptxas: a\n  env: b"), stream)
    assert r.returncode == 4 and r.stderr == stream.getvalue()


def test_an_os_error_without_a_path_reads_as_a_sentence():
    e = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert from_os_error(e).line() == "No space left on device"  # not ": No space left on device"
    assert from_os_error(e, "/v", "cannot write").line() == "/v: cannot write: No space left on device"
    assert isinstance(from_os_error(e, what="lock"), BadInput)


def test_an_error_line_reaches_the_terminal_without_control_sequences():
    """A message built from hostile text (a registry's answer, a key from a document): the
    one line the CLI prints has every control character replaced."""
    import io

    from cachebake.errors import BadInput, print_error

    buf = io.StringIO()
    print_error(BadInput("registry said: \x1b]0;owned\x07\x1b[2Jgone"), buf)
    out = buf.getvalue()
    assert out.count("\n") == 1 and "\x1b" not in out and "\x07" not in out
    assert out.startswith("cachebake: error: registry said: \ufffd]0;owned")


def test_printable_replaces_lone_surrogates():
    """A file name read with surrogateescape, or a str from a lenient parser: printing it to a
    UTF-8 stream would raise instead of showing it."""
    from cachebake.errors import printable

    text = printable("k\udcff\ud800x\u00e9")
    assert text == "k\ufffd\ufffdx\u00e9"
    text.encode("utf-8")
