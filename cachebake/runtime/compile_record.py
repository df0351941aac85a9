"""The compile record of one kernel miss: what it takes to compile it again, anywhere.

``encode`` runs in the server, from the compilation listener; ``decode`` runs in
``cachebake replay --misses`` on any machine and gives back the arguments of
``triton.compile(ASTSource(fn, signature, constexprs, attrs), target, options)`` that
reproduce the server's key (fold-back checks that it does).

The entry has the shape of the record/replay engine's ``CompileSpec`` (``to_dict``): the
kernel (module, qualified name, name, source hash), the signature as ``[name, type]`` pairs in
argument order, constexprs and attrs as ``[argument path, value]`` pairs in the JIT's order
(the key hashes ``str(attrs)`` and the signature order), the launch options without the
fields the backend derives from the target, the cache-invalidating variables, the target
(``cuda:90``) and Triton's key hash.  Values that are not JSON scalars are one-key objects
naming their kind (``{"dtype": "fp16"}``, ``{"constexpr": 4}``, ``{"tuple": [...]}``,
``{"jit": kernel}``).  So the replay engine reads these entries as they are; until it is in
this tree, this module encodes and decodes them itself.

Where the options come from: the listener gets the kernel's metadata after the compile stages
ran, and a stage may rewrite ``num_warps`` there (warp specialization does,
triton/backends/nvidia/compiler.py ``make_llir``); the options that went into the key are a
local of ``triton.compile``, the listener's caller, so they are read from that frame, and from
the metadata only where that frame is not found.
"""

from __future__ import annotations

import math
import sys
from typing import Any

# CUDAOptions fields parse_options derives from the target (triton/backends/nvidia/compiler.py).
TARGET_DERIVED_OPTIONS = ("arch", "supported_fp8_dtypes", "deprecated_fp8_dot_operand_dtypes",
                          "max_num_imprecise_acc_default", "backend_name", "warp_size")


class NotReplayable(ValueError):
    """A record that cannot be compiled again here: the reason says why, in one line."""


# -- encode (in the server) --------------------------------------------------------------------

def encode(src, metadata: dict) -> dict:
    """The record of the ``triton.compile`` of ``src`` (an ``ASTSource``) now reporting to
    the listener with ``metadata``."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    options, target, env_vars = _compile_locals()
    if target is None:
        t = metadata["target"]
        target = t if isinstance(t, GPUTarget) else GPUTarget(t["backend"], t["arch"], t["warp_size"])
    backend = make_backend(target)
    if options is None:
        fields = type(backend.parse_options({})).__dataclass_fields__
        options = backend.parse_options({k: metadata[k] for k in fields if k in metadata})
    if env_vars is None:
        env_vars = get_cache_invalidating_env_vars()
    fn = _unwrap(src.fn)
    default_libs = type(options)().extern_libs
    return {
        "kernel": {"module": fn.fn.__module__, "qualname": fn.fn.__qualname__, "name": fn.__name__,
                   "source_hash": fn.cache_key},
        "signature": [[k, _listify(v)] for k, v in src.signature.items()],
        "constexprs": [[list(k), encode_value(v)] for k, v in src.constants.items()],
        "attrs": [[list(k), _listify(v)] for k, v in src.attrs.items()],
        "options": {k: _listify(v) for k, v in options.__dict__.items()
                    if k not in TARGET_DERIVED_OPTIONS
                    and not (k == "extern_libs" and _listify(v) == _listify(default_libs))},
        "env_vars": dict(sorted(dict(env_vars).items())),
        "target": f"{target.backend}:{target.arch}",
        "hash": str(metadata.get("hash") or ""),
        "verified": False,  # fold-back verifies by compiling: the key must come out the same
        "seen": "compile",
    }


def _compile_locals():
    """(options, target, env_vars) of the ``triton.compile`` call the listener runs in."""
    frame = sys._getframe(1)
    for _ in range(12):
        frame = frame.f_back
        if frame is None:
            break
        if frame.f_code.co_name == "compile" and frame.f_globals.get("__name__") == "triton.compiler.compiler":
            loc = frame.f_locals
            return loc.get("options"), loc.get("target"), loc.get("env_vars")
    return None, None, None


def _unwrap(obj):
    from triton.runtime.jit import JITFunction

    for _ in range(16):
        if isinstance(obj, JITFunction):
            return obj
        obj = getattr(obj, "fn", None)
    raise TypeError("not a @triton.jit function")


def encode_value(v: Any) -> Any:
    """A constexpr as JSON: plain scalars stay plain, anything else names its kind."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, tuple):
        return {"tuple": [encode_value(x) for x in v]}
    if isinstance(v, list):
        return {"list": [encode_value(x) for x in v]}
    kind, module = type(v).__name__, type(v).__module__ or ""
    if module.startswith("triton") and kind == "constexpr":
        return {"constexpr": encode_value(v.value)}
    if module.startswith("triton") and hasattr(v, "name") and kind.endswith("dtype"):
        return {"dtype": v.name}
    if hasattr(v, "cache_key") and hasattr(v, "fn"):  # a @triton.jit function as a constexpr
        fn = _unwrap(v)
        return {"jit": {"module": fn.fn.__module__, "qualname": fn.fn.__qualname__,
                        "name": fn.__name__, "source_hash": fn.cache_key}}
    return {"unsupported": f"{module}.{kind}", "repr": str(v)}


