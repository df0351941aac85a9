"""Whether this machine can build Triton's launcher helpers, asked before a long run starts.

Triton builds two small C extensions the first time a kernel launches or a replay compiles one
(``cuda_utils`` and ``__triton_launcher``; triton/runtime/build.py ``_build``): it takes
``$CC``, else ``gcc``, else ``clang``, and compiles a shared object against ``Python.h`` from
the interpreter's include dir.  A Debian minimal system has none of that (gcc alone is not
enough: libc6-dev holds the C headers and crt files, python3-dev ``Python.h``), and Triton then
fails inside the run ("building cuda_utils failed: [Errno 2] No such file or directory:
'gcc'").  ``c_toolchain_problem`` builds a tiny extension the same way, once per process, and
says in one line what is missing.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sysconfig
import tempfile

INSTALL_HINT = "install gcc, libc6-dev and python3-dev (Debian, Ubuntu) or set CC"
_PROBE = "#include <Python.h>\nint cachebake_probe(void) { return Py_IsInitialized(); }\n"


def _compiler() -> str | None:
    """The compiler Triton 3.6 would pick (runtime/build.py: $CC, else gcc, else clang)."""
    cc = os.environ.get("CC")
    if cc is not None:
        return cc
    return shutil.which("gcc") or shutil.which("clang")


def _python_include() -> str:
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # as Triton does: Debian's custom scheme
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


@functools.lru_cache(maxsize=None)
def c_toolchain_problem() -> str | None:
    """None where Triton can build its helpers here; else one line saying what is missing."""
    cc = _compiler()
    if cc is None:
        return f"no C compiler ($CC, gcc or clang) is installed; {INSTALL_HINT}"
    include = _python_include()
    if not os.path.isfile(os.path.join(include, "Python.h")):
        return f"Python.h is not in {include} (this interpreter's headers); {INSTALL_HINT}"
    with tempfile.TemporaryDirectory(prefix="cachebake-cc-") as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(_PROBE)
        try:
            proc = subprocess.run([cc, src, "-shared", "-fPIC", "-o", os.path.join(tmp, "probe.so"),
                                   f"-I{include}"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            return f"the C compiler {cc!r} does not run ({getattr(e, 'strerror', None) or e}); {INSTALL_HINT}"
    if proc.returncode != 0:
        first = next((ln.strip() for ln in proc.stderr.splitlines() if "error" in ln.lower()),
                     (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[0])
        return f"the C compiler {cc!r} cannot build an extension here ({first[:200]}); {INSTALL_HINT}"
    return None
