"""The compile record: what it takes to compile a kernel again, as plain JSON-able data.

One ``CompileSpec`` per ``triton.compile`` a process made (a real compile or a file-cache
hit): the kernel (module, qualified name, source hash), the specialization (signature,
constexprs, attrs), the launch options, the cache-invalidating variables and the target, plus
the key hash Triton computed for it there.  One ``AutotuneSpec`` per autotuner key: the
tuning key, every candidate config it tried, their timings and the compiles made while it
ran.  A ``CompileRecord`` is a bake's whole set; it travels in the artifact as its own blob
(``RECORD_MEDIA_TYPE``) and ``cachebake replay`` compiles it for any target.

This module is the format and nothing else: no Triton import at module level (it is imported
in every monitored process), no I/O.  Other modules that log compiles (the serve-time miss log)
write ``CompileSpec`` entries through ``to_dict``/``from_dict`` so replay reads them too.

Why each field has the shape it has (Triton 3.6, ``compiler/compiler.py`` and
``runtime/jit.py``): the key hashes ``str(attrs)`` and the signature in argument order, so both
are kept as ordered ``[name-or-path, value]`` lists (a JSON object would be re-sorted by a
canonical writer); tuple paths and tuple types become lists and are turned back into tuples
when decoded, as ``JITFunction.preload`` does.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from cachebake.errors import InvalidDocument, Unsupported
from cachebake.jsonio import canonical_json

RECORD_FORMAT_VERSION = 1
RECORD_MEDIA_TYPE = "application/vnd.cachebake.compile-record.v1+json"
RECORD_DOCUMENT = "compile record"

# CUDAOptions fields that parse_options derives from the target (triton/backends/nvidia/
# compiler.py): a replay for another target must let that target's backend derive them again.
TARGET_DERIVED_OPTIONS = ("arch", "supported_fp8_dtypes", "deprecated_fp8_dot_operand_dtypes",
                          "max_num_imprecise_acc_default", "backend_name", "warp_size")


@dataclass(frozen=True)
class KernelRef:
    """Where a @triton.jit function lives and which source it had."""

    module: str  # fn.__module__: importable where the kernel is replayed
    qualname: str  # fn.__qualname__: attribute path inside the module
    name: str  # fn.__name__: the stem of its cache files
    source_hash: str  # JITFunction.cache_key: sha256 of source, start line, callees, globals

    @classmethod
    def of(cls, fn) -> "KernelRef":
        """From a JITFunction (or anything wrapping one through ``.fn``)."""
        base = unwrap_jit(fn)
        return cls(base.fn.__module__, base.fn.__qualname__, base.__name__, base.cache_key)

    @property
    def label(self) -> str:
        return f"{self.module}:{self.qualname}"


def unwrap_jit(obj):
    """The JITFunction inside an Autotuner/Heuristics chain (each keeps the next in ``.fn``)."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while not isinstance(obj, JITFunction):
        obj = getattr(obj, "fn", None)
        seen += 1
        if obj is None or seen > 16:
            raise TypeError("not a @triton.jit function")
    return obj


@dataclass
class CompileSpec:
    kernel: KernelRef
    signature: list  # [[arg name, type], ...] in argument order; tuple types as nested lists
    constexprs: list  # [[path, encoded value], ...]; path = [arg index, tuple index...]
    attrs: list  # [[path, [[attr, value], ...]], ...] in the order the JIT produced them
    options: dict  # launch options without TARGET_DERIVED_OPTIONS (num_warps, num_stages, ...)
    env_vars: dict  # cache-invalidating variables set when it compiled (values as Triton reads them)
    target: str  # "cuda:90": what it was compiled for
    hash: str  # Triton's key hash there (sha256 hex; the cache dir is its base32)
    verified: bool = False  # re-deriving the key from this entry gave ``hash`` where recorded
    seen: str = "compile"  # "compile" (real) or "cache_hit"

    def spec_id(self) -> str:
        """Identity of the launch whatever the target: two targets' compiles of one launch
        share it."""
        ident = [asdict(self.kernel), self.signature, self.constexprs, self.attrs,
                 self.options, self.env_vars]
        return hashlib.sha256(canonical_json(ident)).hexdigest()[:32]

    def label(self) -> str:
        consts = ", ".join(f"{_path_name(self, p)}={_short(v)}" for p, v in self.constexprs)
        opts = " ".join(f"{k}={self.options[k]}" for k in ("num_warps", "num_stages")
                        if k in self.options)
        return f"{self.kernel.name}[{consts}] {opts}".strip()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "compiles[]") -> "CompileSpec":
        try:
            spec = cls(kernel=KernelRef(**d["kernel"]), signature=list(d["signature"]),
                       constexprs=list(d["constexprs"]), attrs=list(d["attrs"]),
                       options=dict(d["options"]), env_vars=dict(d["env_vars"]),
                       target=str(d["target"]), hash=str(d["hash"]),
                       verified=bool(d.get("verified", False)), seen=str(d.get("seen", "compile")))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidDocument(RECORD_DOCUMENT, where, f"malformed compile entry ({e})") from None
        for i, pair in enumerate(spec.signature + spec.constexprs + spec.attrs):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise InvalidDocument(RECORD_DOCUMENT, where, f"item {i} is not a [key, value] pair")
        return spec


