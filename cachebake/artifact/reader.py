"""Open what ``cachebake install`` was given: an artifact dir / OCI layout, or a bare layer.

A source has two methods, and install needs nothing else from it:

``select(target) -> BakeRef``
    the bake for a GPU target (``cuda:90``; None: the only one), its manifest schema-checked
    (cachebake.artifact.schema) and pinned by digests back to something the user named;
``open_layer(ref)`` -> a context manager giving the layer stream
    the compressed layer blob, read once front to back with ``read(n)``.  The stream checks
    itself (``cachebake.artifact.oci.VerifyingReader`` is the reference): CorruptArtifact as
    soon as more than ``ref.layer_size`` bytes arrive, and at the end (``read`` returning
    b"") unless the bytes were exactly the blob ``ref.layer_digest`` names.  No seek, no
    length: a registry source can hand over the HTTP body of the blob as it downloads, wrapped
    in ``VerifyingReader(response, ref.layer_digest, ref.layer_size)``; install decompresses,
    checks and writes it into a private staging dir while it arrives and makes nothing
    visible before that end-of-stream check passed (install/extract.py).  Optional:
    ``remaining`` (bytes still to come), which lets a refusal read a short rest of the blob to
    report a digest mismatch as such; ``close()`` when the context ends (a refusal may leave
    the stream unread: close the connection).  A read must not block forever (give the HTTP
    read a timeout and raise on it): the decompressing thread is joined on a refusal.

Artifact directories and bare OCI layouts go through the artifact reader
(``cachebake.artifact.oci.Artifact``).  A bare ``.tar.zst`` layer comes with its manifest:
``cachebake.json`` next to it (or ``<name>.json``); that manifest is then the root of trust.
Registry references (docker://, oci://) are fetched by cachebake.distribute.registry into a
private OCI layout, which comes here as an artifact directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cachebake import jsonio
from cachebake.artifact import schema
from cachebake.artifact.manifest import BakeManifest
from cachebake.artifact.oci import Artifact, BakeRef, VerifyingReader
from cachebake.errors import BadInput, Unsupported
from cachebake.gpu import GPUTargetSpec


def open_source(path: str):
    p = Path(path)
    if not os.path.lexists(p) and re.match(r"^[a-z][a-z0-9+.-]*://|^[\w.-]+(:\d+)?/[\w./-]+[:@]", path):
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
        self.path = Path(os.path.realpath(path))  # the user named it, links included
        stem = path.name.rsplit(".tar.zst", 1)[0].rsplit(".tzst", 1)[0]
        for candidate in (self.path.with_name(stem + ".json"), self.path.with_name("cachebake.json")):
            if os.path.lexists(candidate):
                break
        else:
            raise BadInput(f"{path}: a bare layer needs its manifest beside it "
                           f"({stem}.json or cachebake.json)")
        self.manifest_name = candidate.name
        doc = jsonio.load_document(candidate, candidate.name, schema.CAP_SUMMARY)
        self.bakes = schema.check_summary(doc, candidate.name)

    def targets(self) -> list[str]:
        return sorted(self.bakes)

    def select(self, target: str | None) -> BakeRef:
        t = GPUTargetSpec.parse(target).key if target else None
        if t is None and len(self.bakes) == 1:
            t = next(iter(self.bakes))
        if t not in self.bakes:
            raise Unsupported(f"no bake for {target} in {self.manifest_name} (has: "
                              f"{', '.join(self.targets()) or 'none'})")
        bake = {k: v for k, v in self.bakes[t].items() if k != "image_manifest_digest"}
        manifest = BakeManifest.from_dict(bake, f"{self.manifest_name} bakes.{t}")
        return BakeRef(t, "", manifest.layer.digest, manifest.layer.size, manifest)

    def open_layer(self, ref: BakeRef) -> VerifyingReader:
        return VerifyingReader.open(self.path, ref.layer_digest, ref.layer_size, f"layer {self.path.name}")
