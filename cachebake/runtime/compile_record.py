"""The compile record of one kernel miss: what it takes to compile it again, anywhere.

``encode`` runs in the server (from the compilation listener's ``src`` and ``metadata``);
``decode`` runs in ``cachebake replay --misses`` on any machine, and gives back the arguments
of ``triton.compile(ASTSource(fn, signature, constexprs, attrs), target, options)`` that
reproduce the same cache key.

The encoding of constants, attrs and signatures is Triton's own, from
``triton/runtime/jit.py`` (``serialize_specialization_data`` / ``JITFunction.preload``):
keys as lists of argument indices, dtypes as their name, ``tl.constexpr`` as
``{"constexpr": v}``, tuples as lists (converted back on decode).  Options are those that
differ from the backend's defaults for the target, because the full option set holds this
machine's absolute libdevice path (``extern_libs``), which must come from the replaying
machine.

This is a superset of what the record/replay engine records for a bake (kernel identity,
source hash, specialization, options, target): ``foldback`` maps a miss onto it.
"""

from __future__ import annotations

import functools
from typing import Any

RECORD_VERSION = 1


class NotReplayable(ValueError):
    """A record that cannot be compiled again here: the reason says why, in one line."""


# -- encode (in the server) --------------------------------------------------------------------

def encode(src, metadata: dict, env_vars: dict | None = None) -> dict:
    """The record of a compile of ``src`` (an ``ASTSource``) with ``metadata`` (the compile's
    metadata dict as the listener gets it)."""
    fn = src.fn
    target = _target_dict(metadata.get("target"))
    record: dict[str, Any] = {
        "version": RECORD_VERSION,
        "kernel": src.name,
        "module": getattr(fn, "module", None),
        "qualname": getattr(fn, "__qualname__", None),
        "source_hash": getattr(fn, "cache_key", None),
        "signature": {k: _jsonable(v) for k, v in src.signature.items()},
        "constant_keys": [list(k) for k in src.constants],
        "constant_vals": [_encode_constant(v) for v in src.constants.values()],
        "attrs_keys": [list(k) for k in src.attrs],
        "attrs_vals": [_jsonable(v) for v in src.attrs.values()],
        "options": _non_default_options(metadata, target),
        "target": target,
        "env_vars": dict(sorted((env_vars or {}).items())),
        "triton_version": metadata.get("triton_version"),
    }
    return record


def _target_dict(target) -> dict | None:
    if target is None:
        return None
    if isinstance(target, dict):
        return {k: target.get(k) for k in ("backend", "arch", "warp_size")}
    return {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size}


@functools.lru_cache(maxsize=None)
def _default_options(backend: str, arch, warp_size: int) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return dict(make_backend(GPUTarget(backend, arch, warp_size)).parse_options({}).__dict__)


def _non_default_options(metadata: dict, target: dict | None) -> dict:
    if target is None:
        return {}
    defaults = _default_options(target["backend"], target["arch"], target["warp_size"])
    return {k: _jsonable(metadata[k]) for k in sorted(defaults)
            if k in metadata and _jsonable(metadata[k]) != _jsonable(defaults[k])}


def _encode_constant(value):
    kind = type(value).__name__
    if kind == "dtype":
        return str(value)
    if kind == "constexpr":
        return {"constexpr": _jsonable(value.value)}
    if kind == "JITFunction" or hasattr(value, "cache_key") and hasattr(value, "module"):
        return {"jit_function": f"{value.module}:{value.__qualname__}",
                "source_hash": value.cache_key}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_encode_constant(v) for v in value]
    return {"unencodable": repr(value)}


def _jsonable(value):
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


# -- decode (in replay) ------------------------------------------------------------------------

def resolve_function(module: str | None, qualname: str | None):
    """The ``JITFunction`` a record names (unwrapping ``@autotune`` / ``@heuristics``)."""
    import importlib

    from triton.runtime.jit import JITFunction

    if not module or not qualname or "<locals>" in qualname:
        raise NotReplayable(f"kernel {module}:{qualname} is not importable by name")
    try:
        obj = importlib.import_module(module)
    except Exception as e:  # any import failure of the user's module is a reason, not a crash
        raise NotReplayable(f"cannot import {module}: {type(e).__name__}: {e}") from None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise NotReplayable(f"{module} has no {qualname}")
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise NotReplayable(f"{module}:{qualname} is not a Triton kernel")
    return obj


def decode(record: dict):
    """(ASTSource, GPUTarget, options, env_vars) that compile ``record`` again, or
    NotReplayable with the reason."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import convert_to_tuple_if_list
    import triton.language as tl

    if record.get("version") != RECORD_VERSION:
        raise NotReplayable(f"record version {record.get('version')!r} is not {RECORD_VERSION}")
    fn = resolve_function(record.get("module"), record.get("qualname"))
    if record.get("source_hash") and fn.cache_key != record["source_hash"]:
        raise NotReplayable(f"{fn.module}:{fn.__qualname__}: the source here differs from the "
                            "server's (source hash)")

    def constant(value):
        if isinstance(value, str) and tl.dtype.is_dtype(value):
            return tl.dtype(value)
        if isinstance(value, dict):
            if "constexpr" in value:
                return tl.constexpr(value["constexpr"])
            if "jit_function" in value:
                mod, _, qual = value["jit_function"].partition(":")
                dep = resolve_function(mod, qual)
                if dep.cache_key != value.get("source_hash"):
                    raise NotReplayable(f"{value['jit_function']}: the source here differs")
                return dep
            raise NotReplayable(f"a constant cannot be rebuilt: {value}")
        if isinstance(value, list):
            return tuple(constant(v) for v in value)
        return value

    constants = {tuple(k): constant(v) for k, v in zip(record["constant_keys"], record["constant_vals"])}
    attrs = {tuple(k): v for k, v in zip(record["attrs_keys"], record["attrs_vals"])}
    signature = {k: convert_to_tuple_if_list(v) for k, v in record["signature"].items()}
    t = record.get("target") or {}
    try:
        target = GPUTarget(t["backend"], t["arch"], t["warp_size"])
    except (KeyError, TypeError):
        raise NotReplayable(f"record has no usable target: {t!r}") from None
    # As JITFunction.preload does: JSON turned the tuple-valued options into lists.
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in (record.get("options") or {}).items()}
    src = ASTSource(fn, signature, constexprs=constants, attrs=attrs)
    return src, target, options, dict(record.get("env_vars") or {})
