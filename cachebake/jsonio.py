"""JSON documents in and out of cachebake, hostile on the way in, strict on the way out.

Reading (``read_document``): regular files only, opened without following a link and without
blocking (a FIFO is refused after ``fstat``, never read), and at most a per-document cap of
bytes.  Parsing (``parse_json``): UTF-8 only (no unpaired ``\\uD800`` escape either), no
duplicate keys (two parsers could pick different values), no NaN/Infinity, and nesting no
deeper than ``MAX_NESTING``: Python's json raises RecursionError on deep input and our own
code walks these documents recursively.
Writing (``dumps``): what cachebake writes passes that reader (non-finite floats become
strings), since registries, jq and Go refuse NaN and Infinity too.  A document written to a
file the user names goes through ``write_json_atomic``: whole or not at all, 0644.

The checks of each document's fields are cachebake.artifact.schema's; ``canonical_json`` is
the one byte form every blob and record is written in.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import stat
import tempfile
from typing import Any

from cachebake.errors import BadInput, CorruptArtifact, InvalidDocument, from_os_error
from cachebake.fsops import read_at_most, write_all

MAX_NESTING = 32


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
        data = read_at_most(fd, cap + 1)
        if len(data) > cap:  # grew while we read it
            raise InvalidDocument(document, "", f"is over the {cap} bytes this reader accepts")
        return data
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


def canonical_json(obj: Any) -> bytes:
    """The one byte form of a document: sorted keys, no spaces, strict (``dumps``); equal
    documents are equal blobs, with equal digests."""
    return dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_json_atomic(path: os.PathLike | str, doc: Any) -> None:
    """``doc`` as strict JSON (``dumps``, indented, sorted keys) at ``path``: the whole document
    or nothing, whatever kills the writer, since readers (an installer in another container, a
    script) may read it at any moment.  ``write_atomic`` has the rules."""
    write_atomic(path, (dumps(doc, indent=2, sort_keys=True) + "\n").encode())


def write_atomic(path: os.PathLike | str, data: bytes, *, sync: bool = True) -> None:
    """``data`` at ``path``, whole or not at all: written to a new temp file beside it (a
    random name, O_EXCL: nobody else's file is ever opened), synced unless ``sync`` is False,
    then renamed over ``path`` (a reader sees the old file or the new one).  Mode 0644 whatever
    the umask: another user (the server, an init container) reads it.  The parent directory is
    created.  Any OSError is BadInput naming ``path``, never the temp name; the temp file is
    removed on any failure, Ctrl-C included."""
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    try:
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    except FileExistsError:  # from makedirs: a component of the parent is not a directory
        raise BadInput(f"{path}: cannot write: {parent} is not a directory") from None
    except OSError as e:
        raise from_os_error(e, path, "cannot write") from None
    try:
        try:
            os.fchmod(fd, 0o644)
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise from_os_error(e, path, "cannot write") from None
        raise


def parse_json(data: bytes | str, document: str, *, allow_non_finite: bool = False) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity, nesting <= MAX_NESTING.

    ``allow_non_finite``: NaN and Infinity read as floats, for the one kind of file that holds
    them by design: Triton's own cache metadata (its autotuner writes a failed config's time
    as Infinity), read when a cache is packed."""
    if isinstance(data, bytes):
        raw = data
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidDocument(document, "", f"is not UTF-8 ({e.reason} at byte {e.start})") from None
    else:
        raw = data.encode("utf-8", "surrogatepass")
    _check_nesting(raw, document)
    try:
        doc = json.loads(data, object_pairs_hook=_no_duplicates(document),
                         parse_constant=float if allow_non_finite else _no_constant(document))
        if _SURROGATE_ESCAPE.search(raw):  # rare: only then is every string walked
            _check_no_lone_surrogate(doc, document)
        return doc
    except RecursionError:  # unreachable after _check_nesting; kept so no traceback escapes
        raise InvalidDocument(document, "", f"nests deeper than {MAX_NESTING} levels") from None
    except ValueError as e:  # JSONDecodeError, and int() over Python's digit limit
        if isinstance(e, InvalidDocument):
            raise
        raise InvalidDocument(document, "", f"is not valid JSON ({str(e).splitlines()[0]})") from None


# A \uD800-\uDFFF escape: json.loads turns an unpaired one into a lone surrogate, a str that
# no UTF-8 stream (a terminal, a file, --json) can encode; a valid document never holds one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_no_lone_surrogate(value: Any, document: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidDocument(document, "", "holds an unpaired UTF-16 surrogate (\\uD800-\\uDFFF), "
                                  "which is no Unicode character") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_no_lone_surrogate(k, document)
            _check_no_lone_surrogate(v, document)
    elif isinstance(value, list):
        for v in value:
            _check_no_lone_surrogate(v, document)


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
