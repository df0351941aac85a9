"""The ``vllm`` role's serve-time misses: torch.compile dirs the server wrote that the bake lacks.

A server's ``VLLM_CACHE_ROOT`` is a writable copy of the bake's ``vllm`` role (``install``
installs it writable at ``DIR/vllm``; the image-volume Pod copies it into an emptyDir at
``ROOT/vllm``: cachebake.distribute.k8s), because Inductor writes there on every load.  When the
server runs with a flag the bake was not made for, vLLM hashes another identity and compiles
into new dirs there (vllm/versions.py has both releases' layouts):

- a backend dir ``torch_compile_cache/<10 hex>/rank_<i>_<j>/<prefix>`` (vLLM 0.24 .. 0.33:
  its artifacts; 0.34: the factors and graph only);
- an AOT dir ``torch_compile_cache/torch_aot_compile/<64 hex>`` (``rank_<i>_<j>/model`` and
  Inductor's ``inductor_cache/``).

Each such dir not in the bake's inventory is one miss ("unit").  A miss line
(cachebake.serve.misslog's format, ``kind: vllm``, ``role: vllm``) names it by its dir names
only, relative to the cache root, with how many files and bytes it holds and the server's
serve flags (parsed from its own ``vllm serve`` command line): never the bytes, never a path
outside the cache root.  Fold-back (cachebake.replay.foldback) regenerates such dirs on the
fold machine with those flags; nothing of the pod's copy is ever read back.

The tree is the pod's, so it is hostile: it is walked through directory fds with O_NOFOLLOW
(the cache root itself is the caller's path and may be a link, as install's ``DIR/vllm`` is),
every name checked against the shapes vLLM writes, and bounded in entries and depth.  A link,
a device, a FIFO, a name of another shape, or a tree over the bounds refuses the whole scan
(``VllmCacheRefused``: exit 6 from the CLI; one stderr line in the server), never followed.

The bake's inventory: install.json's file list (``DIR/.cachebake/current/install.json``) where
the cache root is an installed role (``DIR/vllm``), or the list given by the caller (``cachebake
misses --vllm-cache DIR --bake ART``: the artifact's layer).  Files added inside a baked unit
are Inductor's load-time writes, not misses: baked units are neither walked nor logged.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass, field
from typing import Iterable, Optional

from cachebake.errors import UnsafeArtifact
from cachebake.fsops import DIR_FLAGS

ROLE = "vllm"
KIND = "vllm"  # the miss line's kind
COMPILE_DIR = "torch_compile_cache"
AOT_DIR = "torch_aot_compile"
BACKEND_HASH = re.compile(r"[0-9a-f]{10}\Z")  # sha256(...)[:10] / hash_factors(...)[:10]
AOT_HASH = re.compile(r"[0-9a-f]{64}\Z")  # sha256(str(factors))
RANK = re.compile(r"rank_[0-9]{1,4}_[0-9]{1,4}\Z")
PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")  # the backend's prefix: backbone, eagle_head
# inside a unit: the names Inductor and vLLM write (base32/hex stems, .py, .best_config, .json)
INNER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}\Z")
MAX_ENTRIES = 100_000  # entries walked in one scan (a bake's role: a few hundred)
MAX_DEPTH = 8  # dirs below a unit (inductor_cache/aotautograd/<key>/<file>: 3)
MAX_UNITS = 1024  # new units in one scan (one per flag set and rank)
BACKEND, AOT = "backend", "aot"
VLLM_CLI_MAIN = "vllm/entrypoints/cli/main.py"  # argv[0] of `python -m vllm.entrypoints.cli.main serve`


class VllmCacheRefused(UnsafeArtifact):
    """The server's vLLM cache holds what vLLM never writes (a link, a device, an odd name, a
    tree over the bounds): nothing of it is logged.  Exit 6, as an unsafe layer."""

    def __init__(self, root: str, where: str, why: str):
        super().__init__(f"the vLLM cache {root}: {where} {why}; nothing was logged "
                         "(a link is never followed)")
        self.where = where


@dataclass(frozen=True)
class Unit:
    """One torch.compile dir: a backend dir or an AOT dir, named relative to the cache root."""

    kind: str  # BACKEND | AOT
    hash: str
    rank: str = ""  # backend dirs only
    prefix: str = ""

    @property
    def rel(self) -> str:
        if self.kind == AOT:
            return f"{COMPILE_DIR}/{AOT_DIR}/{self.hash}"
        return f"{COMPILE_DIR}/{self.hash}/{self.rank}/{self.prefix}"

    @property
    def label(self) -> str:
        """The miss line's ``kernel``: what the unit is, beside its ``key`` (the hash)."""
        return AOT_DIR if self.kind == AOT else f"{self.rank}/{self.prefix}"


