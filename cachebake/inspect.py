"""inspect: read an artifact (verifying every blob) into a plain report for rendering."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cachebake.artifact.oci import BakeRef, open_artifact


@dataclass
class ArtifactReport:
    path: str
    targets: list[str]
    bakes: list[BakeRef] = field(default_factory=list)
    records: dict[str, dict] = field(default_factory=dict)  # target -> compile record summary

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "targets": self.targets,
            "bakes": [{"target": b.target, "image_manifest_digest": b.manifest_digest,
                       "layer_digest": b.layer_digest, "layer_size": b.layer_size,
                       "summary": b.manifest.inventory.summary(), "manifest": b.manifest.to_dict(),
                       "record": self.records.get(b.target)}
                      for b in self.bakes],
        }


def inspect_artifact(path, target: str | None = None) -> ArtifactReport:
    art = open_artifact(path)
    targets = art.targets()
    chosen = [target] if target else targets
    report = ArtifactReport(str(Path(path)), targets, [art.select(t) for t in chosen])
    for ref in report.bakes:
        if ref.manifest.record:  # read through its digest like every other blob
            from cachebake.replay.record import CompileRecord

            record = CompileRecord.from_dict(art.read_json_blob(ref.manifest.record))
            report.records[ref.target] = record.summary()
    return report
