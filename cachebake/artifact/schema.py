"""Every JSON document an artifact carries, read with bounds and checked before it is used.

An artifact comes from a registry or a shared volume, so each document is hostile until it has
passed here: ``oci-layout``, ``index.json``, the image manifest, the image config and the bake
manifest in its ``dev.cachebake.manifest`` label, ``cachebake.json``, and Triton's group files
inside the layer (install's own ``install.json`` marker reuses the same reader).

Reading (``read_document``): regular files only, opened without following a link and without
blocking (a FIFO is refused after ``fstat``, never read), and at most a per-document cap of
bytes.  Parsing (``parse_json``): UTF-8 only, no duplicate keys (two parsers could pick
different values), no NaN/Infinity, and nesting no deeper than ``MAX_NESTING``: Python's json
raises RecursionError on deep input and our own code walks these documents recursively.

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

import itertools
import json
import math
import os
import re
import stat
from typing import Any

from cachebake.errors import BadInput, CorruptArtifact, InvalidDocument, Unsupported
from cachebake.roles import ROLE_ENV

FORMAT_VERSION = 1
MAX_NESTING = 32
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
MAX_LIST = 1_000_000

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TARGET_RE = re.compile(r"^(cuda:[0-9]{1,4}|hip:gfx[0-9a-z]{1,16})$")
# The layer media type pack writes (its one home), and the ones install reads.
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"
TAR_ZSTD_MEDIA_TYPES = (LAYER_MEDIA_TYPE,)


# ------------------------------------------------------------------------------ reading
def read_document(path: os.PathLike | str, document: str, cap: int, *, dir_fd: int | None = None,
                  missing: type[Exception] | None = CorruptArtifact) -> bytes:
    """The bytes of a regular file, at most ``cap`` of them; never follows a final symlink,
    never blocks on a FIFO.  ``missing``: the error class for a file that does not exist
    (None: raise FileNotFoundError for the caller to handle)."""
    fd = open_regular(path, document, dir_fd=dir_fd, missing=missing)
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            raise InvalidDocument(document, "", f"is {size} bytes, over the {cap} this reader accepts")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(cap + 1 - total, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:  # grew while we read it
                raise InvalidDocument(document, "", f"is over the {cap} bytes this reader accepts")
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_regular(path: os.PathLike | str, document: str, *, dir_fd: int | None = None,
                 missing: type[Exception] | None = CorruptArtifact) -> int:
    """An fd of the regular file at ``path``, opened O_NOFOLLOW|O_NONBLOCK and checked with
    fstat (lstat first would still race; the fstat of what was opened cannot).  O_NONBLOCK
    makes opening a FIFO return at once instead of waiting for a writer."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        if missing is None:
            raise
        raise missing(f"{document} is missing ({os.fspath(path)})") from None
    except OSError as e:
        if e.errno == 40:  # ELOOP: the final component is a symlink
            raise InvalidDocument(document, "", "is a symbolic link, not a regular file") from None
        raise BadInput(f"{os.fspath(path)}: cannot read {document}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InvalidDocument(document, "", f"is not a regular file ({_kind(st.st_mode)})")
    os.set_blocking(fd, True)
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


# ------------------------------------------------------------------------------ parsing
def _no_duplicates(document: str):
    def hook(pairs):
        obj = {}
        for k, v in pairs:
            if k in obj:
                raise InvalidDocument(document, k, "appears twice in one object")
            obj[k] = v
        return obj
    return hook


def _no_constant(document: str):
    def hook(name):
        raise InvalidDocument(document, "", f"holds {name}, which is not JSON")
    return hook


def strict_json(obj: Any) -> Any:
    """``obj`` with every NaN and infinity as its repr ("nan", "inf", "-inf"): what cachebake
    writes must pass ``parse_json``, which refuses them like every strict JSON reader (jq, Go,
    registries).  Real bakes hold them: vLLM's kernels take ``dt_max=inf`` and
    ``MASK_VALUE=-inf`` as constexprs, which the bake's events and manifest describe."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else repr(obj)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def dumps(obj: Any, **kw) -> str:
    """json.dumps for what cachebake writes: non-finite floats as strings (``strict_json``),
    and ``allow_nan=False`` so nothing else can slip one through."""
    return json.dumps(strict_json(obj), allow_nan=False, **kw)


_DECODERS: dict[str, json.JSONDecoder] = {}


def _decoder(document: str) -> json.JSONDecoder:
    """The strict decoder for ``document`` (its name is in the hooks' messages), made once:
    json.loads with hooks builds a new decoder on every call, and install parses one group
    file per kernel."""
    decoder = _DECODERS.get(document)
    if decoder is None:
        if len(_DECODERS) >= 256:  # names with digests in them: keep the cache bounded
            _DECODERS.clear()
        decoder = _DECODERS[document] = json.JSONDecoder(object_pairs_hook=_no_duplicates(document),
                                                         parse_constant=_no_constant(document))
    return decoder


def parse_json(data: bytes | str, document: str) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity, nesting <= MAX_NESTING."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidDocument(document, "", f"is not UTF-8 ({e.reason} at byte {e.start})") from None
    _check_nesting(raw, document)
    try:
        return _decoder(document).decode(data)
    except RecursionError:  # unreachable after _check_nesting; kept so no traceback escapes
        raise InvalidDocument(document, "", f"nests deeper than {MAX_NESTING} levels") from None
    except ValueError as e:  # JSONDecodeError, and int() over Python's digit limit
        if isinstance(e, InvalidDocument):
            raise
        raise InvalidDocument(document, "", f"is not valid JSON ({str(e).splitlines()[0]})") from None


# On the UTF-8 bytes: the four brackets are ASCII, which UTF-8 never uses inside a multi-byte
# character, and bytes.translate deletes everything else in one C pass.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_INNERMOST = re.compile(rb"[\[{][\]}]")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _check_nesting(raw: bytes, document: str) -> None:
    """Refuse nesting past MAX_NESTING before json.loads sees it (strings skipped)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_NESTING:
        return  # cannot be deeper than its number of openers
    # Brackets inside strings count too at first: an over-estimate, exact enough for every
    # document cachebake writes; strings are stripped only when it is over the limit.
    brackets = raw.translate(None, _NOT_BRACKETS)
    if _shallow(brackets) or _depth(brackets) <= MAX_NESTING:
        return
    if _depth(_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)) > MAX_NESTING:
        raise InvalidDocument(document, "", f"nests deeper than {MAX_NESTING} levels")


def _shallow(brackets: bytes) -> bool:
    """True if removing innermost pairs MAX_NESTING times leaves nothing: the document is no
    deeper than that.  A few regex passes where ``_depth`` walks every bracket in Python
    (install.json's inventory has thousands); False only means "ask ``_depth``"."""
    for _ in range(MAX_NESTING):
        if not brackets:
            return True
        shorter = _INNERMOST.sub(b"", brackets)
        if len(shorter) == len(brackets):
            return False  # unbalanced: let _depth say
        brackets = shorter
    return not brackets


def _depth(brackets: bytes) -> int:
    return max(itertools.accumulate(_STEP[c] for c in brackets), default=0)


def load_document(path, document: str, cap: int, **kw) -> Any:
    return parse_json(read_document(path, document, cap, **kw), document)


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

    def string(self, value, field: str, *, pattern: re.Pattern | None = None, max_len: int = 4096,
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
    return repr(value if len(value) <= 60 else value[:57] + "...")


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
    if len(children) > 4096:
        c.fail("child_paths", f"names {len(children)} children, over 4096")
    for name, path in children.items():
        # the common case tested inline: the field name is built only for a message (install
        # checks one group file per kernel)
        if not (isinstance(path, str) and len(path) <= 4096 and "\x00" not in path):
            c.string(path, f"child_paths.{name}")
    extra = set(doc) - {"child_paths"}
    if extra:
        c.fail(sorted(extra)[0], "is not a key Triton writes in a group file")
    return children
