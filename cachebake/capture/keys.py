"""From a compile record's entry to the key Triton computes for it: the inputs of
``triton.compile`` rebuilt exactly as Triton 3.6's JIT builds them for a launch.

runtime/jit.py ``_pack_args``/``_do_compile``: the ``ASTSource`` (signature in argument order,
constexprs and attrs keyed by argument paths), the launch options parsed by the target's
backend, and the cache-invalidating variables.  The recorder checks each entry with
``spec_key`` while the kernel's module is loaded (an entry whose re-derived key is Triton's is
``verified``); replay's workers compile from the same functions (cachebake.replay.worker), and
``autotune_result_hash`` is the key Triton's autotuner stores a result under.
"""

from __future__ import annotations

import hashlib

from cachebake.capture.record import AutotuneSpec, CompileSpec, KernelRef


class ReplayProblem(Exception):
    """An entry that cannot be compiled as recorded; the message says why (one line)."""


def target_of(text: str):
    from triton.backends.compiler import GPUTarget

    from cachebake.gpu import GPUTargetSpec

    t = GPUTargetSpec.parse(text)
    return GPUTarget(t.backend, t.arch, t.warp_size)


def resolve_kernel(ref: KernelRef):
    """The JITFunction ``ref`` names, checked against the recorded source hash."""
    import importlib

    from triton.runtime.jit import JITFunction

    if "<locals>" in ref.qualname or ref.module == "__main__":
        raise ReplayProblem(f"{ref.label}: not importable by name (defined in a function or a script)")
    try:
        obj = importlib.import_module(ref.module)
    except Exception as e:
        raise ReplayProblem(f"{ref.label}: module {ref.module} does not import here: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    for part in ref.qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ReplayProblem(f"{ref.label}: {ref.module} has no {ref.qualname}")
    seen = 0
    while not isinstance(obj, JITFunction):
        obj, seen = getattr(obj, "fn", None), seen + 1
        if obj is None or seen > 16:
            raise ReplayProblem(f"{ref.label}: not a @triton.jit function")
    if obj.cache_key != ref.source_hash:
        raise ReplayProblem(f"{ref.label}: source differs from the recorded kernel "
                            f"(hash {obj.cache_key[:12]} here, {ref.source_hash[:12]} recorded)")
    return obj


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
        return resolve_kernel(KernelRef(**v["jit"]))
    raise ReplayProblem(f"a constexpr of type {v.get('unsupported', '?')} ({v.get('repr', '')}) "
                        "is not data: it cannot be rebuilt from the record")


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def build_source(spec: CompileSpec, fn=None):
    """The ASTSource the JIT would build for this launch."""
    from triton.compiler import ASTSource

    fn = fn or resolve_kernel(spec.kernel)
    signature = {name: _tuples(ty) for name, ty in spec.signature}
    constexprs = {tuple(path): decode_value(v) for path, v in spec.constexprs}
    attrs = {tuple(path): value for path, value in spec.attrs}
    return ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)


def compile_options(spec: CompileSpec) -> dict:
    """The launch options, lists back to tuples (JSON has no tuples; Triton hashes reprs)."""
    return {k: _tuples(v) for k, v in spec.options.items()}


def spec_key(spec: CompileSpec, target, fn=None, env_vars: dict | None = None) -> str:
    """The key hash ``triton.compile`` computes for this entry on ``target`` (sha256 hex)."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key

    if isinstance(target, str):
        target = target_of(target)
    src = build_source(spec, fn)
    backend = make_backend(target)
    options = backend.parse_options(compile_options(spec))
    env = spec.env_vars if env_vars is None else env_vars
    return hashlib.sha256(get_cache_key(src, backend, options, env).encode()).hexdigest()


def autotune_result_hash(spec: AutotuneSpec, target, fn=None) -> str:
    """The key Autotuner.check_disk_cache computes for this tuning key on ``target``."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key

    if isinstance(target, str):
        target = target_of(target)
    fn = fn or resolve_kernel(spec.kernel)
    parts = [triton_key(), make_backend(target).hash(), fn.cache_key,
             str(sorted(spec.env_vars.items())), spec.tuning_key]
    parts += [config_text(c) for c in spec.configs]
    return hashlib.sha256("-".join(parts).encode()).hexdigest()


def make_config(c):
    from triton import Config

    return Config({k: decode_value(v) for k, v in c.kwargs}, num_warps=c.num_warps,
                  num_stages=c.num_stages, num_ctas=c.num_ctas, maxnreg=c.maxnreg)


def config_text(c) -> str:
    return str(make_config(c))
