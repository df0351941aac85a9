"""Every JSON document an artifact carries, read with bounds and checked before it is used.

An artifact comes from a registry or a shared volume, so each document is hostile until it has
passed here: ``oci-layout``, ``index.json``, the image manifest, the image config and the bake
manifest in its ``dev.cachebake.manifest`` label, ``cachebake.json``, and Triton's group files
inside the layer (install's own ``install.json`` marker reuses the same reader).

Reading, parsing and writing are cachebake.jsonio's (bounded reads of regular
files, strict JSON both ways); its functions are re-exported here, where every caller that
checks a document already looks.

Checking (``Checker``): types (an ``int`` field refuses ``true``, which Python treats as 1),
ranges, patterns and the known role names.  Every refusal is
``InvalidDocument(document, field, reason)``, exit 5, naming the document and the JSON path;
an unknown ``format_version`` is ``Unsupported`` (exit 7) because a newer cachebake may
write it.  Unknown keys are ignored where the OCI spec says readers must ignore them.

Hand-written rather than jsonschema: the checks that matter here (bounded reads, nesting,
duplicate keys, one error line per document and field) are outside what jsonschema does, and
it would add four packages, one a compiled extension, to the init-container image for ~100
lines of type checks.
"""

from __future__ import annotations

import re

from cachebake.errors import InvalidDocument, Unsupported
from cachebake.errors import shorten
from cachebake.roles import ROLE_ENV

FORMAT_VERSION = 1
KiB, MiB = 1 << 10, 1 << 20
# Per-document caps.  OCI registries refuse manifests over 4 MiB; a config carries the bake
# manifest, whose inventory grows with the kernel count (~200 bytes a kernel).
CAP_LAYOUT_MARKER = 4 * KiB
CAP_INDEX = 4 * MiB
CAP_IMAGE_MANIFEST = 4 * MiB
CAP_CONFIG = 32 * MiB
CAP_SUMMARY = 64 * MiB  # cachebake.json: every target's manifest
CAP_GROUP_FILE = 1 * MiB  # Triton writes a few hundred bytes
CAP_FINGERPRINT = 1 * MiB
CAP_BLOB = 64 * MiB  # any other JSON blob an artifact carries (the compile record)
MAX_DESCRIPTORS = 4096
MAX_STRING = 4096  # characters of a string field, unless a check says otherwise
MAX_GROUP_CHILDREN = 4096  # files one Triton group file may name
MAX_LIST = 1_000_000

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TARGET_RE = re.compile(r"^(cuda:[0-9]{1,4}|hip:gfx[0-9a-z]{1,16})$")
# The layer media type pack writes (its one home), and the ones install reads.
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"
TAR_ZSTD_MEDIA_TYPES = (LAYER_MEDIA_TYPE,)


