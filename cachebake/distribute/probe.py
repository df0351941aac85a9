"""The serving image's fingerprint, taken inside a Pod even when that image has no cachebake.

The init-container pattern (``cachebake k8s``) checks the bake against the *serving* image,
not the installer's: Triton's key, the Python ABI, ptxas and the cache-invalidating variables
are the server's.  A stock vLLM image has no cachebake, so two init containers share it:

1. ``python3 -m cachebake.distribute.probe --copy-package DIR`` in the installer image copies
   cachebake's pure-Python sources into an emptyDir;
2. ``python3 -m cachebake.distribute.probe --target sm_90 --out FILE`` runs in the serving
   image with ``PYTHONPATH=DIR``: the fingerprint needs the standard library and the image's
   own Triton only (no click, zstandard or rich), and it imports no torch.

The installer then runs ``cachebake install ... --fingerprint FILE``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def copy_package(dest: os.PathLike | str) -> Path:
    import cachebake

    src = Path(cachebake.__file__).resolve().parent
    target = Path(dest) / "cachebake"
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                    dirs_exist_ok=True)
    return target


def write_fingerprint(target: str | None, out: os.PathLike | str) -> None:
    from cachebake.artifact.fingerprint import current_fingerprint

    current_fingerprint(target).write(out)  # whole or not at all: the installer never reads half


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m cachebake.distribute.probe")
    parser.add_argument("--copy-package", metavar="DIR")
    parser.add_argument("--target")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    from cachebake.errors import CachebakeError

    try:
        if args.copy_package:
            copy_package(args.copy_package)
        elif args.out:
            write_fingerprint(args.target, args.out)
        else:
            parser.error("give --copy-package DIR or --out FILE")
    except CachebakeError as e:
        sys.stderr.write(f"cachebake: error: {e.line()}\n")
        return int(e.code)
    except OSError as e:
        sys.stderr.write(f"cachebake: error: {e.filename or ''}: {e.strerror or e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