@dataclass
class TuneConfig:
    """One ``triton.Config`` an autotuner tried (its pre_hook, if any, is not data)."""

    kwargs: list  # [[name, encoded value], ...] in the config's order (str(Config) keeps it)
    num_warps: int = 4
    num_stages: int = 3
    num_ctas: int = 1
    maxnreg: int | None = None
    text: str = ""  # str(Config) where recorded: part of the autotune result's key


@dataclass
class AutotuneSpec:
    kernel: KernelRef
    tuning_key: str  # str(tuple(key values)) exactly as Autotuner.check_disk_cache hashes it
    configs: list[TuneConfig]  # the candidates benchmarked (after pruning), in order
    target: str
    env_vars: dict
    result_hash: str  # sha256 of the autotune result's key on ``target``
    timings: list | None = None  # per config [median, p20, p80] ms where recorded
    best: int | None = None  # index into configs
    compiles: list[str] = field(default_factory=list)  # CompileSpec.hash made inside the run

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "autotune[]") -> "AutotuneSpec":
        try:
            return cls(kernel=KernelRef(**d["kernel"]), tuning_key=str(d["tuning_key"]),
                       configs=[TuneConfig(**c) for c in d["configs"]], target=str(d["target"]),
                       env_vars=dict(d["env_vars"]), result_hash=str(d["result_hash"]),
                       timings=[[float(x) for x in t] for t in d["timings"]] if d.get("timings") else None,
                       best=d.get("best"),
                       compiles=[str(h) for h in d.get("compiles") or []])
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidDocument(RECORD_DOCUMENT, where, f"malformed autotune entry ({e})") from None