# ------------------------------------------------------------------------------ checking
class Checker:
    """Type and range checks on one parsed document; every refusal names document + field."""

    def __init__(self, document: str):
        self.document = document

    def fail(self, field: str, reason: str):
        raise InvalidDocument(self.document, field, reason)

    def obj(self, value, field: str = "") -> dict:
        if not isinstance(value, dict):
            self.fail(field, f"must be an object, not {_json_type(value)}")
        return value

    def get(self, parent: dict, key: str, field: str, *, required: bool = True):
        if key not in parent:
            if required:
                self.fail(_join(field, key), "is missing")
            return None
        return parent[key]

    def string(self, value, field: str, *, pattern: re.Pattern | None = None, max_len: int = MAX_STRING,
               allow_empty: bool = True) -> str:
        if not isinstance(value, str):
            self.fail(field, f"must be a string, not {_json_type(value)}")
        if len(value) > max_len:
            self.fail(field, f"is {len(value)} characters long, over {max_len}")
        if not allow_empty and not value:
            self.fail(field, "must not be empty")
        if "\x00" in value:
            self.fail(field, "holds a NUL character")
        if pattern is not None and not pattern.match(value):
            self.fail(field, f"{_short(value)} is not of the form {pattern.pattern}")
        return value

    def integer(self, value, field: str, *, lo: int = 0, hi: int = 1 << 62) -> int:
        # bool is an int subclass in Python: `true` must not pass as 1
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, f"must be an integer, not {_json_type(value)}")
        if not lo <= value <= hi:
            self.fail(field, f"{value} is out of range [{lo}, {hi}]")
        return value

    def opt_int(self, value, field: str, **kw) -> int | None:
        return None if value is None else self.integer(value, field, **kw)

    def opt_str(self, value, field: str, **kw) -> str | None:
        return None if value is None else self.string(value, field, **kw)

    def array(self, value, field: str, *, max_len: int = MAX_LIST) -> list:
        if not isinstance(value, list):
            self.fail(field, f"must be an array, not {_json_type(value)}")
        if len(value) > max_len:
            self.fail(field, f"has {len(value)} items, over {max_len}")
        return value

    def str_map(self, value, field: str, *, max_len: int = 1 << 20) -> dict[str, str]:
        for k, v in self.obj(value, field).items():
            self.string(v, _join(field, k), max_len=max_len)
        return value

    def digest(self, value, field: str) -> str:
        return self.string(value, field, pattern=DIGEST_RE)

    def descriptor(self, value, field: str, *, cap: int | None = None) -> dict:
        """An OCI content descriptor: mediaType, digest, size (+ optional annotations)."""
        d = self.obj(value, field)
        self.string(self.get(d, "mediaType", field), _join(field, "mediaType"), max_len=255)
        self.digest(self.get(d, "digest", field), _join(field, "digest"))
        self.integer(self.get(d, "size", field), _join(field, "size"), hi=cap if cap is not None else 1 << 62)
        if "annotations" in d:
            self.str_map(d["annotations"], _join(field, "annotations"))
        return d


def _join(field: str, key) -> str:
    if isinstance(key, int):
        return f"{field}[{key}]"
    return f"{field}.{key}" if field else str(key)


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def _short(value: str) -> str:
    return repr(shorten(value, 60))


# ------------------------------------------------------------------------------ documents
def check_layout_marker(doc, document: str = "oci-layout") -> None:
    c = Checker(document)
    version = c.get(c.obj(doc), "imageLayoutVersion", "")
    c.string(version, "imageLayoutVersion", max_len=32)
    if version != "1.0.0":
        raise Unsupported(f"{document}: OCI layout version {version!r} is not supported (1.0.0)")


def check_index(doc, document: str = "index.json") -> dict:
    c = Checker(document)
    c.obj(doc)
    c.integer(c.get(doc, "schemaVersion", ""), "schemaVersion", lo=2, hi=2)
    if "mediaType" in doc:
        c.string(doc["mediaType"], "mediaType", max_len=255)
    for i, m in enumerate(c.array(c.get(doc, "manifests", ""), "manifests", max_len=MAX_DESCRIPTORS)):
        c.descriptor(m, f"manifests[{i}]")
    if "annotations" in doc:
        c.str_map(doc["annotations"], "annotations")
    return doc


def check_image_manifest(doc, document: str) -> dict:
    c = Checker(document)
    c.obj(doc)
    c.integer(c.get(doc, "schemaVersion", ""), "schemaVersion", lo=2, hi=2)
    if "mediaType" in doc:
        c.string(doc["mediaType"], "mediaType", max_len=255)
    c.descriptor(c.get(doc, "config", ""), "config", cap=CAP_CONFIG)
    layers = c.array(c.get(doc, "layers", ""), "layers", max_len=MAX_DESCRIPTORS)
    if len(layers) != 1:
        c.fail("layers", f"has {len(layers)} layers; cachebake images have exactly one")
    c.descriptor(layers[0], "layers[0]")
    if "annotations" in doc:
        c.str_map(doc["annotations"], "annotations")
    return doc


