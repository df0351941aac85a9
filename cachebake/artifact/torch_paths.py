"""Absolute paths inside vLLM's torch.compile cache, and how to move them without torch.

vLLM's cache (the ``vllm`` role, ``VLLM_CACHE_ROOT``) names the directory it was written in.
Where, and who reads it back (vLLM 0.24.0 / 0.33.0, torch 2.11 / 2.14; README "Moving a vLLM
bake" has the full table):

* ``vllm_compile_cache.py`` (a Python literal): each graph handle is ``(name, <dir>/<name>)``.
  vLLM 0.24 opens the absolute path (a moved bake fails with FileNotFoundError); 0.33 joins its
  cache dir with ``name``.  Rewritten structurally (``relocate_compile_cache``).
* pickled ``CompiledFxGraph`` (Inductor's FX-graph cache entries, and the same pickles nested in
  ``artifact_compile_range_*`` containers and in the AOT ``model`` file):
  ``_triton_bundle.static_autotuners[].kernel.filename`` and ``.save_cache_hook``'s
  ``AutotuneCache.local_cache`` are READ on load: a statically launchable kernel rechecks its
  autotune result at ``dirname(filename)/<hash>.best_config`` and saves a new one there.  With the
  old path, every multi-config kernel misses its ``.best_config``, benchmarks again at the
  first request and writes into the old root.  ``source_code`` and ``runnable_graph_str`` hold
  the paths in comments and a repro script (logged only).  All these are text strings: rewritten.
* Triton files bundled in those pickles (``TritonKernelArtifact.payload``, bytes): the group
  JSON uses torch's ``[REPLACE]`` placeholder (relocatable by design); the IR and the cubin name
  the kernel's source file in debug locations and device-assert messages only (nothing opens
  it by that name).  Left as they are: a cubin is an ELF whose string lengths cannot change.
* Inductor C++ kernels (``.so``, CPU): their DWARF names the source; accepted only where every
  occurrence is in a section that is not loaded (``elf_debug_only``).
* Inductor's generated ``.py`` files: ``# kernel path:`` comments.  Rewritten as text.

Pickles are rewritten opcode by opcode (``pickletools``), never unpickled: each string opcode
whose text names an old root is re-emitted with its new length (switching between the short and
long forms where needed), protocol-4 frames are rebuilt, and nested pickles or torch's
length-prefixed containers (``torch.utils._appending_byte_serializer``: a CRC32, then u64
big-endian lengths) inside bytes are rewritten recursively with their lengths and checksums
recomputed.  Anything that names an old root in a form not understood here raises
``NotRelocatable``; callers then leave the role out rather than guess.
"""

from __future__ import annotations

import ast
import base64
import binascii
import io
import pickletools
import posixpath
import pprint
import re
import struct
import zlib
from dataclasses import dataclass, field

# Characters a root may contain so that it can be written into text (Python string literals,
# comments, JSON) unchanged: no quotes, backslashes or control characters.
_PLAIN_ROOT = re.compile(r"^/[^\x00-\x1f\x7f'\"\\]*$")
# Characters that may continue a path component: a root must not be followed by one.
_NAME_CHAR = r"A-Za-z0-9._\-"
# The cache roles whose files name their own directory.
PATH_ROLES = ("vllm",)
# Every vLLM-role path goes through this directory: how an unknown root is recognised.
MARKER = "/torch_compile_cache/"
COMPILE_CACHE_FILE = "vllm_compile_cache.py"
MAX_NESTING = 8


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


