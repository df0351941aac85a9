"""Snapshot: collect cache roots into a clean, normalized list of files for the layer.

What a live cache holds is not all worth shipping, and some of it is harmful:
- ``tmp.pid_*`` dirs are Triton's half-written entries from a killed process;
- a kernel ``.json`` without its binary crashes Triton 3.6 on load, so its whole key dir goes
  (and is reported: that kernel will compile at first use);
- ``gpu_p2p_access_cache_*.json`` describes the build host's GPU topology, never the server's;
- ``__grp__*.json`` files hold absolute paths of wherever the cache was filled.  They are
  rewritten to the canonical serving root (``layer_root``), so packing the same cache from any
  directory gives the same bytes, and an image mounted at that root hits without any install;
- the ``vllm`` role's torch.compile cache names its directory too (torch_paths.py): packed from
  another directory than ``layer_root/vllm``, its paths are rewritten the same way.  A file
  this cannot rewrite is packed as it is; install then leaves the role out (relocate_vllm.py).

The result is sorted by archive name; the layer writer turns it into bytes.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from cachebake.artifact.groups import GROUP_PREFIX, InvalidGroup, relocated_group
from cachebake.artifact.torch_paths import PATH_ROLES, NotRelocatable, PathMap, relocate_file
from cachebake.errors import BadInput
from cachebake.roles import DEFAULT_ROOT, ROLE_ENV

# Triton names kernel key dirs by base32(sha256) without padding (52 chars of A-Z2-7); the
# autotuner names its dirs by the plain sha256 hex digest.
TRITON_KEY_DIR = re.compile(r"^(?:[A-Z2-7]{52}|[0-9a-f]{64})$")
BINARY_SUFFIXES = (".cubin", ".hsaco", ".spv", ".zebin")
IR_SUFFIXES = (".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn")
DROP_NAMES = (re.compile(r"^gpu_p2p_access_cache_.*\.json$"),)
DROP_DIRS = (re.compile(r"^tmp\.pid_"),)


@dataclass(frozen=True)
class CacheRoot:
    role: str
    path: Path


def parse_root(spec: str) -> CacheRoot:
    """``triton=/path`` or a bare ``/path`` (a Triton cache)."""
    role, sep, path = spec.partition("=")
    if not sep:
        role, path = "triton", spec
    if role not in ROLE_ENV:
        raise BadInput(f"unknown cache role {role!r} in {spec!r} (known: {', '.join(ROLE_ENV)})")
    if not path:
        raise BadInput(f"empty path in {spec!r}")
    return CacheRoot(role, Path(path))


@dataclass(frozen=True)
class SnapshotFile:
    arcname: str  # "triton/<KEY>/<file>", POSIX
    mode: int  # normalized: 0o644 or 0o755
    size: int
    source: Path | None = None  # read from disk...
    data: bytes | None = None  # ...or these bytes (rewritten group files)

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.source is not None
        return self.source.read_bytes()


@dataclass(frozen=True)
class Dropped:
    path: str
    reason: str


@dataclass
class Snapshot:
    layer_root: str
    roots: dict[str, str]  # role -> absolute source path
    files: list[SnapshotFile] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)

    @property
    def roles(self) -> list[str]:
        return sorted(self.roots)

    @property
    def data_size(self) -> int:
        return sum(f.size for f in self.files)


def _check_root(root: CacheRoot) -> Path:
    p = root.path
    if not p.exists():
        raise BadInput(f"{p}: no such directory")
    if not p.is_dir():
        raise BadInput(f"{p}: not a directory")
    if not os.access(p, os.R_OK | os.X_OK):
        raise BadInput(f"{p}: not readable")
    try:
        entries = [e for e in os.listdir(p) if not DROP_DIRS[0].match(e)]
    except OSError as e:
        raise BadInput(f"{p}: cannot list: {e.strerror}") from None
    if not entries:
        raise BadInput(f"{p}: empty directory, nothing to pack")
    if root.role == "triton" and not any(TRITON_KEY_DIR.match(e) and (p / e).is_dir() for e in entries):
        raise BadInput(f"{p}: not a Triton cache (no key directories); pass ROLE=PATH for other caches")
    return p.resolve()


def _walk(top: Path):
    """Yield (dirpath, dirnames, filenames) sorted, refusing symlinks: a cache never has them,
    and following one could pack files from outside the cache."""
    for dirpath, dirnames, filenames in os.walk(top, onerror=_walk_error):
        dirnames[:] = sorted(d for d in dirnames if not any(r.match(d) for r in DROP_DIRS))
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise BadInput(f"{os.path.join(dirpath, name)}: symlink in a cache; refusing to pack it")
        yield Path(dirpath), dirnames, sorted(filenames)


def _walk_error(err: OSError) -> None:
    raise BadInput(f"{err.filename}: cannot read: {err.strerror}")


def _kernel_metadata_names(keydir: Path, filenames: list[str]) -> list[str]:
    """Stems of the kernel metadata files in a key dir (``<name>.json`` with a group file)."""
    names = set(filenames)
    return [f[len(GROUP_PREFIX):-len(".json")] for f in filenames
            if f.startswith(GROUP_PREFIX) and f.endswith(".json") and f[len(GROUP_PREFIX):] in names]


def snapshot_roots(roots: list[CacheRoot], layer_root: str | None = None, prune_ir: bool = False) -> Snapshot:
    if not roots:
        raise BadInput("no cache roots given")
    seen_roles = [r.role for r in roots]
    dup = {r for r in seen_roles if seen_roles.count(r) > 1}
    if dup:
        raise BadInput(f"cache role given twice: {', '.join(sorted(dup))}")
    layer_root = str(layer_root or DEFAULT_ROOT)
    if not PurePosixPath(layer_root).is_absolute():
        raise BadInput(f"layer root must be absolute: {layer_root}")
    checked = [(r, _check_root(r)) for r in roots]
    snap = Snapshot(layer_root=layer_root, roots={r.role: str(p) for r, p in checked})
    paths = _torch_path_map(checked, layer_root)
    for root, top in sorted(checked, key=lambda rp: rp[0].role):
        snap.dirs.append(root.role)
        for dirpath, dirnames, filenames in _walk(top):
            rel = dirpath.relative_to(top)
            dropped_dir = _collect_dir(snap, root.role, top, dirpath, rel, filenames, prune_ir,
                                       paths if root.role in PATH_ROLES else None)
            if dropped_dir:
                dirnames[:] = []
                continue
            if rel != Path("."):
                snap.dirs.append(f"{root.role}/{rel.as_posix()}")
    snap.files.sort(key=lambda f: f.arcname)
    snap.dirs.sort()
    if not snap.files:
        raise BadInput("nothing left to pack after cleaning: " + "; ".join(f"{d.path}: {d.reason}" for d in snap.dropped))
    return snap


def _torch_path_map(checked: list[tuple[CacheRoot, Path]], layer_root: str) -> PathMap | None:
    """Where each role was filled (as given and resolved) -> the role under ``layer_root``;
    None when nothing moves (the usual bake: filled at the layer root) or it cannot move."""
    pairs = {}
    for root, top in checked:
        new = f"{layer_root.rstrip('/')}/{root.role}"
        for old in (os.path.abspath(root.path), str(top)):
            pairs.setdefault(old, new)
    try:
        pm = PathMap(pairs)
    except NotRelocatable:
        return None  # install refuses the role with the reason
    return None if pm.identity else pm


def _collect_dir(snap: Snapshot, role: str, top: Path, dirpath: Path, rel: Path,
                 filenames: list[str], prune_ir: bool, paths: PathMap | None = None) -> bool:
    """Add one directory's files to the snapshot; True if the whole dir was dropped."""
    prefix = role if rel == Path(".") else f"{role}/{rel.as_posix()}"
    is_triton_key_dir = role == "triton" and rel != Path(".") and len(rel.parts) == 1
    if is_triton_key_dir:
        for stem in _kernel_metadata_names(dirpath, filenames):
            if not any(stem + s in filenames for s in BINARY_SUFFIXES):
                snap.dropped.append(Dropped(prefix, f"kernel {stem!r} has metadata but no binary (Triton 3.6 crashes on it)"))
                return True
    keep = []
    for name in filenames:
        if any(r.match(name) for r in DROP_NAMES):
            snap.dropped.append(Dropped(f"{prefix}/{name}", "host GPU topology, never valid on another machine"))
            continue
        if prune_ir and is_triton_key_dir and name.endswith(IR_SUFFIXES):
            continue
        keep.append(name)
    for name in keep:
        path = dirpath / name
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                raise BadInput(f"{path}: not a regular file; refusing to pack it")
            if not os.access(path, os.R_OK):
                raise BadInput(f"{path}: not readable")
        except OSError as e:
            raise BadInput(f"{path}: cannot read: {e.strerror}") from None
        arcname = f"{prefix}/{name}"
        mode = 0o755 if (st.st_mode & 0o111 or name.endswith(".so")) else 0o644
        if is_triton_key_dir and name.startswith(GROUP_PREFIX) and name.endswith(".json"):
            data = _rewrite_group(path, f"{snap.layer_root}/{prefix}", set(keep))
            snap.files.append(SnapshotFile(arcname, mode, len(data), data=data))
        elif paths is not None and (data := _relocated(path, arcname, snap.layer_root, paths)):
            snap.files.append(SnapshotFile(arcname, mode, len(data), data=data))
        else:
            snap.files.append(SnapshotFile(arcname, mode, st.st_size, source=path))
    return False


def _relocated(path: Path, arcname: str, layer_root: str, paths: PathMap) -> bytes | None:
    """The file's bytes with its paths moved to the layer root, or None if nothing moved."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}") from None
    try:
        new, _ = relocate_file(arcname.split("/", 1)[1], data, paths,
                               f"{layer_root.rstrip('/')}/{arcname.rpartition('/')[0]}")
    except NotRelocatable:
        return None  # packed as it is; install leaves the role out and says why
    return None if new is data else new


def _rewrite_group(path: Path, final_dir: str, present: set[str]) -> bytes:
    # Children we did not ship (pruned IR, files lost) are dropped: Triton checks each path
    # exists anyway, but a group naming only shipped files keeps the layer honest.
    try:
        return relocated_group(path.read_bytes(), final_dir, keep=present)
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}") from None
    except InvalidGroup as e:
        raise BadInput(f"{path}: group file {e}") from None
