"""The OCI image layout that carries bakes: write it, and read it back verifying every blob.

Layout (https://github.com/opencontainers/image-spec/blob/main/image-layout.md):
``oci-layout``, ``index.json``, ``blobs/sha256/<hex>``.  The index has one image manifest per
GPU target, named ``sm_90`` (ref.name) and annotated ``dev.cachebake.target: cuda:90``, so one
artifact holds a build farm's bakes and install picks the one for its GPU.  Each image is an
ordinary single-layer image: skopeo copies it to a registry, umoci unpacks it, Kubernetes
mounts it as an image volume.  The bake manifest rides in the image config's labels, the one
place every copy keeps; ``cachebake.json`` at the root repeats it for humans and scripts.

We write the layout ourselves: it is three small JSON documents and content-addressed files,
and the Python OCI libraries available either need a registry or a container engine.  skopeo and
umoci validate what we write in the tests.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cachebake import jsonio
from cachebake.artifact import schema
from cachebake.artifact.manifest import FORMAT_VERSION, BakeManifest
from cachebake.errors import BadInput, CorruptArtifact, InvalidDocument, UnsafeArtifact, Unsupported
from cachebake.gpu import GPUTargetSpec
from cachebake.jsonio import canonical_json

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
ANN_TARGET = "dev.cachebake.target"
ANN_FINGERPRINT = "dev.cachebake.fingerprint"
LABEL_MANIFEST = "dev.cachebake.manifest"
REF_NAME = "org.opencontainers.image.ref.name"
# Set on bakes made without a GPU of their target (replay, cross-target build): unverified there
# until `cachebake verify` runs on one.  Value: how it was made, e.g. "replay" or "cross-bake on cuda:90".
ANN_UNVERIFIED = "dev.cachebake.unverified-on-target"
SUMMARY_FILE = "cachebake.json"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_path(layout: Path, digest: str) -> Path:
    if not _DIGEST.match(digest or ""):
        raise CorruptArtifact(f"malformed digest {digest!r}")
    return layout / "blobs" / "sha256" / digest.split(":", 1)[1]


def write_blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = sha256_digest(data)
    path = blob_path(layout, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return digest, len(data)


def descriptor(media_type: str, digest: str, size: int, annotations: dict | None = None, **extra) -> dict:
    d = {"mediaType": media_type, "digest": digest, "size": size, **extra}
    if annotations:
        d["annotations"] = annotations
    return d


def image_config(bake: BakeManifest) -> dict:
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {LABEL_MANIFEST: bake.to_json(), ANN_TARGET: bake.target}},
        "rootfs": {"type": "layers", "diff_ids": [bake.layer.diff_id]},
        "history": [{"created_by": "cachebake pack", "comment": bake.layer.compression}],
    }


def add_image(layout: Path, bake: BakeManifest) -> dict:
    """Write config + image manifest for one target's bake (its layer blob is already in
    ``layout``) and return the index descriptor for it."""
    cfg_digest, cfg_size = write_blob(layout, canonical_json(image_config(bake)))
    target = GPUTargetSpec.parse(bake.target)
    annotations = {
        ANN_TARGET: bake.target,
        ANN_FINGERPRINT: jsonio.dumps(bake.fingerprint.to_json(), sort_keys=True, separators=(",", ":")),
        "org.opencontainers.image.title": f"cachebake {target.ref_name}",
        "org.opencontainers.image.description": "Triton/vLLM kernel cache baked by cachebake",
    }
    unverified = unverified_note(bake)
    if unverified:
        annotations[ANN_UNVERIFIED] = unverified
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": descriptor(CONFIG_MEDIA_TYPE, cfg_digest, cfg_size),
        "layers": [descriptor(bake.layer.media_type, bake.layer.digest, bake.layer.size)],
        "annotations": annotations,
    }
    m_digest, m_size = write_blob(layout, canonical_json(manifest))
    index_ann = {REF_NAME: target.ref_name, ANN_TARGET: bake.target}
    if unverified:
        index_ann[ANN_UNVERIFIED] = unverified
    return descriptor(MANIFEST_MEDIA_TYPE, m_digest, m_size, index_ann,
                      platform={"architecture": "amd64", "os": "linux"})


def unverified_note(bake: BakeManifest) -> str | None:
    """How a bake made without a GPU of its target was made, or None for an ordinary bake."""
    how = bake.bake.unverified_on_target
    if how is None:
        return None
    built_on = how.get("built_on")
    return f"{how.get('how', 'unknown')}" + (f" on {built_on}" if built_on else "")


def write_index(layout: Path, entries: list[dict], bakes: dict[str, dict]) -> None:
    entries = sorted(entries, key=lambda d: d["annotations"][ANN_TARGET])
    (layout / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": entries}
    (layout / "index.json").write_bytes(canonical_json(index))
    summary = {"format_version": FORMAT_VERSION, "bakes": dict(sorted(bakes.items()))}
    (layout / SUMMARY_FILE).write_text(jsonio.dumps(summary, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------- reading


class VerifyingReader:
    """A blob as a forward-only stream that checks itself: the contract of a layer stream.

    ``read(n)`` returns up to ``n`` bytes; it raises CorruptArtifact as soon as more than the
    declared ``size`` arrived, and at the end (``b""``) unless exactly ``size`` bytes arrived
    whose sha256 is ``digest``.  So a consumer that reads to the end has either the declared
    blob or an exception, and needs nothing else (no seek, no length).  Wraps any binary file
    object: a local blob (``open``), or a registry response body."""

    def __init__(self, fileobj, digest: str, size: int):
        self._f = fileobj
        self._sha = hashlib.sha256()
        self._want, self._size, self._seen = digest, size, 0

    @classmethod
    def open(cls, path: Path, digest: str, size: int, document: str = "") -> "VerifyingReader":
        """A local blob: a regular file, opened without following a link or blocking on a FIFO."""
        fd = jsonio.open_regular(path, document or f"blob {digest[:19]}")
        return cls(os.fdopen(fd, "rb", buffering=0), digest, size)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._size - self._seen + 1  # never more than one byte past the declared size
        data = self._f.read(n)
        self._sha.update(data)
        self._seen += len(data)
        if self._seen > self._size:
            raise CorruptArtifact(f"blob {self._want[:19]} is longer than the {self._size} bytes declared")
        if not data:
            self.check()
        return data

    def readinto(self, buf) -> int:  # zstandard's stream_reader prefers read(); kept for io users
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    @property
    def remaining(self) -> int:
        """Bytes still to come of the declared size."""
        return max(0, self._size - self._seen)

    def check(self) -> None:
        if self._seen != self._size:
            raise CorruptArtifact(f"blob {self._want[:19]} is truncated: {self._seen} of {self._size} bytes")
        if "sha256:" + self._sha.hexdigest() != self._want:
            raise CorruptArtifact(f"blob {self._want[:19]} does not match its digest (corrupted or tampered)")

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class BakeRef:
    target: str
    manifest_digest: str
    layer_digest: str
    layer_size: int
    manifest: BakeManifest


class Artifact:
    """An OCI layout holding cachebake images, read through verified digests only; every
    document is read with bounds and schema-checked (cachebake.artifact.schema) before use."""

    def __init__(self, layout: Path):
        self.layout = layout
        try:
            marker = jsonio.load_document(layout / "oci-layout", "oci-layout", schema.CAP_LAYOUT_MARKER,
                                          missing=None)
            index = jsonio.load_document(layout / "index.json", "index.json", schema.CAP_INDEX, missing=None)
        except FileNotFoundError:
            raise BadInput(f"{layout}: not an OCI image layout (no oci-layout / index.json)") from None
        schema.check_layout_marker(marker)
        schema.check_index(index)
        self.index_entries = index["manifests"]

    def entries_by_target(self) -> dict[str, dict]:
        """Index entries by GPU target.  ``skopeo copy`` (and so a registry round trip) rewrites
        index.json keeping only the ``ref.name`` annotation (``sm_90``), so that is the
        fallback; ``select`` checks the target against the digest-verified config anyway."""
        out: dict[str, dict] = {}
        for i, m in enumerate(self.index_entries):
            ann = m.get("annotations") or {}
            if ANN_TARGET in ann:
                if not schema.TARGET_RE.match(ann[ANN_TARGET]):
                    raise InvalidDocument("index.json", f"manifests[{i}].annotations.{ANN_TARGET}",
                                          f"{ann[ANN_TARGET][:40]!r} is not a GPU target like cuda:90")
                out[ann[ANN_TARGET]] = m
        for m in self.index_entries:
            ann = m.get("annotations") or {}
            if ANN_TARGET in ann or REF_NAME not in ann:
                continue
            try:
                out.setdefault(GPUTargetSpec.parse(ann[REF_NAME]).key, m)
            except BadInput:
                continue  # some other image in a shared layout
        return out

    def targets(self) -> list[str]:
        return sorted(self.entries_by_target())

    def read_json_blob(self, desc: dict, document: str | None = None, cap: int = schema.CAP_BLOB):
        """A JSON blob named by a descriptor: bounded, verified, parsed (not schema-checked:
        that is the caller's, who knows what the blob is)."""
        schema.Checker(document or "descriptor").descriptor(desc, "")
        digest, size = desc["digest"], desc["size"]
        document = document or f"blob {digest[:19]}"
        if size > cap:
            raise InvalidDocument(document, "", f"is declared {size} bytes, over the {cap} this reader accepts")
        data = jsonio.read_document(blob_path(self.layout, digest), document, cap)
        if len(data) != size:
            raise CorruptArtifact(f"blob {digest[:19]} is {len(data)} bytes, {size} declared")
        if sha256_digest(data) != digest:
            raise CorruptArtifact(f"blob {digest[:19]} does not match its digest (corrupted or tampered)")
        return jsonio.parse_json(data, document)

    def select(self, target: str | None = None) -> BakeRef:
        """The bake for ``target`` (``sm_90``/``cuda:90``), or the only one if None."""
        by_target = self.entries_by_target()
        if not by_target:
            raise Unsupported(f"{self.layout}: holds no cachebake images")
        if target is None:
            if len(by_target) > 1:
                raise BadInput(f"{self.layout} holds bakes for {', '.join(sorted(by_target))}: pass --target")
            key = next(iter(by_target))
        else:
            key = GPUTargetSpec.parse(target).key
            if key not in by_target:
                raise Unsupported(f"no bake for {key} in {self.layout} (it has: {', '.join(sorted(by_target))})")
        desc = by_target[key]
        if desc.get("mediaType") != MANIFEST_MEDIA_TYPE:
            raise Unsupported(f"index entry for {key} is a {desc.get('mediaType')}, not an image manifest")
        doc = f"blob {desc['digest'][:19]} (image manifest)"
        manifest = schema.check_image_manifest(self.read_json_blob(desc, doc, schema.CAP_IMAGE_MANIFEST), doc)
        doc = f"blob {manifest['config']['digest'][:19]} (image config)"
        config = self.read_json_blob(manifest["config"], doc, schema.CAP_CONFIG)
        label = schema.check_config(config, doc, LABEL_MANIFEST)
        label_doc = f"{doc} label {LABEL_MANIFEST}"
        if not isinstance(label, str):
            raise InvalidDocument(doc, f"config.Labels.{LABEL_MANIFEST}", "must be a string")
        bake = BakeManifest.from_dict(jsonio.parse_json(label, label_doc), label_doc)
        layer = manifest["layers"][0]
        if layer["digest"] != bake.layer.digest or layer["size"] != bake.layer.size:
            raise CorruptArtifact(f"image for {key}: layer descriptor disagrees with the cachebake manifest")
        if bake.target != key:
            raise CorruptArtifact(f"index entry {key} holds a bake for {bake.target}")
        rootfs = config.get("rootfs")
        if not isinstance(rootfs, dict) or rootfs.get("diff_ids") != [bake.layer.diff_id]:
            # install checks the tar against the label's diff_id; the config's must be that one
            # too, or a runtime that unpacks this image by its config gets another tree
            raise UnsafeArtifact(f"image for {key}: the config's rootfs.diff_ids is not the one layer "
                                 "the cachebake manifest declares")
        return BakeRef(key, desc["digest"], layer["digest"], layer["size"], bake)

    def open_layer(self, ref: BakeRef) -> VerifyingReader:
        """The layer blob as a self-verifying stream (see VerifyingReader)."""
        return VerifyingReader.open(blob_path(self.layout, ref.layer_digest), ref.layer_digest, ref.layer_size,
                                    f"layer blob {ref.layer_digest[:19]}")


def open_artifact(path: os.PathLike | str) -> Artifact:
    p = Path(path)
    if not p.exists():
        raise BadInput(f"{p}: no such artifact")
    if not p.is_dir():
        raise BadInput(f"{p}: not an artifact directory (an OCI image layout)")
    return Artifact(p)


def is_artifact(path: Path) -> bool:
    return (path / "oci-layout").is_file() and (path / "index.json").is_file()
