"""Canaries that prove nothing ran: a shared library built with gcc whose constructor appends
to a file when anything loads it (LD_PRELOAD into a program, LLVM_PASS_PLUGIN_PATH into
Triton's LLVM), and a Python module whose import does the same.  Each is checked to work
before a test relies on its silence, so a test that sees no mark could have seen one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_LIBRARY = r"""
#include <stdio.h>
__attribute__((constructor)) static void canary(void) {
    FILE *f = fopen(MARK, "a");
    if (f) { fputs("loaded\n", f); fclose(f); }
}
"""


def shared_library(d: Path) -> tuple[Path, Path]:
    """(library, mark): ``mark`` appears when any process loads ``library``."""
    d.mkdir(parents=True, exist_ok=True)
    mark, src, lib = d / "library-loaded", d / "canary.c", d / "libcanary.so"
    src.write_text(_LIBRARY)
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARK="{mark}"', str(src), "-o", str(lib)],
                   check=True, capture_output=True)
    # it works: preloaded into gcc (what built Triton's helpers under a record's LD_PRELOAD)
    subprocess.run(["gcc", "--version"], env={**os.environ, "LD_PRELOAD": str(lib)}, check=True,
                   capture_output=True)
    assert mark.exists(), "the canary library's constructor did not run"
    mark.unlink()
    return lib, mark


def python_module(d: Path, name: str) -> Path:
    """Write module ``name`` into ``d`` (put ``d`` on the path); its import leaves the mark."""
    d.mkdir(parents=True, exist_ok=True)
    mark = d / f"{name}-imported"
    (d / f"{name}.py").write_text(f"open({str(mark)!r}, 'a').write('imported\\n')\n")
    return mark
