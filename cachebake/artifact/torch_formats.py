"""Rewrite text strings inside torch's binary cache formats, without torch.

Two formats, both found in Inductor's and vLLM's caches (artifact/torch_paths.py says where):

* pickles (protocol 2-5), rewritten opcode by opcode with ``pickletools``, never unpickled:
  each string opcode whose text changes is re-emitted with its new length (switching between
  the short and long forms where needed) and protocol-4 frames are rebuilt around the same
  opcodes, so rewriting there and back gives the original bytes;
* torch's length-prefixed containers (``torch.utils._appending_byte_serializer``: a CRC32,
  then u64 big-endian lengths): ``CompiledArtifact.save``'s files and the cache artifacts they
  hold, rewritten field by field with lengths and checksums recomputed.

Bytes inside either are rewritten recursively when they are themselves a pickle or a container,
and otherwise left as they are (counted as ``opaque``).  The text itself is rewritten by the
caller's ``paths`` (torch_paths.PathMap: ``fix_text``, ``mentions_old``, ``old_bytes``).
"""

from __future__ import annotations

import base64
import binascii
import io
import pickletools
import struct
import zlib
from dataclasses import dataclass, field
from typing import Protocol

MAX_NESTING = 8


class Paths(Protocol):
    """What the rewriters need of the path mapping (torch_paths.PathMap)."""

    old_bytes: list[bytes]

    def fix_text(self, text: str, counts: "Counts") -> str: ...

    def mentions_old(self, data: bytes) -> bool: ...


class NotRelocatable(ValueError):
    """A file names a root in a way this module cannot rewrite safely."""


@dataclass
class Counts:
    """What one rewrite did: string occurrences rewritten, and occurrences left inside opaque
    bytes (Triton IR/cubin debug locations)."""

    rewritten: int = 0
    opaque: int = 0
    foreign: set[str] = field(default_factory=set)  # absolute roots named but not mapped

    def add(self, other: "Counts") -> None:
        self.rewritten += other.rewritten
        self.opaque += other.opaque
        self.foreign |= other.foreign



# -- pickles -------------------------------------------------------------------------------

_UNICODE_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_BYTES_OPS = {"SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BYTEARRAY8"}
_LEGACY_STRING_OPS = {"SHORT_BINSTRING", "BINSTRING", "STRING"}


def is_pickle(data: bytes) -> bool:
    return len(data) > 2 and data[0] == 0x80 and 2 <= data[1] <= 5


