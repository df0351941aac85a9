"""inspect: read an artifact, verifying every blob, into a plain report for rendering.

Reads every source ``install`` reads (an artifact directory, a bare or skopeo-copied OCI
layout, a ``.tar.zst`` layer with its ``cachebake.json``).  Every bake shown has had each of its
blobs checked against its digest and size: the image manifest and config as they are read
(the OCI reader), the layer by streaming it through the same verifying reader install uses.  A
corrupted, truncated or missing blob is a CorruptArtifact (exit 5), never a clean-looking
report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cachebake.artifact.oci import BakeRef

_CHUNK = 1 << 20


@dataclass
class ArtifactReport:
    artifact: str
    kind: str  # "oci-layout" or "layer-file"
    targets: list[str]
    bakes: list[BakeRef] = field(default_factory=list)
    records: dict[str, dict] = field(default_factory=dict)  # target -> compile record summary

    def to_dict(self) -> dict:
        return {
            "artifact": self.artifact,
            "kind": self.kind,
            "targets": self.targets,
            "bakes": [{"target": b.target, "manifest_digest": b.manifest_digest or None,
                       "layer_digest": b.layer_digest, "layer_size": b.layer_size,
                       "verified": True,  # every blob of this bake matched its digest and size
                       "summary": b.manifest.inventory.summary(), "manifest": b.manifest.to_dict(),
                       "record": self.records.get(b.target)}
                      for b in self.bakes],
        }


def verify_layer(source, ref: BakeRef) -> None:
    """Stream the layer blob through the verifying reader (digest and size, at EOF)."""
    with source.open_layer(ref) as reader:
        while reader.read(_CHUNK):
            pass


def inspect_artifact(path, target: str | None = None) -> ArtifactReport:
    # install's opener: the same sources, the same checks; inspect writes nothing.
    from cachebake.artifact.reader import LayerFile, open_source

    source = open_source(str(path))
    targets = source.targets()
    chosen = [target] if target else targets
    bakes = []
    for t in chosen:
        ref = source.select(t)
        verify_layer(source, ref)
        bakes.append(ref)
    kind = "layer-file" if isinstance(source, LayerFile) else "oci-layout"
    report = ArtifactReport(str(Path(path)), kind, targets, bakes)
    for ref in report.bakes:
        if ref.manifest.record and hasattr(source, "read_json_blob"):
            # read through its digest like every other blob (a bare layer file carries none)
            from cachebake.capture.record import CompileRecord

            record = CompileRecord.from_dict(source.read_json_blob(ref.manifest.record))
            report.records[ref.target] = record.summary()
    return report
