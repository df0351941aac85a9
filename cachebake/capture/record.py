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
import re
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, NoReturn

from cachebake.errors import InvalidDocument, Unsupported
from cachebake.errors import shorten
from cachebake.jsonio import canonical_json, parse_json

RECORD_FORMAT_VERSION = 1
RECORD_MEDIA_TYPE = "application/vnd.cachebake.compile-record.v1+json"
RECORD_DOCUMENT = "compile record"

# CUDAOptions fields that parse_options derives from the target (triton/backends/nvidia/
# compiler.py): a replay for another target must let that target's backend derive them again.
TARGET_DERIVED_OPTIONS = ("arch", "supported_fp8_dtypes", "deprecated_fp8_dot_operand_dtypes",
                          "max_num_imprecise_acc_default", "backend_name", "warp_size")

# Bounds on what one entry may hold, far above any real kernel's (vLLM's largest Mamba2 kernel
# takes ~40 arguments; a Python identifier path is well under 200 characters).
MAX_NAME = 512  # module, qualified name, kernel name, argument name, variable name, option name
MAX_TEXT = 4096  # a tuning key's text, a config's text, a variable's value
MAX_ITEMS = 4096  # signature, constexprs, attrs, options, variables, configs of one entry
# A target as GPUTargetSpec.key writes it (cachebake/gpu.py): the backend and its arch name
_TARGET_KEY = re.compile(r"(?:cuda:\d{1,4}|hip:gfx[0-9a-z]{1,12})\Z")


def shown(value, limit: int = 120) -> str:
    """``value`` as it may stand inside a one-line message: as it is when it is printable
    ASCII (what every real module, kernel and variable name is), else its ``repr``, which
    escapes control characters and line breaks; cut to ``limit`` characters.  Records and miss
    logs come from pods that may be compromised; their text reaches terminals through error
    lines that bypass any renderer."""
    text = value if isinstance(value, str) and value.isascii() and value.isprintable() else repr(value)
    return shorten(text, limit)


