"""What an install recorded in install.json, and the check of the tree against it.

install.json lists every directory, every file with its size, and ``sealed_ctime_ns``: the
ctime of install.json itself when it was created, after the last file was written.  A repeat
install compares the tree with that (a stat per entry, no hashing: sha256 of a 48 MB cache
would cost ~45 ms, most of an install) and repairs by a fresh extraction when anything
differs.  Whatever changes a file after the install (a write that keeps its size, chmod, a
rename or link over it, a restore with ``cp -a``) sets its ctime to the filesystem's "now",
which no user can set back (only the clock can): a file whose ctime is after the seal has
changed.

Why one seal and not each file's own ``[size, mtime, ctime, inode]``: those need an fstat per
file at install, ~3 ms of an install that the pipeline it is measured against never spends
(bench/install.md).  What it gives up: a change made after the clock was stepped back past the
install goes unseen.  The seal is read before install.json's content is written, so that write
(on Linux >= 6.13's multigrain timestamps: fine-grained, after a query) moves the clock's floor
past the seal and a change in the same clock tick still counts as later.
"""

from __future__ import annotations

import os
import stat

from cachebake.artifact import schema

MARKER = "install.json"


def check_marker(marker) -> None:
    """install.json is ours, but lives in a volume: check the fields the next install reads."""
    c = schema.Checker(MARKER)
    c.obj(marker)
    c.digest(c.get(marker, "layer_digest", ""), "layer_digest")
    c.string(c.get(marker, "serve_at", ""), "serve_at")
    schema.check_roles(c.get(marker, "roles", ""), c)
    for i, d in enumerate(c.array(c.get(marker, "dirs", ""), "dirs")):
        c.string(d, f"dirs[{i}]")
    c.integer(c.get(marker, "sealed_ctime_ns", ""), "sealed_ctime_ns", hi=1 << 64)
    for name, size in c.obj(c.get(marker, "files", ""), "files").items():
        c.integer(size, f"files.{name}", hi=1 << 64)


def check_tree(version_fd: int, marker: dict, limit: int = 20) -> list[str]:
    """What differs between the installed tree and the inventory install.json recorded: a
    missing or replaced directory, a missing file, one of another size, or one changed after
    the seal (a rewrite that kept the size still moves its ctime, which no user can set back)."""
    problems: list[str] = []
    for d in marker["dirs"]:
        try:
            st = os.stat(d, dir_fd=version_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                problems.append(f"{d}: no longer a directory")
        except OSError:
            problems.append(f"{d}: missing")
        if len(problems) >= limit:
            return problems
    sealed = marker["sealed_ctime_ns"]
    for name, size in marker["files"].items():
        try:
            st = os.stat(name, dir_fd=version_fd, follow_symlinks=False)
        except OSError:
            problems.append(f"{name}: missing")
        else:
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{name}: no longer a regular file")
            elif st.st_size != size:
                problems.append(f"{name}: {st.st_size} bytes, {size} installed")
            elif st.st_ctime_ns > sealed:
                problems.append(f"{name}: changed since it was installed")
        if len(problems) >= limit:
            break
    return problems
