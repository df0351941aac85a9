"""The bake manifest: fingerprint + inventory + layer facts + bake record, as typed data.

One ``BakeManifest`` describes one GPU target's bake.  It travels inside the image config (so a
bare OCI layout, or an image pulled from a registry, carries it) and, for convenience, in the
artifact's ``cachebake.json``.  ``build_inventory`` reads what a snapshot holds: each kernel with
its launch options, each autotune result with its tuning key, each launcher helper module.

Its two open-ended parts are typed here once, as huggingface_hub's ``utils/_cache_manager.py``
types its cache scan: the fingerprint (cachebake.artifact.fingerprint.Fingerprint) and the bake
section (``BakeRecord``: how the caches were filled).  ``from_dict`` parses an untrusted
document into them once; readers (inspect, install, serve-args) only read attributes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from cachebake import jsonio
from cachebake.artifact import schema
from cachebake.artifact.fingerprint import Fingerprint
from cachebake.artifact.groups import GROUP_PREFIX
from cachebake.artifact.schema import FORMAT_VERSION
from cachebake.artifact.snapshot import BINARY_SUFFIXES, Snapshot
from cachebake.errors import InvalidDocument

__all__ = ["FORMAT_VERSION", "BakeManifest", "BakeRecord", "LayerFacts", "Inventory", "build_inventory"]


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


# What jsonio.strict_json writes for a non-finite float (a bake's seconds can be nan)
_NON_FINITE = frozenset({"nan", "inf", "-inf"})


@dataclass(frozen=True)
class BakeRecord:
    """The manifest's ``bake`` section: how the caches were filled.

    The fields cachebake itself reads (``inspect`` renders them, ``serve-args`` derives the
    server's command from them, install relocates with ``env``) are typed and checked when read;
    every other key (what each driver records of itself, replay's and seeding's notes) rides in
    ``extra`` exactly as written.  ``to_json`` gives back the one flat object, so a manifest
    read and written again is the same document.  None: the bake did not record that field."""

    driver: str | None = None  # "vllm", "kernels", "command", or a registered driver's name
    model: str | Mapping | None = None  # the recipe or path asked for, or the vllm driver's record
    model_dir: str | None = None
    tp: int | None = None
    serve_args: Mapping | None = None
    serve_env: Mapping[str, str] | None = None  # what the server must set beside the cache roles
    env: Mapping | None = None  # the bake env: root, roles, pinned, invalidating_env_vars
    stable: bool | None = None
    rounds: int | None = None
    quiet_rounds: int | None = None
    compiles: int | None = None
    compile_seconds_moved: float | str | None = None  # a number, or "nan"/"inf" as strict JSON writes it
    autotune_seconds_moved: float | str | None = None
    events: tuple[Mapping, ...] | None = None  # the rounds' compiles, autotunes and helper builds
    unverified_on_target: Mapping | None = None  # {"how": "replay"|"cross-bake", "built_on": ...}
    folded: tuple[Mapping, ...] | None = None  # serve-time misses compiled in (replay --misses)
    extra: Mapping = field(default_factory=dict)

    def to_json(self) -> dict:
        doc = dict(self.extra)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "extra" and value is not None:
                doc[f.name] = list(value) if isinstance(value, tuple) else value
        return doc

    @classmethod
    def from_json(cls, doc, document: str = "bake manifest", field: str = "bake") -> "BakeRecord":
        """A bake section from untrusted JSON: each typed field checked (InvalidDocument naming
        ``document`` and the field), unknown keys kept in ``extra``."""
        c = schema.Checker(document)
        c.obj(doc, field)
        where = (lambda key: f"{field}.{key}") if field else (lambda key: key)
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict = {"extra": {k: v for k, v in doc.items() if k not in known}}
        for key in ("driver", "model_dir"):
            values[key] = c.opt_str(doc.get(key), where(key))
        model = doc.get("model")
        if model is not None and not isinstance(model, dict):
            c.string(model, where("model"))
        values["model"] = model
        for key in ("tp", "rounds", "quiet_rounds", "compiles"):
            values[key] = c.opt_int(doc.get(key), where(key))
        if doc.get("stable") is not None and not isinstance(doc["stable"], bool):
            c.fail(where("stable"), "must be true or false")
        values["stable"] = doc.get("stable")
        for key in ("compile_seconds_moved", "autotune_seconds_moved"):
            values[key] = _number(c, doc.get(key), where(key))
        for key in ("serve_args", "env", "unverified_on_target"):
            values[key] = None if doc.get(key) is None else c.obj(doc[key], where(key))
        if doc.get("serve_env") is not None:
            values["serve_env"] = c.str_map(doc["serve_env"], where("serve_env"))
        env = values["env"] or {}
        for key in ("pinned", "invalidating_env_vars"):
            if env.get(key) is not None:
                c.str_map(env[key], where(f"env.{key}"))
        if env.get("root") is not None:
            c.string(env["root"], where("env.root"))
        if env.get("roles") is not None:
            for i, role in enumerate(c.array(env["roles"], where("env.roles"))):
                c.string(role, f"{where('env.roles')}[{i}]", max_len=64)
        how = values["unverified_on_target"] or {}
        for key in ("how", "built_on"):
            c.opt_str(how.get(key), where(f"unverified_on_target.{key}"))
        for key in ("events", "folded"):
            items = doc.get(key)
            if items is not None:
                values[key] = tuple(c.obj(item, f"{where(key)}[{i}]")
                                    for i, item in enumerate(c.array(items, where(key))))
        return cls(**values)


def _number(c: schema.Checker, value, field: str):
    if value is None or value in _NON_FINITE:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        c.fail(field, f"must be a number, not {value!r}"[:120])
    return value


@dataclass
class BakeManifest:
    target: str
    fingerprint: Fingerprint
    roles: list[str]
    layer_root: str
    layer: LayerFacts
    inventory: Inventory
    bake: BakeRecord = field(default_factory=BakeRecord)
    format_version: int = FORMAT_VERSION
    # The compile record (cachebake.capture.record): an OCI descriptor (mediaType, digest, size)
    # of its own blob in the layout, or None for bakes packed without one.
    record: dict | None = None

    def to_dict(self) -> dict:
        return {"target": self.target, "fingerprint": self.fingerprint.to_json(), "roles": list(self.roles),
                "layer_root": self.layer_root, "layer": asdict(self.layer), "inventory": asdict(self.inventory),
                "bake": self.bake.to_json(), "format_version": self.format_version, "record": self.record}

    def to_json(self) -> str:
        return jsonio.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data, document: str = "bake manifest", prefix: str = "") -> "BakeManifest":
        """A manifest from untrusted JSON: schema-checked first (cachebake.artifact.schema:
        InvalidDocument naming ``document`` and the field, or Unsupported for another
        format version); keys this version does not know are ignored."""
        schema.check_bake_manifest(data, document, prefix=prefix)
        inv = data["inventory"]
        where = (lambda key: f"{prefix}.{key}") if prefix else (lambda key: key)
        return cls(
            target=data["target"],
            fingerprint=Fingerprint.from_json(data["fingerprint"], document, where("fingerprint")),
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
            bake=BakeRecord.from_json(data.get("bake") or {}, document, where("bake")),
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


def _load_json(data: bytes, name: str) -> dict | None:
    """A Triton metadata file of the cache being packed, or None when it is not a JSON object
    (the inventory then lists what it can).  Non-finite numbers are read as floats: Triton's
    autotuner times a config that failed as inf and writes it with json.dumps, as Infinity."""
    try:
        obj = jsonio.parse_json(data, name, allow_non_finite=True)
    except InvalidDocument:
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
                meta = _load_json(f.read(), f.arcname) or {}
                timings = meta.get("configs_timings") or []
                best = None
                if timings:
                    best = min(timings, key=lambda ct: _first(ct[1]))[0]
                inv.autotune.append(AutotuneEntry(name[: -len(".autotune.json")], key_dir,
                                                  meta.get("key") or [], len(timings), best))
            elif role == "triton" and name.endswith(".json") and GROUP_PREFIX + name in names:
                meta = _load_json(f.read(), f.arcname) or {}
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