def unit_of(rel: str) -> Optional[Unit]:
    """The unit a path relative to the vllm role lies in (checked shapes), or None."""
    parts = rel.split("/")
    if len(parts) < 3 or parts[0] != COMPILE_DIR:
        return None
    if parts[1] == AOT_DIR:
        return Unit(AOT, parts[2]) if AOT_HASH.match(parts[2]) else None
    if len(parts) >= 4 and BACKEND_HASH.match(parts[1]) and RANK.match(parts[2]) \
            and PREFIX.match(parts[3]):
        return Unit(BACKEND, parts[1], parts[2], parts[3])
    return None


def units_of(paths: Iterable[str]) -> set[Unit]:
    """The units of an inventory's paths (relative to the vllm role; others ignored)."""
    found = set()
    for p in paths:
        u = unit_of(p)
        if u is not None:
            found.add(u)
    return found


def installed_inventory(cache_root: str) -> Optional[set[Unit]]:
    """The units of the bake installed where ``cache_root`` is its ``vllm`` role
    (``DIR/vllm``; install.json lists every file), or None where it is no installed role."""
    from cachebake.install.atomic import InstallDir

    norm = os.path.normpath(os.path.abspath(cache_root))
    if os.path.basename(norm) != ROLE:
        return None
    marker = InstallDir(os.path.dirname(norm)).installed()
    if marker is None or ROLE not in marker.roles:
        return None
    prefix = ROLE + "/"
    return units_of(name[len(prefix):] for name in marker.files if name.startswith(prefix))


@dataclass
class NewUnit:
    unit: Unit
    files: int = 0
    bytes: int = 0


@dataclass
class Scan:
    root: str
    new: list[NewUnit] = field(default_factory=list)
    baked: int = 0  # units of the inventory found (not walked)


class _Walker:
    def __init__(self, root: str):
        self.root = root
        self.entries = 0

    def refuse(self, where: str, why: str):
        raise VllmCacheRefused(self.root, where, why)

    def listdir(self, fd: int, where: str) -> list[str]:
        names = sorted(os.listdir(fd))
        self.entries += len(names)
        if self.entries > MAX_ENTRIES:
            self.refuse(where, f"takes the scan over {MAX_ENTRIES} entries (a huge tree)")
        return names

    def open_dir(self, parent_fd: int, name: str, where: str) -> int:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            self.refuse(where, f"is {_describe(st.st_mode)}, not a directory")
        try:
            return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except OSError as e:  # swapped for a link since the stat: O_NOFOLLOW refuses it
            self.refuse(where, f"cannot be opened as a directory ({e.strerror or e})")

    def check_name(self, name: str, pattern: re.Pattern, where: str, shape: str) -> None:
        if not pattern.match(name):
            self.refuse(f"{where}{ascii(name)[1:-1][:80]}", f"is not a name vLLM writes here ({shape})")

    def measure(self, fd: int, where: str, depth: int, into: NewUnit) -> None:
        """Count a new unit's files and bytes; refuse what is not a plain file or dir."""
        if depth > MAX_DEPTH:
            self.refuse(where, f"is nested over {MAX_DEPTH} directories deep")
        for name in self.listdir(fd, where):
            self.check_name(name, INNER_NAME, where, "[A-Za-z0-9_.+-]")
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                sub = self.open_dir(fd, name, f"{where}{name}/")
                try:
                    self.measure(sub, f"{where}{name}/", depth + 1, into)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                into.files += 1
                into.bytes += st.st_size
            else:
                self.refuse(f"{where}{name}", f"is {_describe(st.st_mode)}, not a file vLLM writes")