def check_config(doc, document: str, label: str) -> str:
    """The image config; returns the bake-manifest label's text (checked by the caller)."""
    c = Checker(document)
    c.obj(doc)
    cfg = c.obj(c.get(doc, "config", ""), "config")
    labels = c.str_map(c.get(cfg, "Labels", "config"), "config.Labels", max_len=CAP_CONFIG)
    return c.get(labels, label, "config.Labels")


def check_format_version(doc: dict, c: Checker, field: str = "format_version") -> None:
    version = c.get(doc, "format_version", field.rpartition(".")[0])
    if isinstance(version, bool) or not isinstance(version, int):
        c.fail(field, f"must be an integer, not {_json_type(version)}")
    if version != FORMAT_VERSION:
        raise Unsupported(f"{c.document}: manifest format version {version!r} is not supported "
                          f"(this cachebake reads version {FORMAT_VERSION})")


def check_roles(value, c: Checker, field: str = "roles") -> list[str]:
    roles = c.array(value, field, max_len=len(ROLE_ENV))
    if not roles:
        c.fail(field, "is empty: a bake holds at least one role")
    for i, r in enumerate(roles):
        c.string(r, f"{field}[{i}]", max_len=64)
        if r not in ROLE_ENV:
            c.fail(f"{field}[{i}]", f"{_short(r)} is not a cache role (known: {', '.join(ROLE_ENV)})")
    if len(set(roles)) != len(roles):
        c.fail(field, "names a role twice")
    return roles


def check_bake_manifest(doc, document: str, *, prefix: str = "") -> dict:
    """One target's bake manifest (the config label, or an entry of cachebake.json)."""
    c = Checker(document)
    p = prefix
    c.obj(doc, p)
    check_format_version(doc, c, _join(p, "format_version"))
    target = c.string(c.get(doc, "target", p), _join(p, "target"), pattern=TARGET_RE)
    fp = c.obj(c.get(doc, "fingerprint", p), _join(p, "fingerprint"))
    fpf = _join(p, "fingerprint")
    c.string(c.get(fp, "target", fpf), _join(fpf, "target"), pattern=TARGET_RE)
    if fp["target"] != target:
        c.fail(_join(fpf, "target"), f"{fp['target']!r} differs from the manifest's target {target!r}")
    for key in ("triton_version", "triton_key", "python_tag", "ptxas", "gpu_name", "torch_version",
                "vllm_version"):
        if key in fp:
            c.opt_str(fp[key], _join(fpf, key), max_len=64 * KiB)
    for key in ("env", "bake_paths"):
        if key in fp:
            c.str_map(fp[key], _join(fpf, key), max_len=64 * KiB)
    check_roles(c.get(doc, "roles", p), c, _join(p, "roles"))
    root = c.string(c.get(doc, "layer_root", p), _join(p, "layer_root"), max_len=4000)
    if not root.startswith("/"):
        c.fail(_join(p, "layer_root"), "must be an absolute path")
    check_layer_facts(c.get(doc, "layer", p), c, _join(p, "layer"))
    inv_field = _join(p, "inventory")
    inv = c.obj(c.get(doc, "inventory", p), inv_field)
    for i, k in enumerate(c.array(c.get(inv, "kernels", inv_field), _join(inv_field, "kernels"))):
        f = f"{inv_field}.kernels[{i}]"
        c.obj(k, f)
        for key in ("name", "key_dir", "target"):
            c.string(c.get(k, key, f), _join(f, key))
        for key in ("num_warps", "num_stages", "shared"):
            c.opt_int(k.get(key), _join(f, key))
    for i, a in enumerate(c.array(c.get(inv, "autotune", inv_field), _join(inv_field, "autotune"))):
        f = f"{inv_field}.autotune[{i}]"
        c.obj(a, f)
        c.string(c.get(a, "kernel", f), _join(f, "kernel"))
        c.string(c.get(a, "key_dir", f), _join(f, "key_dir"))
        c.array(c.get(a, "tuning_key", f), _join(f, "tuning_key"))
        c.integer(c.get(a, "configs", f), _join(f, "configs"))
        if a.get("best") is not None:
            c.obj(a["best"], _join(f, "best"))
    for i, h in enumerate(c.array(c.get(inv, "helpers", inv_field), _join(inv_field, "helpers"))):
        f = f"{inv_field}.helpers[{i}]"
        c.obj(h, f)
        c.string(c.get(h, "name", f), _join(f, "name"))
        c.string(c.get(h, "key_dir", f), _join(f, "key_dir"))
    for i, d in enumerate(c.array(c.get(inv, "dropped", inv_field), _join(inv_field, "dropped"))):
        c.obj(d, f"{inv_field}.dropped[{i}]")
    for role, n in c.obj(c.get(inv, "other_files", inv_field), _join(inv_field, "other_files")).items():
        c.integer(n, f"{inv_field}.other_files.{role}")
    if doc.get("bake") is not None:
        c.obj(doc["bake"], _join(p, "bake"))
    if doc.get("record") is not None:  # the compile record's blob (cachebake.replay), if any
        c.descriptor(doc["record"], _join(p, "record"))
    return doc