def _encode_unicode(op: str, text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    if op == "SHORT_BINUNICODE":
        if len(raw) < 256:
            return b"\x8c" + bytes([len(raw)]) + raw
        op = "BINUNICODE"  # protocol 4 has both; a longer string takes the long form
    if op == "BINUNICODE":
        if len(raw) >= 1 << 32:
            return b"\x8d" + struct.pack("<Q", len(raw)) + raw
        return b"X" + struct.pack("<I", len(raw)) + raw
    if op == "BINUNICODE8":
        return b"\x8d" + struct.pack("<Q", len(raw)) + raw
    # UNICODE (protocol 0): raw-unicode-escape, escaped as CPython's pickler does
    esc = (text.replace("\\", "\\u005c").replace("\0", "\\u0000").replace("\n", "\\u000a")
           .replace("\r", "\\u000d").replace("\x1a", "\\u001a"))
    return b"V" + esc.encode("raw-unicode-escape") + b"\n"


def _encode_bytes(op: str, data: bytes) -> bytes:
    if op == "SHORT_BINBYTES":
        if len(data) < 256:
            return b"C" + bytes([len(data)]) + data
        op = "BINBYTES"
    if op == "BINBYTES" and len(data) < 1 << 32:
        return b"B" + struct.pack("<I", len(data)) + data
    if op == "BYTEARRAY8":
        return b"\x96" + struct.pack("<Q", len(data)) + data
    return b"\x8e" + struct.pack("<Q", len(data)) + data


def _ops(data: bytes):
    """(opcode name, arg, start, end) of every opcode; raises NotRelocatable if ``data`` is not
    exactly one well-formed pickle."""
    try:
        ops = list(pickletools.genops(io.BytesIO(data)))
    except Exception as e:  # pickletools raises ValueError, struct.error, UnicodeDecodeError...
        raise NotRelocatable(f"not a readable pickle: {e}") from None
    if not ops or ops[-1][0].name != "STOP" or ops[-1][2] + 1 != len(data):
        raise NotRelocatable("not a single complete pickle (data after STOP)")
    for i, (op, arg, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else pos + 1
        yield op.name, arg, pos, end


def relocate_pickle(data: bytes, pm: Paths, depth: int = 0) -> tuple[bytes, Counts]:
    """Rewrite every text string of the pickle ``data`` (and of pickles/containers nested in its
    bytes) through ``pm``; returns ``data`` itself when nothing changed.

    Protocol-4 frames keep the opcodes they held, with their lengths recomputed (opcodes the
    pickler wrote outside any frame, large strings, stay outside), so rewriting there and
    back gives the original bytes."""
    counts = Counts()
    segments: list[tuple[bool, list[bytes]]] = []  # (framed, opcodes), FRAME headers dropped
    frame_end = -1
    changed = False
    for name, arg, start, end in _ops(data):
        if name == "FRAME":
            if start < frame_end:
                raise NotRelocatable("a pickle frame starts inside another")
            frame_end = end + arg
            segments.append((True, []))
            continue
        framed = start < frame_end
        if framed and end > frame_end:
            raise NotRelocatable("a pickle opcode straddles a frame boundary")
        if not segments or segments[-1][0] != framed:
            segments.append((framed, []))
        raw = data[start:end]
        if name in _UNICODE_OPS:
            new = pm.fix_text(arg, counts)
            if new != arg:
                raw, changed = _encode_unicode(name, new), True
        elif name in _BYTES_OPS:
            blob = bytes(arg)
            new_b, sub = relocate_blob(blob, pm, depth + 1)
            counts.add(sub)
            if new_b is not blob:
                raw, changed = _encode_bytes(name, new_b), True
        elif name in _LEGACY_STRING_OPS and isinstance(arg, (str, bytes)):
            text = arg if isinstance(arg, str) else arg.decode("latin-1")
            if pm.mentions_old(text.encode("utf-8", "surrogatepass")):
                raise NotRelocatable(f"a protocol-0/1 string ({name}) names an old root")
        segments[-1][1].append(raw)
    if not changed:
        return data, counts
    out = bytearray()
    for framed, chunks in segments:
        body = b"".join(chunks)
        if framed:
            out += b"\x95" + struct.pack("<Q", len(body))
        out += body
    return bytes(out), counts


# -- torch's length-prefixed containers ----------------------------------------------------

CACHE_HEADER = b"CacheCompiledArtifact"  # torch._inductor.standalone_compile
AOT_HEADER = b"AOTCompiledArtifact"


class _Reader:
    def __init__(self, data: bytes):
        if len(data) < 4 or zlib.crc32(data[4:]).to_bytes(4, "big") != data[:4]:
            raise NotRelocatable("not a checksummed torch container")
        self.data, self.i = data, 4

    def u64(self) -> int:
        if self.i + 8 > len(self.data):
            raise NotRelocatable("torch container ends inside a length")
        v = int.from_bytes(self.data[self.i:self.i + 8], "big")
        self.i += 8
        return v

    def field(self) -> bytes:
        n = self.u64()
        if self.i + n > len(self.data):
            raise NotRelocatable("torch container field runs past its end")
        v = self.data[self.i:self.i + n]
        self.i += n
        return v

    def text(self) -> str:
        try:
            return base64.b64decode(self.field(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as e:
            raise NotRelocatable(f"torch container string is not base64 UTF-8: {e}") from None

    @property
    def done(self) -> bool:
        return self.i == len(self.data)


class _Writer:
    def __init__(self):
        self.out = bytearray(4)

    def u64(self, v: int) -> None:
        self.out += v.to_bytes(8, "big")

    def field(self, b: bytes) -> None:
        self.u64(len(b))
        self.out += b

    def text(self, s: str) -> None:
        self.field(base64.b64encode(s.encode("utf-8")))

    def bytes(self) -> bytes:
        self.out[:4] = zlib.crc32(self.out[4:]).to_bytes(4, "big")
        return bytes(self.out)


def is_container(data: bytes) -> bool:
    return len(data) >= 12 and zlib.crc32(data[4:]).to_bytes(4, "big") == data[:4]


def relocate_container(data: bytes, pm: Paths, depth: int = 0) -> tuple[bytes, Counts]:
    """A ``CompiledArtifact.save`` file (``CacheCompiledArtifact``: torch key, key, the cache
    artifacts; ``AOTCompiledArtifact``: torch key, a pickle) or the cache artifacts themselves
    (``AppendingByteSerializer``: version, then per type: count, (key, content)...)."""
    r = _Reader(data)
    n = int.from_bytes(data[4:12], "big")
    if data[12:12 + n] not in (CACHE_HEADER, AOT_HEADER):
        if n != 1:  # the cache artifacts' encoding version
            raise NotRelocatable("unknown torch container")
        return _relocate_cache_artifacts(r, pm, depth)
    header = r.field()
    w = _Writer()
    w.field(header)
    counts = Counts()
    if header == CACHE_HEADER:
        w.field(r.field())  # torch_key: must match the serving torch, never a path
        key = r.text()
        if pm.mentions_old(key.encode()):
            raise NotRelocatable("a cache key names an old root")
        w.text(key)
        new, counts = relocate_blob(r.field(), pm, depth + 1)
        w.field(new)
    else:  # AOT_HEADER
        w.field(r.field())
        new, counts = relocate_blob(r.field(), pm, depth + 1)
        w.field(new)
    if not r.done:
        raise NotRelocatable("torch container has data after its last field")
    if counts.rewritten == 0:
        return data, counts
    return w.bytes(), counts


def _relocate_cache_artifacts(r: _Reader, pm: Paths, depth: int) -> tuple[bytes, Counts]:
    w = _Writer()
    w.u64(r.u64())
    counts = Counts()
    while not r.done:
        kind = r.text()
        w.text(kind)
        n = r.u64()
        w.u64(n)
        for _ in range(n):
            key = r.text()
            if pm.mentions_old(key.encode()):
                raise NotRelocatable(f"a {kind} cache key names an old root")
            w.text(key)
            new, sub = relocate_blob(r.field(), pm, depth + 1)
            counts.add(sub)
            w.field(new)
    if counts.rewritten == 0:
        return r.data, counts
    return w.bytes(), counts


# -- dispatch ------------------------------------------------------------------------------

def relocate_blob(data: bytes, pm: Paths, depth: int = 0) -> tuple[bytes, Counts]:
    """Bytes nested in a pickle or container: rewrite them if they are a pickle or a torch
    container, else leave them and count what they still name (debug info, see above)."""
    if depth > MAX_NESTING:
        raise NotRelocatable("pickles nested too deep")
    for recognised, relocate in ((is_pickle, relocate_pickle), (is_container, relocate_container)):
        if recognised(data):
            try:
                return relocate(data, pm, depth)
            except NotRelocatable:
                if depth == 0:
                    raise
                break  # bytes that merely look like one: opaque
    counts = Counts()
    counts.opaque = sum(data.count(o) for o in pm.old_bytes)
    return data, counts
