"""merge: several artifacts' bakes into one artifact, one bake per GPU target.

A build farm bakes each GPU target on a machine of its own (the bake Job of
cachebake.distribute.bakejob, a replay for a GPU nobody has at hand); ``merge`` puts the results
into one OCI layout whose index has one image per target, the layout ``pack`` writes when it
adds a target to an artifact.  ``install`` then picks the local GPU's bake (its ``--target``,
else the serving GPU's), and ``push`` writes one tag per target (``REPO:sm_90``): an image
volume names one tag, because a kubelet mounting an index takes its first child (an OCI
index's ``platform`` selects a CPU, not a GPU).

Every image carried over is read as install reads it: manifest and config through their
digests, the manifest schema-checked, the layer streamed through the verifying reader, the
compile record through its digest.  Blobs are content-addressed, so what two bakes share (a
compile record, a config) is stored once.  Two bakes for one target are refused, naming both
artifacts: which one is meant is the user's call.  ``--out`` is written as pack writes it, through
the same destination (cachebake.artifact.destination): in a temp sibling swapped into place, so it
is the old artifact or the merged one, never neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cachebake.artifact import oci
from cachebake.artifact.destination import ArtifactDestination, no_checkpoint
from cachebake.artifact.pack import _summary, check_out
from cachebake.gpu import GPUTargetSpec
from cachebake.errors import BadInput, DeferredInterrupt, Interrupted, from_os_error

_CHUNK = 1 << 20


@dataclass
class MergeReport:
    out: Path
    bakes: dict[str, dict] = field(default_factory=dict)  # target -> source, manifest digest
    blobs: int = 0  # distinct blobs in the merged layout
    shared: int = 0  # blobs more than one bake references, stored once

    @property
    def targets(self) -> list[str]:
        return sorted(self.bakes)

    def to_dict(self) -> dict:
        return {"out": str(self.out), "targets": self.targets, "bakes": self.bakes,
                "blobs": self.blobs, "shared_blobs": self.shared}

    def render(self, console) -> None:
        from rich.markup import escape

        console.print(f"merged {len(self.bakes)} bakes into [bold]{escape(str(self.out))}[/] "
                      f"({self.blobs} blobs, {self.shared} shared)")
        for t, b in sorted(self.bakes.items()):
            console.print(f"  {escape(t)}: {escape(b['source'])} image {escape(b['manifest_digest'])}")


def merge_artifacts(sources: list[os.PathLike | str], out: os.PathLike | str,
                    checkpoint=no_checkpoint) -> MergeReport:
    if len(sources) < 2:
        raise BadInput("merge needs at least two artifacts")
    out = check_out(out)
    # read and verify everything before writing anything
    chosen: dict[str, tuple[str, oci.Artifact, dict, oci.BakeRef]] = {}
    for src in sources:
        art = oci.open_artifact(src)
        for key, desc in sorted(art.entries_by_target().items()):
            if key in chosen:
                raise BadInput(f"two bakes for {key}: in {chosen[key][0]} and in {os.fspath(src)}; "
                               "merge takes one bake per GPU target",
                               hint="leave one out, or `diff` them to choose")
            ref = art.select(key)
            with art.open_layer(ref) as reader:  # digest and size, at EOF
                while reader.read(_CHUNK):
                    pass
            if _has_record(art, ref):
                art.read_json_blob(ref.manifest.record)  # digest-checked
            chosen[key] = (os.fspath(src), art, desc, ref)
    dest = ArtifactDestination(out, checkpoint, command="merge")
    try:
        with DeferredInterrupt() as interrupts, dest.open(interrupts) as tmp:
            return _write(out, tmp, chosen, dest)
    except KeyboardInterrupt:
        raise Interrupted(dest.left()) from None
    except OSError as e:
        raise from_os_error(e, out, "cannot write the artifact", hint=dest.left()) from None


def _has_record(art: oci.Artifact, ref: oci.BakeRef) -> bool:
    """Whether the bake's compile record is there to carry.  A bake pulled from a registry has
    none (skopeo copies an image's config and layers, not the record the manifest names), and
    install reads such a bake without it: the merged artifact is then as the pull left it."""
    return bool(ref.manifest.record) and os.path.lexists(oci.blob_path(art.layout, ref.manifest.record["digest"]))


def _copy_verified(layout: Path, desc: dict, target: Path) -> None:
    """Copy one blob, opened as a regular file (no link followed) and checked against its
    digest and size again as it is copied: verified a moment ago, it may have changed since."""
    src = oci.VerifyingReader.open(oci.blob_path(layout, desc["digest"]), desc["digest"], desc["size"])
    try:
        with open(target, "xb") as f:
            while chunk := src.read(_CHUNK):
                f.write(chunk)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    finally:
        src.close()


def _write(out: Path, tmp: Path, chosen, dest: ArtifactDestination) -> MergeReport:
    report = MergeReport(out)
    uses: dict[str, int] = {}
    entries, summaries = [], {}
    for key, (src, art, desc, ref) in sorted(chosen.items()):
        manifest = art.read_json_blob(desc, f"blob {desc['digest'][:19]} (image manifest)")
        extra = [ref.manifest.record] if _has_record(art, ref) else []
        for d in (desc, manifest["config"], *manifest["layers"], *extra):
            uses[d["digest"]] = uses.get(d["digest"], 0) + 1
            target = oci.blob_path(tmp, d["digest"])
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_verified(art.layout, d, target)
            dest.step("blob")
        # the index entry as pack writes it: ref.name sm_90 + the target annotation
        entries.append({**desc, "annotations": {**(desc.get("annotations") or {}), oci.ANN_TARGET: key,
                                                oci.REF_NAME: GPUTargetSpec.parse(key).ref_name}})
        summaries[key] = _summary(ref.manifest, desc["digest"])
        report.bakes[key] = {"source": src, "manifest_digest": desc["digest"],
                             "layer_digest": ref.layer_digest}
    oci.write_index(tmp, entries, summaries)
    dest.finalize()
    report.blobs = len(uses)
    report.shared = sum(1 for n in uses.values() if n > 1)
    return report