class PathMap:
    """Old absolute roots -> new ones (each a role directory such as ``/var/cache/cachebake/vllm``).

    A root matches only as a whole path prefix: ``/a/vllm`` matches ``/a/vllm`` and
    ``/a/vllm/x``, never ``/a/vllm2`` or ``/b/a/vllm``."""

    def __init__(self, pairs: dict[str, str]):
        self.pairs = {_norm(o): _norm(n) for o, n in pairs.items()}
        for new in self.pairs.values():
            if not _PLAIN_ROOT.match(new):
                raise NotRelocatable(f"{new!r} holds quotes, backslashes or control characters: "
                                     "it cannot be written into the cache's text files")
        self.changes = {o: n for o, n in self.pairs.items() if o != n}
        self.targets = sorted(set(self.pairs.values()), key=len, reverse=True)
        olds = sorted(self.changes, key=len, reverse=True)
        self._re = re.compile(
            rf"(?<![{_NAME_CHAR}/])(?:{'|'.join(map(re.escape, olds))})(?![{_NAME_CHAR}])"
        ) if olds else None
        self._old_bytes = [o.encode() for o in olds]

    @property
    def identity(self) -> bool:
        return not self.changes

    def mentions_old(self, data: bytes) -> bool:
        return any(o in data for o in self._old_bytes)

    def names_only_targets(self, data: bytes) -> bool:
        """Byte-level check: every ``/torch_compile_cache/`` in ``data`` follows a target root
        (then there is nothing to rewrite and no unknown root to find)."""
        marker = MARKER.encode()
        targets = [t.encode() for t in self.targets]
        start = 0
        while (i := data.find(marker, start)) >= 0:
            start = i + 1
            if not any(data.endswith(t, 0, i) and (i == len(t) or not _is_name_byte(data[i - len(t) - 1]))
                       for t in targets):
                return False
        return True

    def sub(self, text: str) -> tuple[str, int]:
        if self._re is None:
            return text, 0
        return self._re.subn(lambda m: self.changes[m.group(0)], text)

    def foreign_roots(self, text: str) -> set[str]:
        """Absolute roots before ``/torch_compile_cache/`` in ``text`` that are not a target."""
        found = set()
        start = 0
        while (i := text.find(MARKER, start)) >= 0:
            start = i + 1
            head = text[:i]
            if any(head.endswith(t) and (len(head) == len(t) or not _is_name_char(head[-len(t) - 1]))
                   for t in self.targets):
                continue
            j = i
            while j > 0 and text[j - 1] not in "\x00\n\r\t '\"`()[]{}<>,;=|":
                j -= 1
            if text[j:i].startswith("/"):
                found.add(text[j:i])
        return found

    def fix_text(self, text: str, counts: Counts) -> str:
        new, n = self.sub(text)
        counts.rewritten += n
        counts.foreign |= self.foreign_roots(new)
        return new


def _norm(path: str) -> str:
    p = posixpath.normpath(path)
    if not p.startswith("/"):
        raise NotRelocatable(f"{path!r} is not an absolute path")
    return p


def _is_name_char(c: str) -> bool:
    return c.isalnum() or c in "._-/"


def _is_name_byte(b: int) -> bool:
    return chr(b).isalnum() or b in b"._-/"


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


def relocate_pickle(data: bytes, pm: PathMap, depth: int = 0) -> tuple[bytes, Counts]:
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


def relocate_container(data: bytes, pm: PathMap, depth: int = 0) -> tuple[bytes, Counts]:
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


def _relocate_cache_artifacts(r: _Reader, pm: PathMap, depth: int) -> tuple[bytes, Counts]:
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

def relocate_blob(data: bytes, pm: PathMap, depth: int = 0) -> tuple[bytes, Counts]:
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
    counts.opaque = sum(data.count(o) for o in pm._old_bytes)
    return data, counts


def elf_debug_only(data: bytes, needles: list[bytes]) -> bool:
    """Whether every occurrence of ``needles`` in the ELF file ``data`` (an Inductor C++ kernel
    .so) lies in a section that is not loaded (no SHF_ALLOC: DWARF line tables and the like,
    which nothing reads at run time).  A path in .dynstr (an RPATH) or .rodata may be used:
    False.  (Cubins nested in Inductor's pickles are not held to this: besides DWARF they name
    their source file in device-assert messages, in .nv.global.init, which only a failing
    device assertion prints.)"""
    try:
        if data[4] != 2 or data[5] != 1:  # 64-bit little-endian: what CUDA and x86-64 write
            return False
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]
    except (struct.error, IndexError):
        return False
    SHT_NOBITS, SHF_ALLOC = 8, 0x2
    debug = [(off, off + size) for _, typ, flags, _, off, size in sections
             if typ != SHT_NOBITS and not flags & SHF_ALLOC]
    for needle in needles:
        start = 0
        while (i := data.find(needle, start)) >= 0:
            start = i + 1
            if not any(lo <= i and i + len(needle) <= hi for lo, hi in debug):
                return False
    return True


