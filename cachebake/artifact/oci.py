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
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cachebake.artifact.fingerprint import GPUTargetSpec
from cachebake.artifact.manifest import FORMAT_VERSION, BakeManifest
from cachebake.errors import BadInput, CorruptArtifact, Unsupported

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
MAX_JSON_BLOB = 64 << 20  # manifests and configs are small; refuse to read a huge "json" blob


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


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
        ANN_FINGERPRINT: json.dumps(bake.fingerprint, sort_keys=True, separators=(",", ":")),
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
    how = (bake.bake or {}).get("unverified_on_target")
    if not isinstance(how, dict):
        return None
    built_on = how.get("built_on")
    return f"{how.get('how', 'unknown')}" + (f" on {built_on}" if built_on else "")


def write_index(layout: Path, entries: list[dict], bakes: dict[str, dict]) -> None:
    entries = sorted(entries, key=lambda d: d["annotations"][ANN_TARGET])
    (layout / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": entries}
    (layout / "index.json").write_bytes(canonical_json(index))
    summary = {"format_version": FORMAT_VERSION, "bakes": dict(sorted(bakes.items()))}
    (layout / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------- reading


class VerifyingReader:
    """A file reader that hashes what it returns and raises CorruptArtifact at EOF when the
    bytes are not exactly the declared blob (wrong digest, truncated, or longer)."""

    def __init__(self, path: Path, digest: str, size: int):
        self._f = open(path, "rb")
        self._sha = hashlib.sha256()
        self._want, self._size, self._seen, self._path = digest, size, 0, path

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n if n is not None and n >= 0 else -1)
        self._sha.update(data)
        self._seen += len(data)
        if self._seen > self._size:
            raise CorruptArtifact(f"blob {self._want[:19]} is longer than the {self._size} bytes declared")
        if not data or (n is None or n < 0):
            self.check()
        return data

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
    """An OCI layout holding cachebake images, read through verified digests only."""

    def __init__(self, layout: Path):
        self.layout = layout
        try:
            marker = json.loads((layout / "oci-layout").read_bytes())
            index = json.loads((layout / "index.json").read_bytes())
        except FileNotFoundError:
            raise BadInput(f"{layout}: not an OCI image layout (no oci-layout / index.json)") from None
        except ValueError as e:
            raise CorruptArtifact(f"{layout}: index is not valid JSON: {e}") from None
        if marker.get("imageLayoutVersion") != "1.0.0":
            raise Unsupported(f"{layout}: OCI layout version {marker.get('imageLayoutVersion')!r} is not supported")
        manifests = index.get("manifests")
        if index.get("schemaVersion") != 2 or not isinstance(manifests, list):
            raise CorruptArtifact(f"{layout}: index.json is not an OCI index")
        self.index_entries = [m for m in manifests if isinstance(m, dict)]

    def entries_by_target(self) -> dict[str, dict]:
        """Index entries by GPU target.  ``skopeo copy`` (and so a registry round trip) rewrites
        index.json keeping only the ``ref.name`` annotation (``sm_90``), so that is the
        fallback; ``select`` checks the target against the digest-verified config anyway."""
        out: dict[str, dict] = {}
        for m in self.index_entries:
            ann = m.get("annotations") or {}
            if ann.get(ANN_TARGET):
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

    def read_json_blob(self, desc: dict) -> dict:
        digest, size = desc.get("digest"), desc.get("size")
        if not isinstance(size, int) or size < 0 or size > MAX_JSON_BLOB:
            raise CorruptArtifact(f"descriptor {digest} declares an invalid size {size!r}")
        path = blob_path(self.layout, digest)
        try:
            with VerifyingReader(path, digest, size) as r:
                data = r.read()
        except FileNotFoundError:
            raise CorruptArtifact(f"blob {digest[:19]} is missing from {self.layout}") from None
        try:
            return json.loads(data)
        except ValueError:
            raise CorruptArtifact(f"blob {digest[:19]} is not JSON") from None

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
        manifest = self.read_json_blob(desc)
        layers = manifest.get("layers") or []
        if len(layers) != 1:
            raise CorruptArtifact(f"image for {key} has {len(layers)} layers; cachebake images have one")
        config = self.read_json_blob(manifest.get("config") or {})
        try:
            bake_json = config["config"]["Labels"][LABEL_MANIFEST]
            bake = BakeManifest.from_dict(json.loads(bake_json))
        except (KeyError, TypeError, ValueError):
            raise CorruptArtifact(f"image for {key} carries no cachebake manifest") from None
        layer = layers[0]
        if layer.get("digest") != bake.layer.digest or layer.get("size") != bake.layer.size:
            raise CorruptArtifact(f"image for {key}: layer descriptor disagrees with the cachebake manifest")
        if bake.target != key:
            raise CorruptArtifact(f"index entry {key} holds a bake for {bake.target}")
        return BakeRef(key, desc["digest"], layer["digest"], layer["size"], bake)

    def open_layer(self, ref: BakeRef) -> VerifyingReader:
        path = blob_path(self.layout, ref.layer_digest)
        if not path.is_file():
            raise CorruptArtifact(f"layer blob {ref.layer_digest[:19]} is missing from {self.layout}")
        return VerifyingReader(path, ref.layer_digest, ref.layer_size)


def open_artifact(path: os.PathLike | str) -> Artifact:
    p = Path(path)
    if not p.exists():
        raise BadInput(f"{p}: no such artifact")
    if not p.is_dir():
        raise BadInput(f"{p}: not an artifact directory (an OCI image layout)")
    return Artifact(p)


def is_artifact(path: Path) -> bool:
    return (path / "oci-layout").is_file() and (path / "index.json").is_file()