class _Fields:
    """Type checks of one entry's fields; a refusal is ``InvalidDocument`` naming the field."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, field: str, reason: str) -> NoReturn:
        raise InvalidDocument(RECORD_DOCUMENT, f"{self.where}.{field}" if field else self.where,
                              f"malformed compile entry ({reason})")

    def obj(self, value, field: str) -> dict:
        if not isinstance(value, dict):
            self.fail(field, f"{_json_type(value)}, not an object")
        return value

    def get(self, d: dict, key: str, field: str):
        if key not in d:
            self.fail(field, "missing")
        return d[key]

    def text(self, value, field: str, max_len: int = MAX_NAME) -> str:
        if not isinstance(value, str):
            self.fail(field, f"{_json_type(value)}, not a string")
        if len(value) > max_len:
            self.fail(field, f"{len(value)} characters, over {max_len}")
        return value

    def target(self, value, field: str = "target") -> str:
        """A GPU target as the monitor records it (``GPUTargetSpec.key``: "cuda:90",
        "hip:gfx942"): a record names the target its entries were compiled for, nothing else."""
        text = self.text(value, field, 64)
        if not _TARGET_KEY.match(text):
            self.fail(field, f"{shown(text, 40)} is not a GPU target (cuda:NN or hip:gfxNNN)")
        return text

    def items(self, value, field: str, max_len: int = MAX_ITEMS) -> list:
        if not isinstance(value, list):
            self.fail(field, f"{_json_type(value)}, not a list")
        if len(value) > max_len:
            self.fail(field, f"{len(value)} items, over {max_len}")
        return value

    def pair(self, value, field: str) -> list:
        if not (isinstance(value, list) and len(value) == 2):
            self.fail(field, "not a [key, value] pair")
        return value

    def integer(self, value, field: str) -> int:
        if type(value) is not int:  # bool is an int subclass: `true` is not 1 here
            self.fail(field, f"{_json_type(value)}, not an integer")
        return value

    def opt_integer(self, value, field: str) -> int | None:
        return None if value is None else self.integer(value, field)

    def boolean(self, value, field: str) -> bool:
        if not isinstance(value, bool):
            self.fail(field, f"{_json_type(value)}, not true or false")
        return value

    def text_map(self, value, field: str) -> dict[str, str]:
        d = self.obj(value, field)
        if len(d) > MAX_ITEMS:
            self.fail(field, f"{len(d)} entries, over {MAX_ITEMS}")
        for k, v in d.items():
            self.text(k, f"{field}.{shown(k, 40)}")
            self.text(v, f"{field}.{shown(k, 40)}", MAX_TEXT)
        return dict(d)

    def path(self, value, field: str) -> list:
        """An argument path: [argument index, tuple index...]."""
        p = self.items(value, field, 16)
        if not p or any(type(i) is not int or i < 0 for i in p):
            self.fail(field, "not an argument path (a list of indices)")
        return p

    def arg_type(self, value, field: str):
        """A signature type: a string (``*fp32``, ``i32``, ``constexpr``...), or a list of
        them for a tuple argument."""
        if isinstance(value, list):
            return [self.arg_type(v, field) for v in self.items(value, field)]
        if not self.text(value, field):
            self.fail(field, "an empty type")
        return value


def _json_type(value) -> str:
    for kind, name in ((bool, "true/false"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "a list"), (dict, "an object"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


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

    @classmethod
    def from_dict(cls, d, c: "_Fields", field: str = "kernel") -> "KernelRef":
        d = c.obj(d, field)
        return cls(*(c.text(c.get(d, k, f"{field}.{k}"), f"{field}.{k}")
                     for k in ("module", "qualname", "name", "source_hash")))

    @property
    def label(self) -> str:
        """``module:qualname`` for messages (a name that is not plain text shows as its repr)."""
        return f"{shown(self.module, 80)}:{shown(self.qualname, 80)}"


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
        opts = " ".join(f"{k}={_short(self.options[k])}" for k in ("num_warps", "num_stages")
                        if k in self.options)
        return f"{shown(self.kernel.name, 80)}[{consts}] {opts}".strip()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d, where: str = "compiles[]") -> "CompileSpec":
        """An entry from JSON, every field type-checked (a record or a miss line is data from
        a process that may be compromised): ``InvalidDocument`` naming the field otherwise.
        What the values may be (modules, options) is cachebake.capture.keys's to check."""
        c = _Fields(where)
        d = c.obj(d, "")
        signature = []
        for i, item in enumerate(c.items(c.get(d, "signature", "signature"), "signature")):
            name, ty = c.pair(item, f"signature[{i}]")
            signature.append([c.text(name, f"signature[{i}]"), c.arg_type(ty, f"signature[{i}]")])
        constexprs = []
        for i, item in enumerate(c.items(c.get(d, "constexprs", "constexprs"), "constexprs")):
            path, value = c.pair(item, f"constexprs[{i}]")
            constexprs.append([c.path(path, f"constexprs[{i}]"), value])
        attrs = []
        for i, item in enumerate(c.items(c.get(d, "attrs", "attrs"), "attrs")):
            path, values = c.pair(item, f"attrs[{i}]")
            for j, attr in enumerate(c.items(values, f"attrs[{i}]")):
                key, value = c.pair(attr, f"attrs[{i}][{j}]")
                c.text(key, f"attrs[{i}][{j}]")
                if not (value is None or isinstance(value, (bool, int, float, str))):
                    c.fail(f"attrs[{i}][{j}]", f"{_json_type(value)}, not a scalar")
            attrs.append([c.path(path, f"attrs[{i}]"), values])
        options = c.obj(c.get(d, "options", "options"), "options")
        if len(options) > MAX_ITEMS:
            c.fail("options", f"{len(options)} entries, over {MAX_ITEMS}")
        for k in options:
            c.text(k, "options")
        return cls(kernel=KernelRef.from_dict(c.get(d, "kernel", "kernel"), c),
                   signature=signature, constexprs=constexprs, attrs=attrs, options=dict(options),
                   env_vars=c.text_map(c.get(d, "env_vars", "env_vars"), "env_vars"),
                   target=c.target(c.get(d, "target", "target")),
                   hash=c.text(c.get(d, "hash", "hash"), "hash", 128),
                   verified=c.boolean(d.get("verified", False), "verified"),
                   seen=c.text(d.get("seen", "compile"), "seen", 32))