def relocate_compile_cache(data: bytes, pm: PathMap, serve_dir: str) -> tuple[bytes, Counts]:
    """vLLM's ``vllm_compile_cache.py`` (``CompilerManager.save_to_file``: a pprint'ed dict
    ``{(range, graph index, compiler name): {'graph_handle': (name, path), 'cache_key': ...}}``).

    Handles of ``inductor_standalone`` are set to ``serve_dir/<name>``, exactly the path vLLM
    0.33 computes itself and 0.24 opens; other handles go through ``pm`` (vLLM reads only their
    first element)."""
    try:
        cache = ast.literal_eval(data.decode("utf-8"))
        if not isinstance(cache, dict):
            raise TypeError("not a dict")
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError, MemoryError) as e:
        raise NotRelocatable(f"{COMPILE_CACHE_FILE} is not the Python literal vLLM writes: {e}") from None
    counts = Counts()
    for key, value in cache.items():
        if not (isinstance(value, dict) and isinstance(value.get("graph_handle"), tuple)
                and len(value["graph_handle"]) == 2):
            continue  # vLLM itself ignores entries it cannot parse (and recompiles them)
        name, path = value["graph_handle"]
        if not (isinstance(name, str) and isinstance(path, str)):
            continue
        compiler = key[2] if isinstance(key, tuple) and len(key) == 3 else None
        if compiler == "inductor_standalone":
            if not name or "/" in name or name in (".", "..") or "\x00" in name:
                raise NotRelocatable(f"{COMPILE_CACHE_FILE} names an artifact {name!r} that is "
                                     "not a plain file name")
            new = posixpath.join(serve_dir, name)
        else:
            new = pm.fix_text(path, counts)
        if new != path:
            counts.rewritten += 1
            value["graph_handle"] = (name, new)
    if counts.rewritten == 0:
        return data, counts
    # vLLM writes it with pprint.PrettyPrinter(indent=4); so do we.
    return pprint.PrettyPrinter(indent=4).pformat(cache).encode(), counts


def relocate_text(data: bytes, pm: PathMap) -> tuple[bytes, Counts]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotRelocatable(f"not UTF-8 text: {e}") from None
    counts = Counts()
    new = pm.fix_text(text, counts)
    return (data if new == text else new.encode()), counts


def relocate_file(name: str, data: bytes, pm: PathMap, serve_dir: str) -> tuple[bytes, Counts]:
    """One file of a vLLM cache role.  ``name``: its path inside the role; ``serve_dir``: the
    absolute directory it will be read from.  Returns ``data`` itself when nothing changed;
    raises NotRelocatable for a file that names an old or unknown root in a way this module
    cannot rewrite."""
    base = posixpath.basename(name)
    if base == COMPILE_CACHE_FILE:
        new, counts = relocate_compile_cache(data, pm, serve_dir)
    elif not pm.mentions_old(data) and pm.names_only_targets(data):
        return data, Counts()
    elif is_pickle(data) or is_container(data):
        new, counts = relocate_blob(data, pm)
    elif b"\x00" not in data:
        new, counts = relocate_text(data, pm)
    elif data[:4] == b"\x7fELF":  # an Inductor C++ kernel .so: left as is if only its DWARF names a root
        if not elf_debug_only(data, [*pm._old_bytes, MARKER.encode()]):
            raise NotRelocatable("a shared object names the cache root outside its debug sections")
        new, counts = relocate_blob(data, pm)
    else:
        raise NotRelocatable("a binary file of unknown format names the cache root")
    if counts.foreign:
        raise NotRelocatable(f"it names {', '.join(sorted(counts.foreign))}, a root this bake "
                             "does not record (was the cache copied before it was packed?)")
    return new, counts
