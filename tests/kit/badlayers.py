"""Build layers and OCI artifacts by hand, good or deliberately bad, for the install tests.

The real packer (cachebake.artifact.pack) only writes well-formed layers, so hostile inputs
(traversal, links, devices, bombs, lying manifests) are assembled here with tarfile +
zstandard and wrapped in an OCI layout the same way the packer lays one out (index ->
image manifest -> config whose label holds the per-target manifest, + cachebake.json), so
each bad input goes through the whole install path, not just the extractor.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

import zstandard

MTIME = 1_700_000_000
LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar+zstd"


@dataclass
class Entry:
    name: str
    type: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int | None = None
    linkname: str = ""
    size: int | None = None  # override the header size (for lying headers)


def tree_entries(root: Path) -> list[Entry]:
    """Entries for every dir and file below ``root`` (whose children are role dirs), sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        if rel != ".":
            out.append(Entry(rel, tarfile.DIRTYPE))
        for f in sorted(filenames):
            p = Path(dirpath) / f
            name = f if rel == "." else f"{rel}/{f}"
            out.append(Entry(name, data=p.read_bytes(), mode=0o755 if f.endswith(".so") else 0o644))
    return sorted(out, key=lambda e: e.name)


def make_tar(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            ti = tarfile.TarInfo(e.name)
            ti.type, ti.mtime, ti.uid, ti.gid = e.type, MTIME, 0, 0
            ti.mode = e.mode if e.mode is not None else (0o755 if e.type == tarfile.DIRTYPE else 0o644)
            ti.linkname = e.linkname
            if e.type == tarfile.REGTYPE:
                ti.size = len(e.data) if e.size is None else e.size
                tar.addfile(ti, io.BytesIO(e.data))
            else:
                tar.addfile(ti)
    return buf.getvalue()


def layer_stats(entries: list[Entry], tar: bytes) -> dict:
    return {
        "media_type": LAYER_MEDIA,
        "diff_id": "sha256:" + hashlib.sha256(tar).hexdigest(),
        "uncompressed_size": sum(len(e.data) for e in entries if e.type == tarfile.REGTYPE),
        "tar_size": len(tar),
        "entries": len(entries),
        "files": sum(1 for e in entries if e.type == tarfile.REGTYPE),
        "compression": "zstd-3",
    }


def manifest_for(layer: dict, fingerprint: dict, roles=("triton",), target="cuda:90",
                 layer_root="/var/cache/cachebake") -> dict:
    return {"format_version": 1, "target": target, "fingerprint": dict(fingerprint, target=target),
            "roles": list(roles), "layer_root": layer_root, "layer": layer,
            "inventory": {"kernels": [], "autotune": [], "helpers": [], "dropped": [], "other_files": {}},
            "bake": {}}


def _blob(out: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    d = out / "blobs" / "sha256"
    d.mkdir(parents=True, exist_ok=True)
    (d / digest.split(":")[1]).write_bytes(data)
    return digest, len(data)


def write_artifact(out: Path, compressed: bytes, manifest: dict, *, config_diff_ids: list | None = None) -> Path:
    """An OCI layout holding one bake, laid out like cachebake.artifact.pack writes it.
    ``config_diff_ids``: the image config's rootfs.diff_ids (default: the manifest's one)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    layer_digest, layer_size = _blob(out, compressed)
    manifest = dict(manifest, layer=dict(manifest["layer"], digest=layer_digest, size=layer_size))
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Labels": {"dev.cachebake.manifest": json.dumps(manifest, sort_keys=True)}},
              "rootfs": {"type": "layers", "diff_ids": (config_diff_ids if config_diff_ids is not None
                                                        else [manifest["layer"]["diff_id"]])}}
    cfg_digest, cfg_size = _blob(out, json.dumps(config, sort_keys=True).encode())
    image = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
             "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                        "digest": cfg_digest, "size": cfg_size},
             "layers": [{"mediaType": LAYER_MEDIA, "digest": layer_digest, "size": layer_size}]}
    img_digest, img_size = _blob(out, json.dumps(image, sort_keys=True).encode())
    target = manifest["target"]
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                            "digest": img_digest, "size": img_size,
                            "annotations": {"org.opencontainers.image.ref.name": "sm_" + target.split(":")[1],
                                            "dev.cachebake.target": target}}]}
    (out / "index.json").write_text(json.dumps(index, sort_keys=True))
    bake = dict(manifest, image_manifest_digest=img_digest)
    (out / "cachebake.json").write_text(json.dumps({"format_version": 1, "bakes": {target: bake}},
                                                   sort_keys=True, indent=2))
    return out


def artifact_from_entries(out: Path, entries: list[Entry], fingerprint: dict, *, level: int = 3,
                          roles=("triton",), layer_overrides: dict | None = None,
                          manifest_overrides: dict | None = None, tar: bytes | None = None) -> Path:
    tar = make_tar(entries) if tar is None else tar
    layer = dict(layer_stats(entries, tar), **(layer_overrides or {}))
    manifest = dict(manifest_for(layer, fingerprint, roles), **(manifest_overrides or {}))
    compressed = zstandard.ZstdCompressor(level=level).compress(tar)
    return write_artifact(out, compressed, manifest)


def layer_blob(artifact: Path) -> Path:
    image = json.loads((artifact / "blobs" / "sha256" / json.loads(
        (artifact / "index.json").read_text())["manifests"][0]["digest"].split(":")[1]).read_bytes())
    return artifact / "blobs" / "sha256" / image["layers"][0]["digest"].split(":")[1]


# -- raw tar headers, for what tarfile will not write ---------------------------------------
def ustar_header(name: bytes | str, *, type: bytes = b"0", size: int = 0, mode: int = 0o644,
                 size_field: bytes | None = None, linkname: bytes = b"", magic: bytes = b"ustar\x0000",
                 checksum_delta: int = 0, prefix: bytes = b"") -> bytes:
    """One 512-byte header block with any field as given (a raw ``size_field`` replaces the
    octal size: base-256, negative, non-octal), checksummed unless ``checksum_delta``."""
    name = name.encode() if isinstance(name, str) else name
    block = bytearray(512)
    block[0:len(name)] = name[:100]
    block[100:108] = b"%07o\x00" % mode
    block[108:116] = b"0000000\x00"
    block[116:124] = b"0000000\x00"
    block[124:136] = size_field if size_field is not None else b"%011o\x00" % size
    block[136:148] = b"%011o\x00" % MTIME
    block[148:156] = b" " * 8
    block[156:157] = type
    block[157:157 + len(linkname)] = linkname
    block[257:265] = magic
    block[345:345 + len(prefix)] = prefix
    chk = sum(block) + checksum_delta
    block[148:156] = b"%06o\x00 " % chk
    return bytes(block)


def pax_header(records: dict[str, str]) -> bytes:
    """A pax 'x' header and its data block(s) with ``records`` as given."""
    body = b""
    for k, v in records.items():
        rec = f" {k}={v}\n".encode()
        n = len(rec) + len(str(len(rec)))
        n = len(rec) + len(str(n))
        body += str(n).encode() + rec
    return ustar_header("././@PaxHeader", type=b"x", size=len(body)) + pad(body)


def pad(data: bytes) -> bytes:
    return data + b"\x00" * (-len(data) % 512)


def raw_file(name: str, data: bytes, **kw) -> bytes:
    return ustar_header(name, size=len(data), **kw) + pad(data)


def raw_dir(name: str, **kw) -> bytes:
    return ustar_header(name.rstrip("/") + "/", type=b"5", mode=0o755, **kw)


def end_of_archive(total_so_far: int = 0) -> bytes:
    """Two zero blocks and the padding to a 10240-byte record, as tarfile writes them."""
    eoa = b"\x00" * 1024
    return eoa + b"\x00" * (-(total_so_far + len(eoa)) % 10240)


def raw_tar(*parts: bytes, trailer: bytes | None = None) -> bytes:
    body = b"".join(parts)
    return body + (end_of_archive(len(body)) if trailer is None else trailer)


def artifact_from_tar(out: Path, tar: bytes, fingerprint: dict, *, entries: int, files: int,
                      file_bytes: int, roles=("triton",), compressed: bytes | None = None,
                      manifest_overrides: dict | None = None) -> Path:
    """An artifact whose manifest declares exactly the given counts for a hand-made tar: only
    the attack is wrong, every digest and size agrees."""
    layer = {"media_type": LAYER_MEDIA, "diff_id": "sha256:" + hashlib.sha256(tar).hexdigest(),
             "uncompressed_size": file_bytes, "tar_size": len(tar), "entries": entries,
             "files": files, "compression": "zstd-3"}
    manifest = dict(manifest_for(layer, fingerprint, roles), **(manifest_overrides or {}))
    blob = compressed if compressed is not None else zstandard.ZstdCompressor(level=3).compress(tar)
    return write_artifact(out, blob, manifest)
