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
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from cachebake.artifact import schema
from cachebake.roles import ROLE_ENV

MARKER = "install.json"


@dataclass(frozen=True)
class InstallMarker:
    """install.json: what an install put in its version directory, the one record a repeat
    install, ``verify`` and ``serve-args`` read back.  ``to_json`` is its one form;
    ``from_json`` reads it as what it is, a file in a volume others may write: every field the
    next install reads is checked (InvalidDocument naming the field), and the markers of every
    earlier cachebake read the same (no field was renamed)."""

    layer_digest: str
    target: str
    roles: tuple[str, ...]  # installed (left-out roles are not among them)
    serve_at: str
    artifact: str = ""
    installed_at: str = ""
    groups_relocated: int = 0
    relocated: Mapping[str, int] = field(default_factory=dict)  # role -> files rewritten
    left_out: Mapping[str, str] = field(default_factory=dict)  # role -> why it was not installed
    dirs: tuple[str, ...] = ()  # every directory made, in layer order
    files: Mapping[str, int] = field(default_factory=dict)  # every file -> its size as written
    # the seal: install.json's own ctime at creation, after the last file (module doc); 0 until
    # the marker is written (InstallDir's commit sets it)
    sealed_ctime_ns: int = 0
    # install --verify-key: {"digest", "key", "form"}: the manifest digest verified and the
    # fingerprint (sha256 of the DER public key) of the key that verified it; {} unverified
    signature: Mapping[str, str] = field(default_factory=dict)
    # the bake's warmup as `verify` runs it again by default (``warmup_of``): driver, model,
    # tp, serve_args, model_dir; empty for a command bake and in earlier cachebakes' markers
    warmup: Mapping = field(default_factory=dict)

    def to_json(self) -> dict:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("roles", "dirs"):
            doc[key] = list(doc[key])
        for key in ("relocated", "left_out", "files", "signature", "warmup"):
            doc[key] = dict(doc[key])
        return doc

    @classmethod
    def from_json(cls, doc, document: str = MARKER) -> "InstallMarker":
        c = schema.Checker(document)
        c.obj(doc)
        roles = schema.check_roles(c.get(doc, "roles", ""), c)
        dirs = c.array(c.get(doc, "dirs", ""), "dirs")
        for i, d in enumerate(dirs):
            _check_tree_name(c, c.string(d, f"dirs[{i}]"), f"dirs[{i}]", roles)
        files = c.obj(c.get(doc, "files", ""), "files")
        for i, (name, size) in enumerate(files.items()):
            _check_tree_name(c, name, f"files (key {i})", roles)
            c.integer(size, f"files.{name}", hi=1 << 64)
        relocated = c.obj(doc.get("relocated", {}), "relocated")
        for role, n in relocated.items():
            c.integer(n, f"relocated.{role}")
        left_out = c.str_map(doc.get("left_out", {}), "left_out")
        signature = c.str_map(doc.get("signature", {}), "signature")
        for role in left_out:  # serve-args prints the reasons, keyed by role
            if role not in ROLE_ENV:
                c.fail("left_out", f"{role!r}"[:80] + " is not a cache role: must map known cache roles to reasons")
        return cls(
            layer_digest=c.digest(c.get(doc, "layer_digest", ""), "layer_digest"),
            target=c.string(doc.get("target", ""), "target"),
            roles=tuple(roles),
            serve_at=c.string(c.get(doc, "serve_at", ""), "serve_at"),
            artifact=c.string(doc.get("artifact", ""), "artifact"),
            installed_at=c.string(doc.get("installed_at", ""), "installed_at", max_len=64),
            groups_relocated=c.integer(doc.get("groups_relocated", 0), "groups_relocated"),
            relocated=dict(relocated),
            left_out=dict(left_out),
            dirs=tuple(dirs),
            files=dict(files),
            sealed_ctime_ns=c.integer(c.get(doc, "sealed_ctime_ns", ""), "sealed_ctime_ns", hi=1 << 64),
            signature=dict(signature),
            warmup=_check_warmup(c, doc.get("warmup", {})),
        )


def _check_tree_name(c: "schema.Checker", name: str, field_name: str, roles) -> None:
    """A dir or file of the installed tree as install writes it: a normalized path relative to
    the version dir, inside one of its roles, no ``..``, no NUL or control character.  The
    names are stat'ed (``check_tree``) and printed: a forged marker names nothing outside."""
    first = name.split("/", 1)[0]
    if (not name or name.startswith("/") or ".." in name.split("/") or first not in roles
            or os.path.normpath(name) != name or not name.isprintable()):
        c.fail(field_name, f"{ascii(name)[1:-1][:80]} is not a path inside one of the install's roles")


# What `verify` takes from a bake to run its warmup again: the in-process drivers' options.
# A command bake's command line is not among them: a file in a shared volume does not choose
# what verify executes (give it after --).
WARMUP_DRIVERS = ("vllm", "kernels")
# A recipe name (`cachebake recipes`), never a path: install.json does not pick files to read.
_RECIPE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}(:[a-z0-9][a-z0-9._-]{0,63})?\Z")


def warmup_of(bake) -> dict:
    """The bake section's (artifact.manifest.BakeRecord) warmup for install.json: the driver,
    the model as ``--model`` takes it (the vllm driver records its recipe inside ``model``),
    and tp, serve args and model dir where the bake recorded them."""
    model = bake.model.get("recipe") if isinstance(bake.model, Mapping) else bake.model
    if bake.driver not in WARMUP_DRIVERS or not isinstance(model, str) or not _RECIPE_RE.match(model):
        return {}
    out = {"driver": bake.driver, "model": model}
    if bake.tp is not None:
        out["tp"] = bake.tp
    if bake.serve_args:
        out["serve_args"] = dict(bake.serve_args)
    if bake.driver == "vllm":  # the reference the bake served from: in torch.compile's key
        path = bake.model.get("path") if isinstance(bake.model, Mapping) else None
        model_dir = path if isinstance(path, str) and path else bake.model_dir
        if model_dir:
            out["model_dir"] = model_dir
    return out


def _check_warmup(c: "schema.Checker", value) -> dict:
    doc = c.obj(value, "warmup")
    if not doc:
        return {}
    if doc.get("driver") not in WARMUP_DRIVERS:
        c.fail("warmup.driver", f"must be one of {', '.join(WARMUP_DRIVERS)}")
    unknown = sorted(set(doc) - {"driver", "model", "tp", "serve_args", "model_dir"})
    if unknown:
        c.fail("warmup", f"unknown key {unknown[0]!r}"[:120])
    c.string(c.get(doc, "model", "warmup"), "warmup.model", pattern=_RECIPE_RE)
    c.opt_int(doc.get("tp"), "warmup.tp", lo=1, hi=1024)
    c.opt_str(doc.get("model_dir"), "warmup.model_dir", max_len=4096)
    if doc.get("serve_args") is not None:
        c.obj(doc["serve_args"], "warmup.serve_args")
    return dict(doc)


def check_tree(version_fd: int, marker: InstallMarker, limit: int = 20) -> list[str]:
    """What differs between the installed tree and the inventory install.json recorded: a
    missing or replaced directory, a missing file, one of another size, or one changed after
    the seal (a rewrite that kept the size still moves its ctime, which no user can set back)."""
    problems: list[str] = []
    for d in marker.dirs:
        try:
            st = os.stat(d, dir_fd=version_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                problems.append(f"{d}: no longer a directory")
        except OSError:
            problems.append(f"{d}: missing")
        if len(problems) >= limit:
            return problems
    sealed = marker.sealed_ctime_ns
    for name, size in marker.files.items():
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