def _describe(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def scan(cache_root: str, baked: set[Unit]) -> Scan:
    """The units under ``cache_root/torch_compile_cache`` that ``baked`` lacks, each measured.
    VllmCacheRefused when the tree holds anything vLLM does not write (module doc); OSError
    when the root cannot be read."""
    result = Scan(cache_root)
    w = _Walker(cache_root)
    root_fd = os.open(cache_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the caller's path
    try:
        try:
            st = os.stat(COMPILE_DIR, dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError:
            return result
        if not stat.S_ISDIR(st.st_mode):
            w.refuse(f"{COMPILE_DIR}", f"is {_describe(st.st_mode)}, not a directory")
        cfd = w.open_dir(root_fd, COMPILE_DIR, f"{COMPILE_DIR}/")
        try:
            _scan_compile_dir(w, cfd, baked, result)
        finally:
            os.close(cfd)
    finally:
        os.close(root_fd)
    return result


def _add(w: _Walker, parent_fd: int, name: str, unit: Unit, baked: set[Unit], result: Scan) -> None:
    if unit in baked:
        result.baked += 1
        return
    if len(result.new) >= MAX_UNITS:
        w.refuse(unit.rel, f"is over {MAX_UNITS} new torch.compile dirs in one cache")
    new = NewUnit(unit)
    fd = w.open_dir(parent_fd, name, unit.rel + "/")
    try:
        w.measure(fd, unit.rel + "/", 0, new)
    finally:
        os.close(fd)
    result.new.append(new)


def _scan_compile_dir(w: _Walker, cfd: int, baked: set[Unit], result: Scan) -> None:
    here = f"{COMPILE_DIR}/"
    for name in w.listdir(cfd, here):
        if name == AOT_DIR:
            afd = w.open_dir(cfd, name, f"{here}{name}/")
            try:
                for h in w.listdir(afd, f"{here}{AOT_DIR}/"):
                    w.check_name(h, AOT_HASH, f"{here}{AOT_DIR}/", "64 hex digits")
                    _add(w, afd, h, Unit(AOT, h), baked, result)
            finally:
                os.close(afd)
            continue
        w.check_name(name, BACKEND_HASH, here, f"10 hex digits or {AOT_DIR}")
        hfd = w.open_dir(cfd, name, f"{here}{name}/")
        try:
            for rank in w.listdir(hfd, f"{here}{name}/"):
                w.check_name(rank, RANK, f"{here}{name}/", "rank_<i>_<j>")
                rfd = w.open_dir(hfd, rank, f"{here}{name}/{rank}/")
                try:
                    for prefix in w.listdir(rfd, f"{here}{name}/{rank}/"):
                        w.check_name(prefix, PREFIX, f"{here}{name}/{rank}/", "a backend prefix")
                        _add(w, rfd, prefix, Unit(BACKEND, name, rank, prefix), baked, result)
                finally:
                    os.close(rfd)
        finally:
            os.close(hfd)


# ---------------------------------------------------------------------------- the server's flags
def server_flags(argv: list[str]) -> Optional[tuple[str, dict]]:
    """(model reference, serve args) of a ``vllm serve MODEL FLAGS...`` command line (the API
    server's own ``sys.argv``; also ``python -m vllm.entrypoints.cli.main serve``), or None for
    any other process.  Flags are parsed as
    ``--serve-args`` text is (cachebake.vllm.serveargs); ``--model M`` counts as the model."""
    import shlex

    from cachebake.errors import CachebakeError
    from cachebake.vllm.serveargs import parse_serve_args

    entry = argv[0].replace("\\", "/") if argv else ""
    if len(argv) < 2 or argv[1] != "serve" or not (os.path.basename(entry) == "vllm"
                                                   or entry.endswith(VLLM_CLI_MAIN)):
        return None
    rest = list(argv[2:])
    model = None
    if rest and not rest[0].startswith("-"):
        model = rest.pop(0)
    try:
        args = parse_serve_args(shlex.join(rest))
    except CachebakeError:
        return None
    if model is None and isinstance(args.get("model"), str):
        model = args["model"]
    args.pop("model", None)
    return (model or "", args)


# ---------------------------------------------------------------------------- the miss lines
def miss_lines(result: Scan, serve_args: Optional[dict], model: Optional[str], stored: str) -> list[dict]:
    """One miss line per new unit (cachebake.serve.misslog's format)."""
    from cachebake.serve import misslog

    lines = []
    for n in result.new:
        u = n.unit
        extra = {"role": ROLE, "unit": u.kind, "files": n.files, "bytes": n.bytes,
                 "serve_args": serve_args, "model": model}
        extra["aot" if u.kind == AOT else "backend_dir"] = u.rel
        lines.append(misslog.make_entry(KIND, u.label, u.hash, None, stored, **extra))
    return lines


STORED = "vllm cache"  # the miss line's ``stored``: the server's VLLM_CACHE_ROOT
_hooked = False
# the units of a cache root that is no installed role, when the server started (install_exit_hook)
_present_at_start: Optional[set[Unit]] = None


def record_at_exit() -> None:
    """At the API server's exit: log the new torch.compile dirs of ``$VLLM_CACHE_ROOT`` to the
    miss log.  Never raises (one stderr line says why nothing was logged)."""
    from cachebake.serve import misslog

    root = os.environ.get("VLLM_CACHE_ROOT")
    flags = server_flags(sys.argv)
    if not root or flags is None:
        return
    try:
        baked = installed_inventory(root)
        if baked is None:
            baked = _present_at_start
        if baked is None:
            print(f"cachebake: {root} is not an installed vllm role (no install.json beside it): its "
                  "torch.compile misses are not logged; run `cachebake misses --vllm-cache DIR "
                  "--bake ART LOG` on a copy", file=sys.stderr, flush=True)
            return
        for line in miss_lines(scan(root, baked), flags[1], flags[0], STORED):
            misslog.write(line)
    except VllmCacheRefused as e:
        print(f"cachebake: {e.line()}", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - the server's exit must not fail for this
        print(f"cachebake: could not log the vLLM cache's misses: {e!r}", file=sys.stderr, flush=True)


def install_exit_hook() -> bool:
    """Register ``record_at_exit`` once, in the ``vllm serve`` process only (the API server:
    the engine and workers have exited by its atexit).

    Where the cache root is no installed role (the image-volume Pod copies the layer's ``vllm``
    role into an emptyDir: no install.json there), the units present now are the bake's: vLLM
    loads general plugins while it parses the command line (``AsyncEngineArgs.add_cli_args``,
    0.24 and 0.34), before it starts the engine core, which compiles."""
    global _hooked, _present_at_start
    root = os.environ.get("VLLM_CACHE_ROOT")
    if _hooked or server_flags(sys.argv) is None or not root:
        return False
    if installed_inventory(root) is None:
        try:
            _present_at_start = {n.unit for n in scan(root, set()).new}
        except (VllmCacheRefused, OSError) as e:
            why = e.line() if isinstance(e, VllmCacheRefused) else f"{root}: {e.strerror or e}"
            print(f"cachebake: vLLM cache misses are not logged: {why}", file=sys.stderr, flush=True)
            return False
    import atexit

    atexit.register(record_at_exit)
    _hooked = True
    return True
