"""cachebake.distribute.keys: key and policy files are the user's, read bounded and without
blocking (attack corpus, issue 31: `install --verify-key FIFO` waited forever for a writer)."""

import os
import subprocess
import sys

import pytest

from cachebake.distribute import keys as keyring
from cachebake.errors import BadInput, ExitCode

pytest.importorskip("cryptography")


@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_a_key_that_is_not_a_regular_file_is_refused_at_once(kind, tmp_path):
    path = tmp_path / "k.pub"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path = "/dev/zero"
    with pytest.raises(BadInput, match="not a regular file"):
        keyring.load_public_key(str(path))
    with pytest.raises(BadInput, match="not a regular file"):
        keyring.load_private_key(str(path))


def test_a_fifo_key_on_the_command_line_exits_3_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "k.pub")
    r = subprocess.run([sys.executable, "-m", "cachebake.cli", "verify-signature", "docker://127.0.0.1:1/x:t",
                        "--key", str(tmp_path / "k.pub")], capture_output=True, text=True, timeout=120)
    assert r.returncode == ExitCode.BAD_INPUT and "not a regular file" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_key_behind_links_still_reads(tmp_path):
    """A Kubernetes Secret volume: k.pub -> ..data/k.pub -> ..2026_x/k.pub."""
    keyring.generate(str(tmp_path / "real"))
    (tmp_path / "..2026_x").mkdir()
    os.rename(tmp_path / "real.pub", tmp_path / "..2026_x" / "k.pub")
    (tmp_path / "..data").symlink_to("..2026_x")
    (tmp_path / "k.pub").symlink_to("..data/k.pub")
    assert keyring.load_public_key(str(tmp_path / "k.pub")).pem.startswith("-----BEGIN PUBLIC KEY-----")
