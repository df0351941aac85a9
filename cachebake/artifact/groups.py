"""Triton's group files: the one place that reads and rewrites them (pack and install both do).

``<key dir>/__grp__<name>.json`` maps each of a kernel's files to an ABSOLUTE path; Triton
silently drops a path that does not exist and recompiles the kernel.  Pack points them at the
serving root, install at wherever the bake lands.  A child must be a plain file name in the
same key dir, which is all Triton ever writes; anything else is refused, never pointed at.
"""

from __future__ import annotations

import json

from cachebake.artifact import schema
from cachebake.errors import InvalidDocument

GROUP_PREFIX = "__grp__"


class InvalidGroup(ValueError):
    """A group file that is not Triton's JSON (``unsafe`` False) or names a child outside its
    key dir (``unsafe`` True); ``field`` is the JSON path at fault.  Callers turn it into their
    own error class."""

    def __init__(self, reason: str, unsafe: bool, field: str = "", detail: str = ""):
        super().__init__(reason)
        self.unsafe = unsafe
        self.field = field
        self.detail = detail or reason


def relocated_group(data: bytes, key_dir: str, keep: set[str] | None = None) -> bytes:
    """The group file ``data`` with every child at ``key_dir/<child>``; children not in
    ``keep`` (when given) are left out."""
    # Bounded and strict like every document of an artifact (cachebake.artifact.schema): no
    # duplicate keys, no deep nesting, {"child_paths": {name: path}} and nothing else.
    try:
        grp = schema.parse_json(data, "group file")
        children = schema.check_group(grp, "group file")
    except InvalidDocument as e:
        raise InvalidGroup(f"is not valid Triton group JSON ({e.field or 'top level'}: {e.reason})",
                           unsafe=False, field=e.field, detail=f"{e.reason} (not valid Triton group JSON)") from None
    new = {}
    for name in children:
        if not name or "/" in name or "\x00" in name or name in (".", ".."):
            raise InvalidGroup(f"names a child {name!r} that is not a plain file name", unsafe=True,
                               field=f"child_paths.{name}")
        if keep is None or name in keep:
            new[name] = f"{key_dir.rstrip('/')}/{name}"
    grp["child_paths"] = new
    # Same shape Triton writes (json.dumps defaults), so a rewritten file reads like a native one.
    return json.dumps(grp).encode()
