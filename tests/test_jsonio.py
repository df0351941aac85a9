"""jsonio's one writer of documents to users' paths: whole or not at all, 0644, errors naming
the user's path; and the strict reader's one lenient mode (Triton's own metadata)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from cachebake import jsonio
from cachebake.errors import BadInput, InvalidDocument


def test_writes_the_whole_document_0644_whatever_the_umask(tmp_path):
    path = tmp_path / "new" / "dir" / "doc.json"
    old = os.umask(0o077)
    try:
        jsonio.write_json_atomic(path, {"b": float("inf"), "a": [1]})
    finally:
        os.umask(old)
    assert json.loads(path.read_text()) == {"a": [1], "b": "inf"}  # strict: what parse_json reads
    jsonio.parse_json(path.read_bytes(), "doc")
    assert path.stat().st_mode & 0o777 == 0o644
    assert os.listdir(path.parent) == ["doc.json"]


def test_an_error_names_the_users_path_and_leaves_the_old_file(tmp_path):
    path = tmp_path / "doc.json"
    jsonio.write_json_atomic(path, {"old": True})
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadInput, match=f"^{tmp_path}/file/doc.json: cannot write: {tmp_path}/file is not a directory"):
        jsonio.write_json_atomic(tmp_path / "file" / "doc.json", {})
    with pytest.raises(BadInput, match=f"^{tmp_path}: cannot write: Is a directory"):
        jsonio.write_json_atomic(tmp_path, {})
    assert json.loads(path.read_text()) == {"old": True}
    assert sorted(os.listdir(tmp_path)) == ["doc.json", "file"]


_WRITER = """
import resource, signal, sys
from cachebake import jsonio
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal, as a full disk is ENOSPC
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
try:
    jsonio.write_json_atomic(sys.argv[1], {"new": "x" * 100000})
except Exception as e:
    print(e.line(), file=sys.stderr)
    sys.exit(int(e.code))
"""


def test_a_write_cut_short_leaves_the_old_file_and_no_temp(tmp_path):
    """A real short write (RLIMIT_FSIZE: the kernel refuses bytes past 4 KiB with EFBIG, as
    a full disk refuses them with ENOSPC): the old document stays, the temp file goes, the
    line names the user's path."""
    path = tmp_path / "doc.json"
    jsonio.write_json_atomic(path, {"old": True})
    r = subprocess.run([sys.executable, "-c", _WRITER, str(path), "4096"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith(f"{path}: cannot write: File too large")
    assert json.loads(path.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["doc.json"]


def test_a_killed_writer_leaves_the_old_document_or_the_new(tmp_path):
    path = tmp_path / "doc.json"
    jsonio.write_json_atomic(path, {"old": True})
    prog = ("import sys\nfrom cachebake import jsonio\n"
            "for i in range(10**6):\n    jsonio.write_json_atomic(sys.argv[1], {'i': i, 'pad': 'x' * 200000})\n")
    for delay in (0.3, 0.5, 0.7):
        p = subprocess.Popen([sys.executable, "-c", prog, str(path)], env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            p.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
        doc = json.loads(path.read_text())  # never half a document
        assert doc == {"old": True} or len(doc["pad"]) == 200000


def test_non_finite_numbers_only_where_asked():
    with pytest.raises(InvalidDocument, match="Infinity"):
        jsonio.parse_json(b'{"t": Infinity}', "doc")
    assert jsonio.parse_json(b'{"t": [Infinity, NaN]}', "doc", allow_non_finite=True)["t"][0] == float("inf")
    with pytest.raises(InvalidDocument, match="twice"):
        jsonio.parse_json(b'{"t": 1, "t": 2}', "doc", allow_non_finite=True)



@pytest.mark.parametrize("doc", [b'{"k": "a\\ud800b"}', b'{"a\\udfff": 1}', b'[["\\uDC00"]]',
                                 b'{"k": "\\ude00\\ud83d"}'])
def test_an_unpaired_surrogate_escape_is_refused(doc):
    """json.loads makes a lone surrogate of it: a str that printing or writing as UTF-8 raises on."""
    with pytest.raises(InvalidDocument, match="unpaired UTF-16 surrogate"):
        jsonio.parse_json(doc, "doc")


def test_a_paired_surrogate_escape_and_escaped_backslashes_still_read():
    assert jsonio.parse_json(b'{"k": "\\ud83d\\ude00"}', "doc") == {"k": "\U0001F600"}
    assert jsonio.parse_json(b'{"k": "\\\\ud800"}', "doc") == {"k": "\\ud800"}
