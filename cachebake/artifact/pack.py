"""pack: snapshot -> manifest -> layer -> OCI layout, written whole or not at all.

The artifact is built in a temporary sibling of ``--out`` and swapped into place at the end
(one renameat2 RENAME_EXCHANGE when ``--out`` exists), so an interrupted, killed or refused pack
leaves ``--out`` as it was or the new artifact, never neither; the next pack removes what a
killed one left beside ``--out``: ``cachebake.artifact.destination``, which merge writes
through too.  Packing into an existing artifact
adds (or replaces, and says so) this target's image and keeps the others: a build farm packs
each GPU target on its own builder into one artifact.

The GPU target is what the cache holds: every kernel's metadata names the target it was
compiled for, so ``--target`` must agree with it, and without ``--target`` it is taken from
there (or from the visible GPU for a cache without kernels).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cachebake import jsonio
from cachebake.artifact import oci
from cachebake.artifact.destination import ArtifactDestination, no_checkpoint, work_dir_beside
from cachebake.artifact.fingerprint import current_fingerprint
from cachebake.artifact.layer import COMPRESSION, LayerWriter
from cachebake.artifact.manifest import BakeManifest, BakeRecord, Inventory, LayerFacts, build_inventory
from cachebake.artifact.schema import LAYER_MEDIA_TYPE
from cachebake.artifact.snapshot import CacheRoot, parse_root, snapshot_roots
from cachebake.errors import BadInput, DeferredInterrupt, Interrupted, Unsupported, from_os_error
from cachebake.gpu import GPUTargetSpec

# work_dir_beside: replay and fold-back work beside their --out as pack does
__all__ = ["CacheRoot", "parse_root", "pack_artifact", "check_out", "check_writable", "check_triton",
           "PackReport", "no_checkpoint", "work_dir_beside"]


@dataclass
class PackReport:
    # "created" (a new artifact), "added" (a target to one), "replaced" (this target's bake, by
    # another image), "unchanged" (packed again to the same image digest)
    status: str
    out: Path
    target: str
    manifest: BakeManifest
    manifest_digest: str
    targets: list[str]
    replaced_manifest_digest: str | None = None  # the image this pack replaced
    cleaned: list[str] = field(default_factory=list)  # what killed packs into --out left beside it

    @property
    def layer_digest(self) -> str:
        return self.manifest.layer.digest

    def to_dict(self) -> dict:
        d = {"status": self.status, "out": str(self.out), "target": self.target,
             "targets": self.targets, "manifest_digest": self.manifest_digest,
             "layer_digest": self.layer_digest, "layer_size": self.manifest.layer.size,
             "manifest": self.manifest.to_dict()}
        if self.replaced_manifest_digest:
            d["replaced_manifest_digest"] = self.replaced_manifest_digest
        if self.cleaned:
            d["cleaned"] = list(self.cleaned)
        return d


def _no_triton() -> Unsupported:
    return Unsupported(
        "Triton is not installed in this interpreter, so pack cannot record the Triton build the "
        "cache was compiled with (the artifact's fingerprint): every install that has Triton would "
        "refuse it (exit 4)", hint="install the `triton` extra, the Triton the kernels were compiled "
        "with: python3 -m pip install '.[triton]' (or 'cachebake[triton]')")


def check_triton() -> None:
    """Refuse (exit 7, naming the ``triton`` extra) where Triton cannot be imported: pack
    takes the fingerprint's Triton version and key from this interpreter, and a fingerprint
    without them is one no serving environment matches.  ``build`` calls it before round 1."""
    if importlib.util.find_spec("triton") is None:
        raise _no_triton()


def check_writable(path: Path, option: str, shown: Path | None = None) -> None:
    """Refuse (BadInput, naming ``option`` and ``shown`` or ``path``) unless ``path`` can be
    created or written in: probed by creating and removing a directory in it or in its
    nearest existing ancestor."""
    shown = shown or path
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"{option} {shown}: {parent} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".cachebake-probe-", dir=parent))
    except OSError as e:
        raise BadInput(f"{option} {shown}: cannot write in {parent}: {e.strerror or e}") from None


def check_out(out: os.PathLike | str) -> Path:
    """``--out`` as an absolute path, refused (BadInput) unless it is a cachebake artifact, an
    empty directory or a new path we can create, and not a symbolic link (the artifact is
    renamed into place at ``--out``: a link there would be swapped away, not written through):
    checked before any work (build runs it before round 1)."""
    out = Path(os.path.abspath(os.fspath(out)))
    if os.path.islink(out):  # the swap would replace the link itself and leave it beside --out
        raise BadInput(f"--out {out} is a symbolic link: name the directory itself")
    try:
        if out.exists() and not (out.is_dir() and (oci.is_artifact(out) or not any(out.iterdir()))):
            raise BadInput(f"--out {out} exists and is not a cachebake artifact; refusing to overwrite it")
    except OSError as e:
        raise from_os_error(e, out, "--out") from None
    check_writable(out.parent, "--out", shown=out)  # the artifact is renamed into place there
    return out


def _pick_target(target: str | None, inventory: Inventory) -> str | None:
    """The target the cache's kernels were compiled for, checked against ``--target``; None
    when the cache holds no kernels and no target was given (the visible GPU's then)."""
    found = sorted({k.target for k in inventory.kernels
                    if k.target and not k.target.startswith("None")})
    if len(found) > 1:
        raise BadInput(f"the cache holds kernels for {', '.join(found)}: a bake is for one GPU "
                       "target; pack each target's cache on its own")
    if target:
        spec = GPUTargetSpec.parse(target)
        if found and found[0] != spec.key:
            raise BadInput(f"--target {target} ({spec.key}) does not match the cache: its kernels "
                           f"were compiled for {found[0]}")
        return spec.key
    return found[0] if found else None


def pack_artifact(roots: list[CacheRoot], out: os.PathLike | str, *, target: str | None = None,
                  bake: Mapping | None = None, layer_root: str | None = None,
                  prune_ir: bool = False, record=None, fingerprint_from: Mapping | None = None,
                  progress: Callable[[int, int], Callable[[int], None]] | None = None,
                  checkpoint: Callable[[str], None] = no_checkpoint) -> PackReport:
    """Pack ``roots`` into ``out``.  ``progress(files, total_bytes)`` returns a per-file
    callback (bytes written); cachebake.cli.progress has one for terminals.

    ``bake``: the bake section as its builder wrote it (build, replay, fold-back), typed here
    (``BakeRecord.from_json``) before anything is written.
    ``record``: a cachebake.capture.record.CompileRecord to carry as its own blob.
    ``fingerprint_from``: fingerprint fields of the serving environment a bake was made for
    when this machine is not it (replay: torch/vllm versions, GPU name of the source bake; a
    fold-back of serve-time misses keeps its base bake's).
    ``checkpoint``: called with the name of each step of the swap into ``out``."""
    out = check_out(out)
    dest = ArtifactDestination(out, checkpoint)
    try:
        bake_record = BakeRecord.from_json(dict(bake or {}), "the bake section to pack", "")
        snap = snapshot_roots(roots, layer_root=layer_root, prune_ir=prune_ir)
        inventory = build_inventory(snap)
        # Fingerprint before writing: a target Triton cannot serve fails before any work.
        fp = current_fingerprint(_pick_target(target, inventory), bake_paths=snap.roots)
        fp = dataclasses.replace(fp, **dict(fingerprint_from or {}))
        if not fp.triton_key:
            raise _no_triton()
        # From here Ctrl-C is taken between files and steps, where the destination knows what
        # was left (errors.DeferredInterrupt: never swallowed in a finalizer)
        with DeferredInterrupt() as interrupts, dest.open(interrupts) as tmp:
            return _write(out, tmp, snap, fp, inventory, bake_record, record, progress, dest)
    except KeyboardInterrupt:
        raise Interrupted(dest.left()) from None
    except OSError as e:  # name the user's path, never our temp dir's
        raise from_os_error(e, out, "cannot write the artifact", hint=dest.left()) from None


def _write(out: Path, tmp: Path, snap, fp, inventory: Inventory, bake: BakeRecord, record,
           progress, dest: ArtifactDestination) -> PackReport:
    existing: dict[str, dict] = {}
    summaries: dict[str, dict] = {}
    status, replaced = "created", None
    if oci.is_artifact(out):
        old = oci.open_artifact(out)
        status = "added"
        for key, desc in old.entries_by_target().items():
            if key == fp.target:
                status, replaced = "replaced", desc.get("digest")
                continue
            ref = old.select(key)  # verifies what we carry over
            _copy_image(out, tmp, desc, ref)
            existing[key] = desc
            summaries[key] = _summary(ref.manifest, desc["digest"])
    blobs = tmp / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    shown = progress(len(snap.files), snap.data_size) if progress is not None else None

    def on_file(n: int) -> None:
        if shown is not None:
            shown(n)
        dest.check_interrupt()

    with tempfile.NamedTemporaryFile(dir=blobs, delete=False, prefix=".layer-") as f:
        stats = LayerWriter(f).write(snap, on_file)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f.name, oci.blob_path(tmp, stats.digest))
    record_desc = None
    if record is not None:
        digest, size = oci.write_blob(tmp, record.to_json())
        record_desc = oci.descriptor(record.media_type, digest, size)
    manifest = BakeManifest(
        target=fp.target, fingerprint=fp, roles=snap.roles, layer_root=snap.layer_root,
        layer=LayerFacts(media_type=LAYER_MEDIA_TYPE, diff_id=stats.diff_id, digest=stats.digest,
                         size=stats.size, tar_size=stats.tar_size,
                         uncompressed_size=stats.uncompressed_size, entries=stats.entries,
                         files=stats.files, compression=COMPRESSION),
        inventory=inventory, bake=bake, record=record_desc)
    desc = oci.add_image(tmp, manifest)
    existing[fp.target] = desc
    summaries[fp.target] = _summary(manifest, desc["digest"])
    oci.write_index(tmp, list(existing.values()), summaries)
    dest.finalize()
    if status == "replaced" and replaced == desc["digest"]:
        status, replaced = "unchanged", None  # the same bytes again: nothing was replaced
    return PackReport(status, out, fp.target, manifest, desc["digest"], sorted(existing), replaced,
                      cleaned=dest.cleaned)


def _summary(manifest: BakeManifest, manifest_digest: str) -> dict:
    return {"manifest_digest": manifest_digest, **manifest.to_dict()}


def _copy_image(src: Path, dst: Path, desc: dict, ref) -> None:
    # the image manifest, verified against its digest by ``old.select`` a moment ago
    manifest = jsonio.parse_json(oci.blob_path(src, desc["digest"]).read_bytes(), "image manifest")
    extra = [ref.manifest.record] if ref.manifest.record else []  # the compile record's blob
    for d in (desc, manifest["config"], *manifest["layers"], *extra):
        target = oci.blob_path(dst, d["digest"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(oci.blob_path(src, d["digest"]), target)
