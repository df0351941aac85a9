"""A strict, forward-only reader of the tar inside a layer: only what ``cachebake pack`` writes.

Why not tarfile: its reader is the thing attackers aim at, and install needs stricter answers
than it gives, from a stream, one entry at a time:

* before CVE-2025-8194's fix (3.10-3.13 builds vary) a base-256 negative ``size``, in the
  header or a pax ``size`` record, walks tarfile backwards over the same bytes; here every
  numeric field must be plain octal and a pax header may not set ``size`` at all;
* tarfile treats a header with a bad checksum after the first one as the end of the archive
  and silently ignores the rest, where GNU tar skips it and extracts what follows: two readers,
  two trees.  Here a bad checksum is refused, and so is anything after the end-of-archive
  marker other than the zero padding a tar writer adds (two blocks plus one record);
* only the three header types the packer writes are accepted (POSIX ustar regular files and
  directories, and pax ``x`` headers carrying long paths); GNU long names, sparse files, links,
  devices, fifos, global pax headers and vendor records are refused, not interpreted.

Reading is in step with the extractor: ``members()`` yields one header at a time and the
caller consumes exactly that entry's data (``copy_to``/``read_exact``/``skip``) before asking
for the next, so nothing but the current block and chunk is ever held.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator
from zlib import adler32

from cachebake.errors import CorruptArtifact, UnsafeArtifact
from cachebake.install import refusals

BLOCK = 512
RECORD = 20 * BLOCK  # tar's default blocking factor: writers pad the archive to a record
MAX_TRAILER = 2 * BLOCK + RECORD  # end-of-archive marker + padding to the record
MAX_PAX = 64 << 10  # a path record is at most PATH_MAX; anything bigger is not ours
REGULAR, DIRECTORY, PAX = b"0", b"5", b"x"
# pax keys we accept and ignore (tarfile writes times/ids in pax form for odd values); "path"
# is the one we use.  "size" and "linkpath" would override the header: never accepted.
PAX_IGNORED = frozenset({"mtime", "atime", "ctime", "uid", "gid", "uname", "gname"})
_ZERO_IDS = b"0000000\x00" * 2
_NO_IDS = b"\x00" * 16
_USTAR = b"ustar\x0000"  # magic and version of a POSIX ustar header
_TYPE_ERRORS = {
    b"1": refusals.HardlinkError, b"2": refusals.SymlinkError, b"3": refusals.DeviceError,
    b"4": refusals.DeviceError, b"6": refusals.FifoError, b"S": refusals.SparseError,
}


class Truncated(CorruptArtifact):
    """The tar stream ended inside an entry or before its end-of-archive marker."""


@dataclass(slots=True)
class Header:
    name: str  # as written, minus a directory's trailing "/"
    isdir: bool
    size: int
    mode: int
    offset: int  # of the header block in the tar


class ChunkReader:
    """Exact reads over a source of chunks (``next_chunk() -> bytes``, b"" at the end)."""

    def __init__(self, next_chunk: Callable[[], bytes]):
        self._next = next_chunk
        self._buf = b""
        self._pos = 0
        self.offset = 0  # bytes consumed from the start of the tar

    def _fill(self) -> bool:
        chunk = self._next()
        if not chunk:
            return False
        self._buf, self._pos = chunk, 0
        return True

    def read_exact(self, n: int) -> bytes:
        pos = self._pos
        if pos + n <= len(self._buf):  # the common case: inside the current chunk
            self._pos = pos + n
            self.offset += n
            return self._buf[pos:pos + n]
        parts, need = [], n
        while need:
            if self._pos == len(self._buf) and not self._fill():
                raise Truncated(f"layer stream is damaged or truncated: it ends inside an entry "
                                f"(at byte {self.offset})")
            take = min(need, len(self._buf) - self._pos)
            parts.append(self._buf[self._pos:self._pos + take])
            self._pos += take
            self.offset += take
            need -= take
        return b"".join(parts)

    def take_views(self, n: int) -> list[memoryview]:
        """The next ``n`` bytes as views into the chunks, without copying (a file's data for
        the writer thread; the chunks are immutable and stay alive through the views)."""
        views = []
        while n:
            if self._pos == len(self._buf) and not self._fill():
                raise Truncated(f"layer stream is damaged or truncated: it ends inside an entry "
                                f"(at byte {self.offset})")
            take = min(n, len(self._buf) - self._pos)
            views.append(memoryview(self._buf)[self._pos:self._pos + take])
            self._pos += take
            self.offset += take
            n -= take
        return views

    def skip(self, n: int) -> None:
        pos = self._pos
        if pos + n <= len(self._buf):  # the common case: a block's padding, in this chunk
            self._pos = pos + n
            self.offset += n
            return
        while n:
            if self._pos == len(self._buf) and not self._fill():
                raise Truncated(f"layer stream is damaged or truncated: it ends inside an entry "
                                f"(at byte {self.offset})")
            take = min(n, len(self._buf) - self._pos)
            self._pos += take
            self.offset += take
            n -= take

    def drain_zeros(self, limit: int) -> int:
        """Consume the rest of the stream; it must be zeros, at most ``limit`` bytes."""
        seen = 0
        while True:
            rest = memoryview(self._buf)[self._pos:]
            if rest.nbytes:
                seen += rest.nbytes
                if seen > limit or rest.tobytes().count(0) != rest.nbytes:
                    raise UnsafeArtifact(
                        f"layer holds data after the tar's end-of-archive marker (at byte "
                        f"{self.offset}): another reader could extract it")
                self.offset += rest.nbytes
                self._pos = len(self._buf)
            if not self._fill():
                return seen


def _padding(size: int) -> int:
    return -size % BLOCK


_OCTAL = re.compile(rb" *([0-7]*)[ \x00]*\Z")
_seen_fields: dict[bytes, int] = {}  # a layer repeats its modes, ids and mtimes: parse each once


def _shown(raw_name: bytes, offset: int) -> str:
    """An entry's name for a message, before it could be decoded and checked."""
    return raw_name.decode("utf-8", "replace") or f"<header at byte {offset}>"