@dataclass
class TuneConfig:
    """One ``triton.Config`` an autotuner tried (its pre_hook, if any, is not data)."""

    kwargs: list  # [[name, encoded value], ...] in the config's order (str(Config) keeps it)
    num_warps: int = 4
    num_stages: int = 3
    num_ctas: int = 1
    maxnreg: int | None = None
    text: str = ""  # str(Config) where recorded: part of the autotune result's key

    @classmethod
    def from_dict(cls, d, c: "_Fields", field: str) -> "TuneConfig":
        d = c.obj(d, field)
        kwargs = []
        for i, item in enumerate(c.items(c.get(d, "kwargs", f"{field}.kwargs"), f"{field}.kwargs")):
            name, value = c.pair(item, f"{field}.kwargs[{i}]")
            kwargs.append([c.text(name, f"{field}.kwargs[{i}]"), value])
        return cls(kwargs=kwargs, num_warps=c.integer(d.get("num_warps", 4), f"{field}.num_warps"),
                   num_stages=c.integer(d.get("num_stages", 3), f"{field}.num_stages"),
                   num_ctas=c.integer(d.get("num_ctas", 1), f"{field}.num_ctas"),
                   maxnreg=c.opt_integer(d.get("maxnreg"), f"{field}.maxnreg"),
                   text=c.text(d.get("text", ""), f"{field}.text", MAX_TEXT))


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
    def from_dict(cls, d, where: str = "autotune[]") -> "AutotuneSpec":
        c = _Fields(where)
        d = c.obj(d, "")
        configs = [TuneConfig.from_dict(x, c, f"configs[{i}]")
                   for i, x in enumerate(c.items(c.get(d, "configs", "configs"), "configs"))]
        timings = None
        if d.get("timings"):
            timings = [[_timing_value(x, c, f"timings[{i}]") for x in c.items(t, f"timings[{i}]", 16)]
                       for i, t in enumerate(c.items(d["timings"], "timings"))]
        best = c.opt_integer(d.get("best"), "best")
        if best is not None and not 0 <= best < len(configs):
            c.fail("best", f"{best} is not the index of a config")
        return cls(kernel=KernelRef.from_dict(c.get(d, "kernel", "kernel"), c),
                   tuning_key=c.text(c.get(d, "tuning_key", "tuning_key"), "tuning_key", MAX_TEXT),
                   configs=configs, target=c.target(c.get(d, "target", "target")),
                   env_vars=c.text_map(c.get(d, "env_vars", "env_vars"), "env_vars"),
                   result_hash=c.text(c.get(d, "result_hash", "result_hash"), "result_hash", 128),
                   timings=timings, best=best,
                   compiles=[c.text(h, "compiles", 128)
                             for h in c.items(d.get("compiles") or [], "compiles", 1 << 16)])


def _timing_value(x, c: _Fields, field: str) -> float:
    """A timing in ms: a number, or "inf"/"nan" as strict JSON writes a failed candidate's."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if x in ("inf", "-inf", "nan"):
        return float(x)
    c.fail(field, f"{_json_type(x)}, not a timing")


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
        version = d.get("format_version")
        if type(version) is not int or version != RECORD_FORMAT_VERSION:
            raise Unsupported(f"compile record format {shown(repr(version), 40)} is not supported "
                              f"(this cachebake reads {RECORD_FORMAT_VERSION})")
        if not isinstance(d.get("compiles"), list) or not isinstance(d.get("autotune") or [], list):
            raise InvalidDocument(RECORD_DOCUMENT, "compiles", "not a list")
        build = {}
        for key in ("triton_version", "triton_key"):
            value = d.get(key)
            if value is not None and not isinstance(value, str):
                raise InvalidDocument(RECORD_DOCUMENT, key, f"{_json_type(value)}, not a string")
            if value is not None and len(value) > MAX_NAME:
                raise InvalidDocument(RECORD_DOCUMENT, key, f"{len(value)} characters, over {MAX_NAME}")
            build[key] = value
        return cls(compiles=[CompileSpec.from_dict(c, f"compiles[{i}]") for i, c in enumerate(d["compiles"])],
                   autotune=[AutotuneSpec.from_dict(a, f"autotune[{i}]")
                             for i, a in enumerate(d.get("autotune") or [])], **build)

    @classmethod
    def from_json(cls, data: bytes | str) -> "CompileRecord":
        """Strict JSON (cachebake.jsonio: nesting bounded, no duplicate keys), then checked."""
        return cls.from_dict(parse_json(data, RECORD_DOCUMENT))


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
        return shown(names[path[0]], 40) + "".join(f"[{i}]" for i in path[1:])
    return shown(str(path), 40)


def _short(v) -> str:
    """A value for a label: JSON (control characters escaped), short."""
    return shorten(json.dumps(v, sort_keys=True, default=str), 24)

