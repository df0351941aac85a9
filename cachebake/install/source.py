"""Open what ``cachebake install`` was given: an artifact dir / OCI layout, or a bare layer.

Artifact directories and bare OCI layouts go through the artifact reader
(``cachebake.artifact.oci.open_artifact``), which verifies every blob it reads.  A bare
``.tar.zst`` layer comes with its manifest: ``cachebake.json`` next to it (or ``<name>.json``);
that manifest is then the root of trust and the layer is checked against its digest.
Registry references (docker://, oci://) are fetched by cachebake.distribute.registry into a
private OCI layout, which comes here as an artifact directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from cachebake.artifact.fingerprint import GPUTargetSpec
from cachebake.artifact.manifest import BakeManifest
from cachebake.artifact.oci import Artifact, BakeRef, VerifyingReader
from cachebake.errors import BadInput, CorruptArtifact, Unsupported


def open_source(path: str):
    p = Path(path)
    if not p.exists() and re.match(r"^[a-z][a-z0-9+.-]*://|^[\w.-]+(:\d+)?/[\w./-]+[:@]", path):
        # `cachebake install docker://...` goes to cachebake.distribute.registry, never here.
        raise BadInput(f"{path}: no such artifact; a registry reference is written "
                       f"docker://{path.split('://')[-1]}")
    if not p.exists():
        raise BadInput(f"{path}: no such artifact")
    if p.is_file() and p.name.endswith((".tar.zst", ".tzst")):
        return LayerFile(p)
    if p.is_dir():
        return Artifact(p)
    raise BadInput(f"{path}: not an artifact directory, OCI layout or .tar.zst layer")


class LayerFile:
    """A ``.tar.zst`` layer plus the ``cachebake.json`` beside it."""

    def __init__(self, path: Path):
        self.path = path
        stem = path.name.rsplit(".tar.zst", 1)[0].rsplit(".tzst", 1)[0]
        for candidate in (path.with_name(stem + ".json"), path.with_name("cachebake.json")):
            if candidate.is_file():
                break
        else:
            raise BadInput(f"{path}: a bare layer needs its manifest beside it "
                           f"({stem}.json or cachebake.json)")
        try:
            doc = json.loads(candidate.read_text())
        except ValueError as e:
            raise CorruptArtifact(f"{candidate}: not JSON ({e})") from None
        if doc.get("format_version") != 1:
            raise Unsupported(f"{candidate}: format_version {doc.get('format_version')!r} is not "
                              "one this cachebake reads (1)")
        self.bakes = doc.get("bakes") or {}

    def targets(self) -> list[str]:
        return sorted(self.bakes)

    def select(self, target: str | None) -> BakeRef:
        t = GPUTargetSpec.parse(target).key if target else None
        if t is None and len(self.bakes) == 1:
            t = next(iter(self.bakes))
        if t not in self.bakes:
            raise Unsupported(f"no bake for {target} in {self.path.name} (has: "
                              f"{', '.join(self.targets()) or 'none'})")
        bake = dict(self.bakes[t])
        bake.pop("image_manifest_digest", None)
        layer = bake.get("layer") or {}
        try:
            digest = bake.pop("layer_digest", None) or layer["digest"]
            size = int(bake.pop("layer_size", None) or layer["size"])
        except (KeyError, TypeError, ValueError):
            raise CorruptArtifact(f"manifest entry for {t} names no layer digest and size") from None
        return BakeRef(t, "", digest, size, BakeManifest.from_dict(bake))

    def open_layer(self, ref: BakeRef) -> VerifyingReader:
        return VerifyingReader(self.path, ref.layer_digest, ref.layer_size)
