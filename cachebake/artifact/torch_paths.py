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

Pickles and torch's length-prefixed containers are rewritten by torch_formats.py (opcode by
opcode, lengths, frames and checksums recomputed; never unpickled).  Anything that names an old
root in a form not understood raises ``NotRelocatable``; callers then leave the role out
rather than guess.
"""

from __future__ import annotations

import ast
import posixpath
import pprint
import re
import struct

from cachebake.artifact.torch_formats import (Counts, NotRelocatable, is_container, is_pickle,
                                              relocate_blob)

__all__ = ["COMPILE_CACHE_FILE", "Counts", "MARKER", "NotRelocatable", "PATH_ROLES", "PathMap",
           "elf_debug_only", "relocate_compile_cache", "relocate_file", "relocate_text"]

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
        self.old_bytes = [o.encode() for o in olds]

    @property
    def identity(self) -> bool:
        return not self.changes

    def mentions_old(self, data: bytes) -> bool:
        return any(o in data for o in self.old_bytes)

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
        if not elf_debug_only(data, [*pm.old_bytes, MARKER.encode()]):
            raise NotRelocatable("a shared object names the cache root outside its debug sections")
        new, counts = relocate_blob(data, pm)
    else:
        raise NotRelocatable("a binary file of unknown format names the cache root")
    if counts.foreign:
        raise NotRelocatable(f"it names {', '.join(sorted(counts.foreign))}, a root this bake "
                             "does not record (was the cache copied before it was packed?)")
    return new, counts
