"""cachebake.cli.output: what goes to stderr besides errors (warnings, notes, progress) quotes
artifact values; a C0/C1 control in them never reaches the terminal (attack corpus, issue 31:
install's preflight warning printed a baked vllm_version holding ESC and U+009B raw)."""

import pytest

from cachebake.cli.output import Output

HOSTILE = "0.34.0\x1b]0;pwn\x07\x1b[2J\x9b31m\r\x85"


@pytest.mark.parametrize("method", ["warn", "note", "progress"])
def test_stderr_lines_print_no_control_characters(method, capsys):
    getattr(Output("install"), method)(f"vllm_version: baked {HOSTILE}, here 0.34.0")
    out, err = capsys.readouterr()
    assert out == ""
    assert "vllm_version: baked 0.34.0" in err and "here 0.34.0" in err
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7f <= ord(c) < 0xa0 for c in err), repr(err)
