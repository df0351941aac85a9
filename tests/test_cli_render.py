"""cli.render: text from artifacts and logs reaches the terminal as text, never as control
sequences or rich markup."""

import io

from rich.console import Console

from cachebake.cli.render import printable, safe


def test_control_characters_are_replaced_not_passed_through():
    hostile = "add_kernel\x1b]0;pwned\x07\x1b[2J\r\nnext\x9b31m\x7f"
    out = printable(hostile)
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in out)
    assert out.startswith("add_kernel\ufffd]0;pwned") and "next" in out


def test_markup_in_a_name_prints_as_itself():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    console.print(f"kernel {safe('[/x][bold red]k[link=file:///etc/passwd]x')}")
    assert buf.getvalue().strip() == "kernel [/x][bold red]k[link=file:///etc/passwd]x"
