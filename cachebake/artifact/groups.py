"""Triton's group files: the one place that reads and rewrites them (pack and install both do).

``<key dir>/__grp__<name>.json`` maps each of a kernel's files to an ABSOLUTE path; Triton
silently drops a path that does not exist and recompiles the kernel.  Pack points them at the
serving root, install at wherever the bake lands.  A child must be a plain file name in the
same key dir, which is all Triton ever writes; anything else is refused, never pointed at.
"""

from __future__ import annotations

import json
import re

from cachebake import jsonio
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


# What json.dumps writes for {"child_paths": {name: path}} (Triton's json.dumps, and pack's,
# which is below) when names are plain ASCII file names and paths printable ASCII with nothing
# to escape.  ``_canonical_children`` accepts a group file only if it is byte for byte that, so
# it accepts nothing the strict path below would refuse.
_CANONICAL_HEAD, _CANONICAL_TAIL = b'{"child_paths": {', b"}}"
_CANONICAL_CHILD = re.compile(rb'"([A-Za-z0-9_.+-]{1,255})": "([\x20\x21\x23-\x5b\x5d-\x7e]{0,%d})"'
                              % schema.MAX_STRING)
_PLAIN_DIR = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]+\Z")


def _canonical_children(data: bytes) -> list[bytes] | None:
    """The child names of a group file in json.dumps' exact form, or None (the strict path
    decides).  Install rewrites every group file of a bake, on the thread that bounds its
    speed (bench/install.md): this takes ~3 us where parsing, checking and re-encoding take
    ~11 us (~50 us a file on a slower core, inside an extraction)."""
    if not (data.startswith(_CANONICAL_HEAD) and data.endswith(_CANONICAL_TAIL)):
        return None
    pairs = _CANONICAL_CHILD.findall(data)
    if not pairs or len(pairs) > schema.MAX_GROUP_CHILDREN:
        return None
    if data != _CANONICAL_HEAD + b", ".join(b'"%s": "%s"' % pair for pair in pairs) + _CANONICAL_TAIL:
        return None
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names) or b"." in names or b".." in names:
        return None
    return names


def relocated_group(data: bytes, key_dir: str, keep: set[str] | None = None) -> bytes:
    """The group file ``data`` with every child at ``key_dir/<child>``; children not in
    ``keep`` (when given) are left out."""
    key_dir = key_dir.rstrip("/")
    if keep is None and _PLAIN_DIR.match(key_dir):
        names = _canonical_children(data)
        if names is not None:  # the same bytes json.dumps would give for the same object
            prefix = key_dir.encode("ascii")
            return (_CANONICAL_HEAD + b", ".join(b'"%s": "%s/%s"' % (n, prefix, n) for n in names)
                    + _CANONICAL_TAIL)
    return _relocated_strict(data, key_dir, keep)


def _relocated_strict(data: bytes, key_dir: str, keep: set[str] | None) -> bytes:
    # Bounded and strict like every document of an artifact (cachebake.artifact.schema): no
    # duplicate keys, no deep nesting, {"child_paths": {name: path}} and nothing else.
    try:
        grp = jsonio.parse_json(data, "group file")
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
            new[name] = f"{key_dir}/{name}"
    grp["child_paths"] = new
    # Same shape Triton writes (json.dumps defaults), so a rewritten file reads like a native one.
    return json.dumps(grp).encode()