def _octal(field: bytes, what: str, raw_name: bytes, offset: int) -> int:
    """A plain octal number, space/NUL padded.  Base-256 (high bit set), signs, digits after
    a NUL and any other byte are refused: the packer never writes them, and readers disagree
    on them."""
    value = _seen_fields.get(field)
    if value is not None:
        return value
    m = _OCTAL.match(field)
    if m is None:
        name = _shown(raw_name, offset)
        if field[:1] and field[0] & 0x80:
            raise refusals.NumericFieldError(name, f"has a base-256 {what} field at byte {offset}")
        raise refusals.NumericFieldError(name, f"has a {what} field {field!r} that is not plain octal "
                                               f"(at byte {offset})")
    value = int(m.group(1) or b"0", 8)
    if len(_seen_fields) < 4096:
        _seen_fields[field] = value
    return value


def _decode(raw: bytes, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise refusals.BadNameError(raw.decode("utf-8", "replace"),
                                    f"is not a UTF-8 name (header at byte {offset})") from None


def _parse_pax(data: bytes, offset: int) -> dict[str, str]:
    """pax records ``"%d %s=%s\\n"``, strictly; only the keys in PAX_IGNORED and ``path``."""
    records: dict[str, str] = {}
    pos = 0
    where = f"<pax header at byte {offset}>"
    while pos < len(data):
        if data[pos:].strip(b"\x00") == b"":
            break  # NUL fill after the last record
        space = data.find(b" ", pos, pos + 12)
        length_text = data[pos:space] if space > 0 else b""
        if not length_text.isdigit():
            raise refusals.PaxRecordError(where, "has a malformed pax record length")
        length = int(length_text)
        record = data[pos:pos + length]
        if length <= space - pos + 1 or len(record) != length or not record.endswith(b"\n") \
                or b"=" not in record:
            raise refusals.PaxRecordError(where, "has a malformed pax record")
        key_b, _, value_b = record[space - pos + 1:-1].partition(b"=")
        try:
            key, value = key_b.decode("utf-8"), value_b.decode("utf-8")
        except UnicodeDecodeError:
            raise refusals.PaxRecordError(where, "has a pax record that is not UTF-8") from None
        if key != "path" and key not in PAX_IGNORED:
            raise refusals.PaxRecordError(where, f"has a pax {key!r} record; cachebake layers carry "
                                                 "only paths in pax headers")
        if key in records:
            raise refusals.PaxRecordError(where, f"sets pax {key!r} twice")
        records[key] = value
        pos += length
    return records


def _checksum(block: bytes) -> int:
    """The unsigned sum of the header with the checksum field read as spaces, as POSIX
    defines it (tarfile also accepts a signed sum; GNU tar warns; the packer writes the
    unsigned one).  Each 256-byte half sums to at most 65280, under Adler-32's modulus 65521,
    so the low half of ``zlib.adler32`` (1 + the sum) is the exact sum: C speed, where
    ``sum(block)`` iterates 512 Python ints (~1.4 us a header, ~2.5 ms an install)."""
    return ((adler32(block[:256]) & 0xFFFF) + (adler32(block[256:]) & 0xFFFF) - 2
            - sum(block[148:156]) + 8 * 32)


def members(reader: ChunkReader) -> Iterator[Header]:
    """Each entry's header, in order.  The caller consumes ``size`` bytes of data before the
    next iteration; this generator skips the padding to the block boundary itself.

    Runs once per entry on the extracting thread, the one that bounds an install
    (bench/install.md): the cache of parsed octal fields is read inline, and names the packer
    writes (ASCII, no ustar prefix) take the short way; messages are made only on refusal."""
    pax: dict[str, str] | None = None
    seen = _seen_fields
    while True:
        offset = reader.offset
        try:
            block = reader.read_exact(BLOCK)
        except Truncated:
            raise Truncated(f"layer stream is damaged or truncated: no end-of-archive marker "
                                  f"(at byte {offset})") from None
        if block.count(0) == BLOCK:
            if pax is not None:
                raise refusals.PaxRecordError(f"<pax header at byte {offset}>", "is not followed by an entry")
            trailer = BLOCK + reader.drain_zeros(MAX_TRAILER - BLOCK)
            if trailer < 2 * BLOCK:
                raise CorruptArtifact("layer tar ends with one zero block instead of the two of the "
                                      "end-of-archive marker")
            return
        raw_name = block[:100].split(b"\x00", 1)[0]
        stored = seen.get(block[148:156])
        if stored is None:
            stored = _octal(block[148:156], "checksum", raw_name, offset)
        if stored != _checksum(block):
            raise refusals.HeaderChecksumError(_shown(raw_name, offset), f"has a header whose checksum does not match "
                                                      f"(at byte {offset}): tarfile would stop reading "
                                                      "there while GNU tar skips it")
        if block[257:265] != _USTAR:
            raise refusals.HeaderFormatError(_shown(raw_name, offset), f"has a {block[257:265]!r} header, not POSIX ustar "
                                                    f"(at byte {offset})")
        kind = block[156:157]
        size = seen.get(block[124:136])
        if size is None:
            size = _octal(block[124:136], "size", raw_name, offset)
        mode = seen.get(block[100:108])
        if mode is None:
            mode = _octal(block[100:108], "mode", raw_name, offset)
        if block[108:124] != _ZERO_IDS:  # uid, gid: the packer writes 0 (fast path)
            _octal(block[108:116], "uid", raw_name, offset)
            _octal(block[116:124], "gid", raw_name, offset)
        if block[329:345] not in (_ZERO_IDS, _NO_IDS):  # devmajor, devminor
            _octal(block[329:337], "devmajor", raw_name, offset)
            _octal(block[337:345], "devminor", raw_name, offset)
        if block[136:148] not in seen:
            _octal(block[136:148], "mtime", raw_name, offset)
        if kind == PAX:
            if pax is not None:
                raise refusals.PaxRecordError(_shown(raw_name, offset),
                                              f"is a second pax header in a row (at byte {offset})")
            if size > MAX_PAX:
                raise refusals.PaxRecordError(_shown(raw_name, offset),
                                              f"is a {size}-byte pax header, over {MAX_PAX}")
            pax = _parse_pax(reader.read_exact(size), offset)
            reader.skip(_padding(size))
            continue
        if block[345] == 0:  # no ustar prefix: the short names the packer writes
            name_b = raw_name
        else:
            name_b = block[345:500].split(b"\x00", 1)[0] + b"/" + raw_name
        if pax is not None and "path" in pax:
            name = pax["path"]
        elif name_b.isascii():
            name = name_b.decode("ascii")
        else:
            name = _decode(name_b, offset)
        pax = None
        if kind != REGULAR and kind != DIRECTORY:
            error = _TYPE_ERRORS.get(kind, refusals.EntryTypeError)
            link = block[157:257].split(b"\x00", 1)[0].decode("utf-8", "replace")
            detail = {refusals.SymlinkError: f"is a symlink to {link!r}: layers never hold links",
                      refusals.HardlinkError: f"is a hard link to {link!r}: layers never hold links",
                      refusals.EntryTypeError: f"{error.reason} (tar type {kind!r})"}.get(error)
            raise error(name, detail)
        if block[157:257].count(0) != 100:
            raise refusals.EntryTypeError(name, "carries a link name: layers never hold links")
        isdir = kind == DIRECTORY
        if isdir:
            if size:
                raise refusals.EntryTypeError(name, f"is a directory with {size} bytes of data")
            if name.endswith("/"):
                name = name[:-1]
        yield Header(name, isdir, size, mode, offset)
        reader.skip(_padding(size))
