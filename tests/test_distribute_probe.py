"""The fingerprint probe the Pod runs in the serving image from a copy of cachebake's sources:
it must need nothing but the standard library (and the image's own Triton)."""

import json
import subprocess
import sys

from cachebake.artifact.fingerprint import current_fingerprint
from cachebake.distribute.probe import copy_package


def _probe(lib, out, *python_flags):
    return subprocess.run([sys.executable, *python_flags, "-m", "cachebake.distribute.probe",
                           "--target", "sm_90", "--out", str(out)],
                          env={"PYTHONPATH": str(lib), "PATH": "/usr/bin:/bin"}, cwd="/",
                          capture_output=True, text=True)


def test_the_copy_writes_this_environments_fingerprint(tmp_path):
    lib = tmp_path / "lib"
    copy_package(lib)
    assert (lib / "cachebake" / "distribute" / "probe.py").is_file()
    assert not list(lib.rglob("__pycache__"))
    r = _probe(lib, tmp_path / "fp.json")
    assert r.returncode == 0, r.stderr
    written = json.loads((tmp_path / "fp.json").read_text())
    here = current_fingerprint("sm_90").to_json()
    assert {k: written[k] for k in ("target", "triton_key", "python_tag", "ptxas")} == \
           {k: here[k] for k in ("target", "triton_key", "python_tag", "ptxas")}


def test_the_copy_needs_no_third_party_package(tmp_path):
    lib = tmp_path / "lib"
    copy_package(lib)
    # -S: no site-packages at all (no click, zstandard, rich, and no Triton either)
    r = _probe(lib, tmp_path / "fp.json", "-S")
    assert r.returncode == 0, r.stderr
    written = json.loads((tmp_path / "fp.json").read_text())
    assert written["target"] == "cuda:90" and written["triton_key"] is None


def test_errors_are_one_line_with_cachebakes_exit_code(tmp_path):
    lib = tmp_path / "lib"
    copy_package(lib)
    r = subprocess.run([sys.executable, "-m", "cachebake.distribute.probe", "--target", "sm_99x", "--out",
                        str(tmp_path / "f")], env={"PYTHONPATH": str(lib)}, capture_output=True, text=True)
    assert r.returncode == 3 and r.stderr.startswith("cachebake: error:") and r.stderr.count("\n") == 1