@dataclass
class CompileRecord:
    compiles: list[CompileSpec] = field(default_factory=list)
    autotune: list[AutotuneSpec] = field(default_factory=list)
    triton_version: str | None = None
    triton_key: str | None = None  # sha256 of triton_key(): which Triton build recorded it
    format_version: int = RECORD_FORMAT_VERSION
    media_type: ClassVar[str] = RECORD_MEDIA_TYPE  # of its blob in an artifact

    def add(self, other: "CompileRecord") -> "CompileRecord":
        """Merge, one entry per (target, hash) and per (target, autotune result)."""
        compiles = {(c.target, c.hash): c for c in self.compiles}
        for c in other.compiles:
            old = compiles.get((c.target, c.hash))
            if old is None or (c.seen == "compile" and old.seen != "compile"):
                compiles[(c.target, c.hash)] = c
        tunes = {(a.target, a.result_hash): a for a in self.autotune}
        for a in other.autotune:
            old = tunes.get((a.target, a.result_hash))
            if old is not None:
                a.compiles = sorted(set(old.compiles) | set(a.compiles))
                a.timings = a.timings or old.timings
            tunes[(a.target, a.result_hash)] = a
        self.compiles = sorted(compiles.values(), key=lambda c: (c.target, c.kernel.name, c.hash))
        self.autotune = sorted(tunes.values(), key=lambda a: (a.target, a.kernel.name, a.result_hash))
        self.triton_version = self.triton_version or other.triton_version
        self.triton_key = self.triton_key or other.triton_key
        return self

    def targets(self) -> list[str]:
        return sorted({c.target for c in self.compiles} | {a.target for a in self.autotune})

    def summary(self) -> dict:
        return {
            "compiles": len(self.compiles),
            "kernels": len({c.kernel.label for c in self.compiles}),
            "autotune": len(self.autotune),
            "autotune_candidates": sum(len(a.configs) for a in self.autotune),
            "unverified": sum(1 for c in self.compiles if not c.verified),
            "targets": self.targets(),
            "modules": sorted({c.kernel.module for c in self.compiles}),
        }

    def to_dict(self) -> dict:
        return {"format_version": self.format_version, "triton_version": self.triton_version,
                "triton_key": self.triton_key, "compiles": [c.to_dict() for c in self.compiles],
                "autotune": [a.to_dict() for a in self.autotune]}

    def to_json(self) -> bytes:
        """Canonical bytes: the same record is the same blob digest.  A failed autotune
        candidate is timed inf: written "inf" (strict JSON, like every document cachebake
        writes), read back by float() in AutotuneSpec.from_dict."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, d: Any) -> "CompileRecord":
        if not isinstance(d, dict):
            raise InvalidDocument(RECORD_DOCUMENT, "", "not a JSON object")
        if d.get("format_version") != RECORD_FORMAT_VERSION:
            raise Unsupported(f"compile record format {d.get('format_version')!r} is not supported "
                              f"(this cachebake reads {RECORD_FORMAT_VERSION})")
        if not isinstance(d.get("compiles"), list) or not isinstance(d.get("autotune", []), list):
            raise InvalidDocument(RECORD_DOCUMENT, "compiles", "not a list")
        return cls(compiles=[CompileSpec.from_dict(c, f"compiles[{i}]") for i, c in enumerate(d["compiles"])],
                   autotune=[AutotuneSpec.from_dict(a, f"autotune[{i}]")
                             for i, a in enumerate(d.get("autotune") or [])],
                   triton_version=d.get("triton_version"), triton_key=d.get("triton_key"))

    @classmethod
    def from_json(cls, data: bytes | str) -> "CompileRecord":
        try:
            return cls.from_dict(json.loads(data))
        except ValueError as e:
            raise InvalidDocument(RECORD_DOCUMENT, "", f"not JSON: {e}") from None


# -- values: constexprs and config kwargs ------------------------------------------------------

def encode_value(v: Any) -> Any:
    """A constexpr/config value as JSON.  Plain scalars stay plain; everything else is a
    one-key object naming its kind, so decoding never guesses."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, tuple):
        return {"tuple": [encode_value(x) for x in v]}
    if isinstance(v, list):
        return {"list": [encode_value(x) for x in v]}
    kind = type(v).__name__
    module = type(v).__module__ or ""
    if module.startswith("triton") and kind == "constexpr":
        return {"constexpr": encode_value(v.value)}
    if module.startswith("triton") and hasattr(v, "name") and kind.endswith("dtype"):
        return {"dtype": v.name}
    if hasattr(v, "cache_key") and hasattr(v, "fn"):  # a @triton.jit function passed as constexpr
        return {"jit": asdict(KernelRef.of(v))}
    return {"unsupported": f"{module}.{kind}", "repr": str(v)}


def unsupported_values(spec: CompileSpec) -> list[str]:
    """Constexprs this record cannot rebuild (their Python type is not data)."""
    out = []
    for path, v in spec.constexprs:
        for bad in _walk_unsupported(v):
            out.append(f"{_path_name(spec, path)}: {bad}")
    return out


def _walk_unsupported(v):
    if isinstance(v, dict):
        if "unsupported" in v:
            yield f"{v['unsupported']} {v.get('repr', '')}".strip()
        for x in v.get("tuple", []) + v.get("list", []):
            yield from _walk_unsupported(x)


def launch_options(options: dict, default_extern_libs=None) -> dict:
    """The options a launch passed (what the JIT parses per target), from the full parsed
    options: target-derived fields out; extern_libs out when it is the default libdevice
    (its path is this machine's; the key hashes the file's content)."""
    out = {}
    for k, v in options.items():
        if k in TARGET_DERIVED_OPTIONS:
            continue
        if k == "extern_libs" and (v is None or _as_tuples(v) == _as_tuples(default_extern_libs)):
            continue
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def _as_tuples(v):
    if isinstance(v, (list, tuple)):
        return tuple(_as_tuples(x) for x in v)
    return v


def _path_name(spec: CompileSpec, path) -> str:
    names = [a for a, _ in spec.signature]
    if isinstance(path, list) and path and isinstance(path[0], int) and path[0] < len(names):
        return names[path[0]] + "".join(f"[{i}]" for i in path[1:])
    return str(path)


def _short(v) -> str:
    text = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)
    return text if len(text) <= 24 else text[:21] + "..."

