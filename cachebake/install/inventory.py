"""What an install recorded in install.json, and the check of the tree against it.

install.json lists every directory and, per file, ``[size, mtime_ns, ctime_ns, inode]`` as
fstat saw them right after writing.  A repeat install compares the tree with that inventory
(a stat per entry, no hashing: sha256 of a 48 MB cache would cost ~45 ms, most of an
install) and repairs by a fresh extraction when anything differs.  A rewrite that keeps the
size still changes ctime, which no user can set back (only the clock can), so the stat
signature stands in for a content digest.
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
    for name, rec in c.obj(c.get(marker, "files", ""), "files").items():
        rec = c.array(rec, f"files.{name}", max_len=4)
        if len(rec) != 4:
            c.fail(f"files.{name}", "must be [size, mtime_ns, ctime_ns, inode]")
        for i, n in enumerate(rec):
            c.integer(n, f"files.{name}[{i}]", hi=1 << 64)


def check_tree(version_fd: int, marker: dict, limit: int = 20) -> list[str]:
    """What differs between the installed tree and the inventory install.json recorded: a
    missing or replaced directory, a missing file, or one whose size, mtime, ctime or inode
    changed (a rewrite that kept the size still changes ctime, which no user can set back)."""
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
    for name, (size, mtime, ctime, ino) in marker["files"].items():
        try:
            st = os.stat(name, dir_fd=version_fd, follow_symlinks=False)
        except OSError:
            problems.append(f"{name}: missing")
        else:
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{name}: no longer a regular file")
            elif st.st_size != size:
                problems.append(f"{name}: {st.st_size} bytes, {size} installed")
            elif (st.st_mtime_ns, st.st_ctime_ns, st.st_ino) != (mtime, ctime, ino):
                problems.append(f"{name}: changed since it was installed")
        if len(problems) >= limit:
            break
    return problems
