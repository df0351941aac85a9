"""Shared fixtures: real Triton caches built by ahead-of-time compiles (tests/kit/aot.py).

The helper modules live in tests/kit/ and are imported by their plain names (``import
installkit``): that directory goes first on sys.path here.  Triton is imported only by the
fixtures and tests that compile (``aot`` inside ``_built_cache``), so a test that needs no
Triton (tests/test_layers.py) runs in an interpreter without it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "kit"))

import servekit  # noqa: E402  (no Triton: it names where the kernels are)

# Every process imports the test kernels from one place (servekit.kernels_dir), this one too.
sys.path.insert(0, str(servekit.kernels_dir()))

# The Ctrl-C tests send SIGINT to the cachebake processes they start.  A shell without job
# control starts a background command (`.ci/run ... &`, nohup) with SIGINT ignored (POSIX), an
# ignored signal stays ignored across exec, and Python then installs no KeyboardInterrupt
# handler: those children would never see the Ctrl-C.  A handled signal is reset to the default
# at exec, so taking SIGINT back here gives every child Python's usual handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def _built_cache(tmp_path_factory) -> Path:
    import aot  # Triton: only where a cache is compiled

    root = tmp_path_factory.mktemp("aot") / "triton"
    events = aot.compile_in_subprocess(root)
    assert [e["cache_hit"] for e in events] == [False] * len(aot.SPECS)
    aot.write_autotune_result(root)
    return root


@pytest.fixture
def triton_cache(_built_cache, tmp_path) -> Path:
    """A private copy of a real sm_90 Triton cache: 5 kernel specializations of 3 kernels and
    one autotune result."""
    dst = tmp_path / "cache" / "triton"
    shutil.copytree(_built_cache, dst)
    return dst


def tool(name: str) -> str:
    """A real OCI tool; CI installs them (.ci/run).  CACHEBAKE_UMOCI points at a umoci that
    reads zstd layers (Debian bookworm's 0.4.7 does not)."""
    path = os.environ.get(f"CACHEBAKE_{name.upper()}")
    if not path and name == "umoci" and os.path.exists(CI_UMOCI):
        path = CI_UMOCI  # where .ci/run put it: the fast lane after .ci/run finds it too
    path = path or shutil.which(name)
    if not path:
        pytest.fail(f"{name} is not installed: run .ci/run or install it (see README)")
    if name == "umoci":
        version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.split()
        if version[-1:] and version[-1].startswith("0.4."):
            pytest.fail(f"{path} is umoci {version[-1]}, which cannot read zstd layers: run .ci/run "
                        f"(it puts a newer one at {CI_UMOCI}) or set CACHEBAKE_UMOCI")
    return path


# .ci/run: CI_DIR=${CACHEBAKE_CI_DIR:-/opt/cachebake-ci}, umoci from Debian sid under
# $CI_DIR/umoci-sid (.ci/newer-umoci.sh); tests/test_readme.py holds the two equal.
CI_UMOCI = os.path.join(os.environ.get("CACHEBAKE_CI_DIR") or "/opt/cachebake-ci", "umoci-sid/usr/bin/umoci")


NOBODY = 65534


def as_nobody(argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``argv`` as uid/gid 65534 with setpriv, for tests of non-root behaviour.

    Needs root, setpriv, and an interpreter whose files uid 65534 can reach (.ci/run makes its
    venv from Debian's /usr/bin/python3); skips with the reason otherwise.  The probe execs the
    interpreter from a process that already runs as 65534 (``env``): setpriv itself still holds
    root's capabilities at its own exec, so an interpreter under a 0700 home would get through
    that exec and then fail at the first one the test's own code makes."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run as another user")
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run(cmd + [shutil.which("env") or "/usr/bin/env", sys.executable, "-c",
                                  "import cachebake.cli, click, zstandard, triton"],
                           capture_output=True, text=True, cwd="/")
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        pytest.skip(f"uid {NOBODY} cannot run {sys.executable} and import cachebake with it "
                    f"(an interpreter under a 0700 home?): {why}")
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd + argv, **kw)


@pytest.fixture
def public_tmp():
    """A temp dir that uid 65534 can reach (pytest's own tmp_path lives under a 0700 dir)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="cachebake-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def installed(triton_cache) -> Path:
    """``triton_cache`` as install leaves a cache: group files naming where it is (a plain
    copy still names the session's build dir)."""
    import servekit

    return servekit.relocate(triton_cache)
