"""The bake manifest: fingerprint + inventory + layer facts + bake stats, as plain data.

One ``BakeManifest`` describes one GPU target's bake.  It travels inside the image config (so a
bare OCI layout, or an image pulled from a registry, carries it) and, for convenience, in the
artifact's ``cachebake.json``.  ``build_inventory`` reads what a snapshot holds: each kernel with
its launch options, each autotune result with its tuning key, each launcher helper module.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from cachebake import jsonio
from cachebake.artifact import schema
from cachebake.artifact.groups import GROUP_PREFIX
from cachebake.artifact.schema import FORMAT_VERSION
from cachebake.artifact.snapshot import BINARY_SUFFIXES, Snapshot

__all__ = ["FORMAT_VERSION", "BakeManifest", "LayerFacts", "Inventory", "build_inventory"]


@dataclass
class KernelEntry:
    name: str
    key_dir: str  # "triton/<KEY>"
    target: str  # "cuda:90"
    num_warps: int | None
    num_stages: int | None
    shared: int | None  # bytes of shared memory


@dataclass
class AutotuneEntry:
    kernel: str
    key_dir: str
    tuning_key: list
    configs: int  # candidate configs benchmarked at bake time
    best: dict | None  # the fastest config's kwargs + launch options


@dataclass
class HelperEntry:
    name: str  # e.g. "cuda_utils.cpython-312-x86_64-linux-gnu.so"
    key_dir: str


@dataclass
class Inventory:
    kernels: list[KernelEntry] = field(default_factory=list)
    autotune: list[AutotuneEntry] = field(default_factory=list)
    helpers: list[HelperEntry] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    other_files: dict[str, int] = field(default_factory=dict)  # role -> files not classified above

    def summary(self) -> dict:
        return {
            "kernels": len(self.kernels),
            "kernel_names": len({k.name for k in self.kernels}),
            "autotune": len(self.autotune),
            "helpers": len(self.helpers),
            "dropped": len(self.dropped),
            "other_files": dict(self.other_files),
        }


@dataclass
class LayerFacts:
    media_type: str
    diff_id: str  # sha256 of the uncompressed tar
    digest: str  # sha256 of the compressed blob
    size: int  # compressed bytes
    tar_size: int  # uncompressed tar bytes
    uncompressed_size: int  # bytes of file data alone
    entries: int  # tar members, dirs included
    files: int
    compression: str  # e.g. "zstd-19-long27"


@dataclass
class BakeManifest:
    target: str
    fingerprint: dict
    roles: list[str]
    layer_root: str
    layer: LayerFacts
    inventory: Inventory
    bake: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    # The compile record (cachebake.capture.record): an OCI descriptor (mediaType, digest, size)
    # of its own blob in the layout, or None for bakes packed without one.
    record: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return jsonio.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data, document: str = "bake manifest") -> "BakeManifest":
        """A manifest from untrusted JSON: schema-checked first (cachebake.artifact.schema:
        InvalidDocument naming ``document`` and the field, or Unsupported for another
        format version); keys this version does not know are ignored."""
        schema.check_bake_manifest(data, document)
        inv = data["inventory"]
        return cls(
            target=data["target"],
            fingerprint=dict(data["fingerprint"]),
            roles=list(data["roles"]),
            layer_root=data["layer_root"],
            layer=LayerFacts(**_known(LayerFacts, data["layer"])),
            inventory=Inventory(
                kernels=[KernelEntry(**_known(KernelEntry, k)) for k in inv["kernels"]],
                autotune=[AutotuneEntry(**_known(AutotuneEntry, a)) for a in inv["autotune"]],
                helpers=[HelperEntry(**_known(HelperEntry, h)) for h in inv["helpers"]],
                dropped=list(inv["dropped"]),
                other_files=dict(inv["other_files"]),
            ),
            bake=dict(data.get("bake") or {}),
            record=data.get("record"),
        )


def _known(kind, data: dict) -> dict:
    """The keys of ``data`` that dataclass ``kind`` has; absent ones (optional: the schema
    checked the required ones) are None."""
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f.name for f in fields(kind))
    return {name: data.get(name) for name in names}


_FIELDS: dict[type, tuple[str, ...]] = {}


def _load_json(data: bytes) -> dict | None:
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def build_inventory(snap: Snapshot) -> Inventory:
    inv = Inventory(dropped=[{"path": d.path, "reason": d.reason} for d in snap.dropped])
    by_dir: dict[str, list] = {}
    for f in snap.files:
        parent, _, name = f.arcname.rpartition("/")
        by_dir.setdefault(parent, []).append((name, f))
    for key_dir, files in sorted(by_dir.items()):
        names = {n for n, _ in files}
        role = key_dir.split("/", 1)[0]
        for name, f in files:
            if role == "triton" and name.endswith(".autotune.json"):
                meta = _load_json(f.read()) or {}
                timings = meta.get("configs_timings") or []
                best = None
                if timings:
                    best = min(timings, key=lambda ct: _first(ct[1]))[0]
                inv.autotune.append(AutotuneEntry(name[: -len(".autotune.json")], key_dir,
                                                  meta.get("key") or [], len(timings), best))
            elif role == "triton" and name.endswith(".json") and GROUP_PREFIX + name in names:
                meta = _load_json(f.read()) or {}
                if not any(name[:-5] + s in names for s in BINARY_SUFFIXES):
                    continue  # snapshot drops these; kept here only for safety
                t = meta.get("target") or {}
                inv.kernels.append(KernelEntry(
                    meta.get("name", name[:-5]), key_dir, f"{t.get('backend')}:{t.get('arch')}",
                    meta.get("num_warps"), meta.get("num_stages"), meta.get("shared")))
            elif role == "triton" and name.endswith(".so"):
                inv.helpers.append(HelperEntry(name, key_dir))
            elif role != "triton":
                inv.other_files[role] = inv.other_files.get(role, 0) + 1
    return inv


def _first(timing) -> float:
    # configs_timings hold [median, p20, p80] lists, or a float in older Triton
    if isinstance(timing, (list, tuple)):
        return float(timing[0]) if timing else float("inf")
    return float(timing)