def _listify(v):
    return [_listify(x) for x in v] if isinstance(v, (tuple, list)) else v


# -- decode (in replay) ------------------------------------------------------------------------

def resolve_kernel(ref: dict):
    """The JITFunction a record names, checked against the recorded source hash."""
    import importlib

    module, qualname = ref.get("module"), ref.get("qualname")
    label = f"{module}:{qualname}"
    if not module or not qualname or "<locals>" in qualname or module == "__main__":
        raise NotReplayable(f"{label}: not importable by name (defined in a function or a script)")
    try:
        obj = importlib.import_module(module)
    except Exception as e:  # any failure of the user's module is a reason, not a crash
        raise NotReplayable(f"{label}: cannot import {module}: {type(e).__name__}: {e}") from None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise NotReplayable(f"{label}: {module} has no {qualname}")
    try:
        fn = _unwrap(obj)
    except TypeError:
        raise NotReplayable(f"{label}: not a @triton.jit function") from None
    if fn.cache_key != ref.get("source_hash"):
        raise NotReplayable(f"{label}: the source here differs from the server's "
                            f"(hash {fn.cache_key[:12]} here, {str(ref.get('source_hash'))[:12]} logged)")
    return fn


def decode_value(v):
    if not isinstance(v, dict):
        return v
    if "tuple" in v:
        return tuple(decode_value(x) for x in v["tuple"])
    if "list" in v:
        return [decode_value(x) for x in v["list"]]
    if "float" in v:
        return float(v["float"])
    if "constexpr" in v:
        import triton.language as tl

        return tl.constexpr(decode_value(v["constexpr"]))
    if "dtype" in v:
        import triton.language as tl

        return tl.dtype(v["dtype"])
    if "jit" in v:
        return resolve_kernel(v["jit"])
    raise NotReplayable(f"a constexpr of type {v.get('unsupported', '?')} ({v.get('repr', '')}) "
                        "is not data: it cannot be rebuilt from the log")


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def decode(record: dict):
    """(ASTSource, GPUTarget, options, env_vars) that compile ``record`` again, or
    NotReplayable with the reason."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from cachebake.artifact.fingerprint import GPUTargetSpec
    from cachebake.errors import BadInput

    try:
        fn = resolve_kernel(record["kernel"])
        signature = {name: _tuples(ty) for name, ty in record["signature"]}
        constexprs = {tuple(path): decode_value(v) for path, v in record["constexprs"]}
        attrs = {tuple(path): value for path, value in record["attrs"]}
        options = {k: _tuples(v) for k, v in record["options"].items()}
        t = GPUTargetSpec.parse(record["target"])
    except (KeyError, TypeError, ValueError, AttributeError, BadInput) as e:
        if isinstance(e, NotReplayable):
            raise
        raise NotReplayable(f"malformed record ({type(e).__name__}: {e})") from None
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return src, GPUTarget(t.backend, t.arch, t.warp_size), options, dict(record.get("env_vars") or {})
