"""Rewrite Triton group files so a bake hits at whatever path it is installed.

Triton 3.6 finds a kernel's files through ``<key dir>/__grp__<name>.json``, whose
``child_paths`` map each file name to an ABSOLUTE path; a path that does not exist is silently
dropped and the kernel recompiles (shared/FACTS.md: 19 of 77 Mamba2 kernels on an H200 when the
cache moved).  Install rewrites every child path to ``<serve root>/triton/<KEY>/<file>``: the
path the server will open, which is DIR unless the volume is mounted elsewhere in the serving
container (``--serve-at``).  The file name must be a plain name of a file in the same key dir,
which is all Triton ever writes; anything else is refused as unsafe rather than pointed at.
"""

from __future__ import annotations

import os
import posixpath
from typing import Callable

from cachebake.artifact.groups import GROUP_PREFIX, InvalidGroup, relocated_group
from cachebake.artifact.schema import CAP_GROUP_FILE
from cachebake.errors import InvalidDocument, UnsafeArtifact
from cachebake.jsonio import write_atomic


def is_group_file(member_name: str) -> bool:
    """``triton/<KEY>/__grp__<name>.json``: exactly three components, in the triton role."""
    parts = member_name.split("/")
    return (len(parts) == 3 and parts[0] == "triton" and parts[2].startswith(GROUP_PREFIX)
            and parts[2].endswith(".json"))


def rewrite_group(data: bytes, member_name: str, key_dir: str) -> bytes:
    """Return the group file ``member_name`` with every child path in ``key_dir``."""
    if len(data) > CAP_GROUP_FILE:
        raise InvalidDocument(f"group file {member_name}", "", f"is {len(data)} bytes, over the "
                              f"{CAP_GROUP_FILE} this reader accepts")
    try:
        return relocated_group(data, key_dir)
    except InvalidGroup as e:
        if e.unsafe:
            raise UnsafeArtifact(f"group file {member_name!r} {e}") from None
        raise InvalidDocument(f"group file {member_name}", e.field, e.detail) from None


def group_rewriter(serve_root: str) -> Callable[[str], Callable[[bytes], bytes] | None]:
    """The ``extract_layer`` transform that relocates group files as they are written."""
    serve_root = os.path.abspath(serve_root)

    def for_member(member_name: str):
        if GROUP_PREFIX not in member_name or not is_group_file(member_name):  # the cheap test first
            return None
        role, key, _ = member_name.split("/")
        key_dir = posixpath.join(serve_root, role, key)
        return lambda data: rewrite_group(data, member_name, key_dir)

    return for_member


def relocate_tree(triton_dir: str, serve_dir: str | None = None) -> int:
    """Rewrite the group files of an already-extracted Triton cache in place; returns the count.

    For caches restored by other means (``docker cp``, a plain ``tar -x``).  ``serve_dir`` is
    the path the server will see ``triton_dir`` at (TRITON_CACHE_DIR); by default ``triton_dir``.
    """
    triton_dir = os.path.abspath(triton_dir)
    serve_dir = os.path.abspath(serve_dir) if serve_dir else triton_dir
    count = 0
    for key in sorted(os.listdir(triton_dir)):
        key_path = os.path.join(triton_dir, key)
        if not os.path.isdir(key_path) or key.startswith("tmp.pid_"):
            continue
        for name in sorted(os.listdir(key_path)):
            member = f"triton/{key}/{name}"
            if not is_group_file(member):
                continue
            path = os.path.join(key_path, name)
            with open(path, "rb") as f:
                new = rewrite_group(f.read(), member, posixpath.join(serve_dir, key))
            write_atomic(path, new)  # a reader sees the old or the new file, never half of one
            count += 1
    return count
