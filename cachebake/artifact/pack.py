"""pack: snapshot -> manifest -> layer -> OCI layout, written whole or not at all.

The artifact is built in a temporary sibling of ``--out`` and renamed into place at the end, so
an interrupted or refused pack leaves ``--out`` as it was.  Packing into an existing artifact
adds (or replaces) this target's image and keeps the others: a build farm packs each GPU target
on its own builder into one artifact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cachebake.artifact import oci
from cachebake.artifact.fingerprint import current_fingerprint
from cachebake.artifact.layer import COMPRESSION, LAYER_MEDIA_TYPE, LayerWriter
from cachebake.artifact.manifest import BakeManifest, LayerFacts, build_inventory
from cachebake.artifact.snapshot import CacheRoot, parse_root, snapshot_roots
from cachebake.errors import BadInput, CachebakeError

__all__ = ["CacheRoot", "parse_root", "pack_artifact", "PackReport"]


@dataclass
class PackReport:
    out: Path
    target: str
    manifest: BakeManifest
    manifest_digest: str
    targets: list[str]

    def to_dict(self) -> dict:
        return {"out": str(self.out), "target": self.target, "targets": self.targets,
                "manifest_digest": self.manifest_digest, "manifest": self.manifest.to_dict()}


def pack_artifact(roots: list[CacheRoot], out: os.PathLike | str, *, target: str | None = None,
                  bake: dict | None = None, layer_root: str | None = None,
                  prune_ir: bool = False) -> PackReport:
    out = Path(out).absolute()
    try:
        out.exists()
    except PermissionError:
        raise BadInput(f"--out {out}: permission denied") from None
    if out.exists() and not (out.is_dir() and oci.is_artifact(out)):
        if not (out.is_dir() and not any(out.iterdir())):
            raise BadInput(f"--out {out} exists and is not a cachebake artifact; refusing to overwrite it")
    # Fingerprint first: a target Triton cannot serve fails before any work.
    snap = snapshot_roots(roots, layer_root=layer_root, prune_ir=prune_ir)
    fp = current_fingerprint(target, bake_paths=snap.roots)
    inventory = build_inventory(snap)

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"--out {out}: cannot create its parent: {e.strerror}") from None
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise BadInput(f"--out {out}: {out.parent} is not writable")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        existing: dict[str, dict] = {}
        summaries: dict[str, dict] = {}
        if oci.is_artifact(out):
            old = oci.open_artifact(out)
            for key, desc in old.entries_by_target().items():
                if key == fp.target:
                    continue
                ref = old.select(key)  # verifies what we carry over
                _copy_image(out, tmp, desc, ref)
                existing[key] = desc
                summaries[key] = _summary(ref.manifest, desc["digest"])
        blobs = tmp / "blobs" / "sha256"
        blobs.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=blobs, delete=False, prefix=".layer-") as f:
            stats = LayerWriter(f).write(snap)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f.name, oci.blob_path(tmp, stats.digest))
        manifest = BakeManifest(
            target=fp.target, fingerprint=fp.to_dict(), roles=snap.roles, layer_root=snap.layer_root,
            layer=LayerFacts(media_type=LAYER_MEDIA_TYPE, diff_id=stats.diff_id, digest=stats.digest,
                             size=stats.size, tar_size=stats.tar_size,
                             uncompressed_size=stats.uncompressed_size, entries=stats.entries,
                             files=stats.files, compression=COMPRESSION),
            inventory=inventory, bake=dict(bake or {}))
        desc = oci.add_image(tmp, manifest)
        existing[fp.target] = desc
        summaries[fp.target] = _summary(manifest, desc["digest"])
        oci.write_index(tmp, list(existing.values()), summaries)
        _world_readable(tmp)
        _fsync_tree(tmp)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PackReport(out, fp.target, manifest, desc["digest"], sorted(existing))


def _summary(manifest: BakeManifest, manifest_digest: str) -> dict:
    return {"image_manifest_digest": manifest_digest, **manifest.to_dict()}


def _copy_image(src: Path, dst: Path, desc: dict, ref) -> None:
    manifest = json.loads(oci.blob_path(src, desc["digest"]).read_bytes())
    for d in (desc, manifest["config"], *manifest["layers"]):
        target = oci.blob_path(dst, d["digest"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(oci.blob_path(src, d["digest"]), target)


def _world_readable(root: Path) -> None:
    """0755 directories, 0644 files, whatever the umask: mkdtemp and NamedTemporaryFile create
    0700/0600, and an init container installs as another, unprivileged user."""
    os.chmod(root, 0o755)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished artifact to ``out``.  An existing artifact is moved aside first and
    removed after; if the final rename fails it is moved back."""
    if not out.exists():
        os.rename(tmp, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rmdir(aside)
    os.rename(out, aside)
    try:
        os.rename(tmp, out)
    except OSError as e:
        os.rename(aside, out)
        raise CachebakeError(f"could not move the new artifact into {out}: {e.strerror}") from None
    shutil.rmtree(aside, ignore_errors=True)