def check_layer_facts(value, c: Checker, field: str) -> dict:
    layer = c.obj(value, field)
    media = c.string(c.get(layer, "media_type", field), _join(field, "media_type"), max_len=255)
    if media not in TAR_ZSTD_MEDIA_TYPES:
        raise Unsupported(f"{c.document}: {_join(field, 'media_type')}: {media!r} is not a tar+zstd layer")
    c.digest(c.get(layer, "digest", field), _join(field, "digest"))
    c.digest(c.get(layer, "diff_id", field), _join(field, "diff_id"))
    size = c.integer(c.get(layer, "size", field), _join(field, "size"), lo=1)
    tar_size = c.integer(c.get(layer, "tar_size", field), _join(field, "tar_size"), lo=1024)
    if tar_size % 512:
        c.fail(_join(field, "tar_size"), f"{tar_size} is not a whole number of 512-byte tar blocks")
    data = c.integer(c.get(layer, "uncompressed_size", field), _join(field, "uncompressed_size"), hi=tar_size)
    entries = c.integer(c.get(layer, "entries", field), _join(field, "entries"), lo=1, hi=tar_size // 512)
    c.integer(c.get(layer, "files", field), _join(field, "files"), hi=entries)
    c.string(c.get(layer, "compression", field), _join(field, "compression"), max_len=255)
    del size, data
    return layer


def check_summary(doc, document: str = "cachebake.json") -> dict[str, dict]:
    """``cachebake.json``: format_version + one bake manifest per target."""
    c = Checker(document)
    c.obj(doc)
    check_format_version(doc, c)
    bakes = c.obj(c.get(doc, "bakes", ""), "bakes")
    if len(bakes) > MAX_DESCRIPTORS:
        c.fail("bakes", f"has {len(bakes)} targets, over {MAX_DESCRIPTORS}")
    for target, bake in bakes.items():
        c.string(target, "bakes", pattern=TARGET_RE)
        f = f"bakes.{target}"
        check_bake_manifest(bake, document, prefix=f)
        if bake["target"] != target:
            c.fail(f"{f}.target", f"{bake['target']!r} is filed under {target!r}")
        if "image_manifest_digest" in bake:
            c.digest(bake["image_manifest_digest"], f"{f}.image_manifest_digest")
    return bakes


def check_group(doc, document: str) -> dict[str, str]:
    """A Triton group file: {"child_paths": {file name: absolute path}} and nothing else."""
    c = Checker(document)
    c.obj(doc)
    children = c.obj(c.get(doc, "child_paths", ""), "child_paths")
    if len(children) > MAX_GROUP_CHILDREN:
        c.fail("child_paths", f"names {len(children)} children, over {MAX_GROUP_CHILDREN}")
    for name, path in children.items():
        c.string(path, f"child_paths.{name}")
    extra = set(doc) - {"child_paths"}
    if extra:
        c.fail(sorted(extra)[0], "is not a key Triton writes in a group file")
    return children
