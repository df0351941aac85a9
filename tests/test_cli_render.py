"""cli.render: text from artifacts and logs reaches the terminal as text, never as control
sequences or rich markup."""

import io

from rich.console import Console

from cachebake.cli.render import safe
from cachebake.errors import printable


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


# ------------------------------------------------------------ inspect of a hostile artifact
HOSTILE_NAME = "add\x1b]0;pwned\x07\x1b[2J[/x][bold red]k[link=file:///etc/passwd]x\r\x9b31m"


def _hostile_artifact(tmp_path):
    import badlayers
    from installkit import current_fingerprint_dict

    fp = dict(current_fingerprint_dict(), gpu_name="H200\x1b[8m[/]", env={"K\x1b[1m": "v[/x]\x07"})
    entries = [badlayers.Entry("triton", badlayers.tarfile.DIRTYPE),
               badlayers.Entry("triton/k", badlayers.tarfile.DIRTYPE),
               badlayers.Entry("triton/k/x.json", data=b"{}")]
    inventory = {"kernels": [{"name": HOSTILE_NAME, "key_dir": "k\x1b[1m", "target": "cuda:90"}],
                 "autotune": [], "helpers": [],
                 "dropped": [{"path": "p\x1b[1m[/]", "reason": "[blink]r\x07"}], "other_files": {}}
    # the bake section's own fields are typed (BakeRecord: a wrong type is exit 5, tested in
    # test_artifact_manifest.py); here every string it holds is hostile text, and what a fold
    # records inside its entry is of any type
    bake = {"driver": "[/x]\x1b[5m", "events": [{"kind": "compile", "kernel": HOSTILE_NAME,
                                                 "step": "[link=x]s\x1b[2J"}],
            "folded": [{"kernels": "x", "autotune": 7, "failed": None, "logs": "[/]\x1b[0m"}],
            "unverified_on_target": {"how": "[blink]\x1b[5m"}, "rounds": 2}
    return badlayers.artifact_from_entries(tmp_path / "art", entries, fp,
                                           manifest_overrides={"inventory": inventory, "bake": bake})


def test_inspect_prints_every_value_from_a_hostile_artifact_as_text(tmp_path):
    from click.testing import CliRunner

    from cachebake.cli import main

    art = _hostile_artifact(tmp_path)
    r = CliRunner().invoke(main, ["inspect", str(art)], env={"COLUMNS": "400"})  # no table folding
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert not [c for c in out if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0)]
    # markup from the artifact printed as itself, never applied (or refused by rich)
    shown = printable(HOSTILE_NAME)
    assert out.count(shown) == 2  # the kernels table and the steps table
    for text in ("H200\ufffd[8m[/]", "[/x]\ufffd[5m", "[link=x]s\ufffd[2J", "p\ufffd[1m[/]: [blink]r\ufffd",
                 "K\ufffd[1m=v[/x]\ufffd"):
        assert text in out, text


def test_an_empty_compile_record_says_so_rather_than_an_empty_field(tmp_path):
    # a bake whose processes launched nothing leaves a record with no targets: the line must
    # not read "recorded on ;"
    from cachebake.cli.inspect import inspect_artifact
    from cachebake.cli.render import render_bake

    ref = inspect_artifact(_hostile_artifact(tmp_path)).bakes[0]
    for targets, shown in (([], "no target recorded;"), (["cuda:90"], "recorded on cuda:90;")):
        buf = io.StringIO()
        record = {"compiles": 0, "kernels": 0, "autotune": 0, "autotune_candidates": 0,
                  "unverified": 0, "targets": targets, "modules": []}
        render_bake(ref, Console(file=buf, force_terminal=False, width=400), record=record)
        line = next(ln for ln in buf.getvalue().splitlines() if "compile record" in ln)
        assert shown in line and "recorded on ;" not in line, line
