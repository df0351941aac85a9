"""From a compile record's entry to the key Triton computes for it: the inputs of
``triton.compile`` rebuilt exactly as Triton 3.6's JIT builds them for a launch.

runtime/jit.py ``_pack_args``/``_do_compile``: the ``ASTSource`` (signature in argument order,
constexprs and attrs keyed by argument paths), the launch options parsed by the target's
backend, and the cache-invalidating variables.  The recorder checks each entry with
``spec_key`` while the kernel's module is loaded (an entry whose re-derived key is Triton's is
``verified``); replay's workers compile from the same functions (cachebake.replay.worker), and
``autotune_result_hash`` is the key Triton's autotuner stores a result under.

An entry is data from a process that may be compromised (a serving pod's miss log, an artifact
from a registry), so nothing in it is run as it says.  Before anything is imported or compiled
(``entry_problems``):

- the modules it names (the kernel's, and those of @jit functions passed as constexprs) must be
  dotted Python identifiers, no program's ``__main__``, and on a ``ModuleAllowlist``: the
  packages whose kernels cachebake bakes (``DEFAULT_KERNEL_PACKAGES``), plus what the user names
  (``--allow-module``), plus, for fold-back, the modules of the base artifact's own record.  An
  import runs the module's code; a refused name is never imported;
- its launch options pass only through ``OPTION_RULES``, an allowlist of Triton 3.6's
  ``CUDAOptions`` fields (triton/backends/nvidia/compiler.py), each type- and range-checked;
  ``ir_override`` (a file of IR compiled instead of the kernel) and ``extern_libs`` (files to
  link) name paths and are refused unless unset, ``ptx_options`` (ptxas arguments) unless it is
  this process's own;
- its cache-invalidating variables are compared with this process's (``env_problem``), never
  applied: ``LLVM_PASS_PLUGIN_PATH`` makes LLVM dlopen a library, ``MLIR_DUMP_PATH`` writes a
  file, and a worker's environment reaches gcc, ld and ptxas.
"""

from __future__ import annotations

import hashlib
import re
import sys
from typing import Iterable

from cachebake.capture.record import TARGET_DERIVED_OPTIONS, AutotuneSpec, CompileSpec, KernelRef, shown


class ReplayProblem(Exception):
    """An entry that cannot be compiled as recorded; the message says why (one line)."""


# -- modules -----------------------------------------------------------------------------------

# The packages whose kernels cachebake bakes: vLLM's ops (and the stand-ins of
# bench/vllm_ops/make_vllm_ops.py, which keep vLLM's module names) and Triton's own.
DEFAULT_KERNEL_PACKAGES = ("vllm", "triton")
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*")
_HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_MODULE_NAME = 200


def module_name_problem(name) -> str | None:
    """Why ``name`` is not a module name cachebake would import, or None."""
    if not isinstance(name, str) or not name:
        return "is not a module name"
    if len(name) > MAX_MODULE_NAME or not _DOTTED.fullmatch(name):
        return "is not a dotted Python identifier"
    if "__main__" in name.split("."):
        return "is a program's __main__ (importing it runs the program)"
    return None


class ModuleAllowlist:
    """The modules an entry may name: each of ``names`` and the modules inside it.  ``loaded``:
    only modules this process has already imported (the recorder and the serve-time miss log
    check entries of kernels that are running; nothing is imported for that)."""

    def __init__(self, names: Iterable[str] = (), *, defaults: bool = True, loaded: bool = False):
        names = set(names) | (set(DEFAULT_KERNEL_PACKAGES) if defaults else set())
        for name in names:
            problem = module_name_problem(name)
            if problem:
                raise ValueError(f"--allow-module {shown(name)} {problem}")
        self.names = tuple(sorted(names))
        self.loaded = loaded

    @classmethod
    def already_imported(cls) -> "ModuleAllowlist":
        return cls(defaults=False, loaded=True)

    def allows(self, module: str) -> bool:
        if self.loaded:
            return module in sys.modules
        return any(module == n or module.startswith(n + ".") for n in self.names)

    def problem(self, module) -> str | None:
        """Why an entry may not name ``module``, or None: checked before any import."""
        problem = module_name_problem(module)
        if problem:
            return f"module {shown(module, 80)} {problem}: refused, not imported"
        if self.allows(module):
            return None
        if self.loaded:
            return f"module {module} is not loaded in this process: not imported"
        listed = ", ".join(self.names)
        return (f"module {module} is not on the allowlist ({shown(listed, 200)}; add one with "
                "--allow-module NAME): refused, not imported")


def kernel_problem(ref: KernelRef, allowed: ModuleAllowlist) -> str | None:
    """Why ``ref`` cannot be looked up by name, or None: before any import."""
    problem = allowed.problem(ref.module)
    if problem:
        return f"{ref.label}: {problem}"
    if "<locals>" in ref.qualname:
        return f"{ref.label}: not importable by name (defined in a function)"
    parts = ref.qualname.split(".")
    if not _DOTTED.fullmatch(ref.qualname) or any(p.startswith("__") and p.endswith("__") for p in parts):
        return f"{ref.label}: qualified name {shown(ref.qualname, 80)} is not a path of plain identifiers"
    if not re.fullmatch(_IDENTIFIER, ref.name):
        return f"{ref.label}: kernel name {shown(ref.name, 80)} is not a Python identifier"
    if not _HEX64.fullmatch(ref.source_hash):
        return f"{ref.label}: source hash {shown(ref.source_hash, 80)} is not a sha256 hex digest"
    return None


# -- launch options ----------------------------------------------------------------------------

def _integer(lo: int, hi: int, *, optional: bool = False, power_of_two: bool = False):
    def check(v):
        if v is None and optional:
            return None
        if type(v) is not int:
            return "is not an integer" + (" or null" if optional else "")
        if not lo <= v <= hi:
            return f"is {v}, outside {lo}..{hi}"
        if power_of_two and v & (v - 1):
            return f"is {v}, not a power of 2"
        return None
    return check


def _boolean(v):
    return None if isinstance(v, bool) else "is not true or false"


def _one_of(*values):
    listed = ", ".join(repr(v) for v in values)

    def check(v):
        return None if isinstance(v, str) and v in values else f"is {shown(v, 40)}, not one of {listed}"
    return check


_DOT_PRECISIONS = ("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6")  # CUDAOptions.allowed_dot_input_precisions


def _precisions(v):
    if not (isinstance(v, list) and 0 < len(v) <= len(_DOT_PRECISIONS)
            and all(isinstance(x, str) and x in _DOT_PRECISIONS for x in v)):
        return f"is not a list of {', '.join(_DOT_PRECISIONS)}"
    return None


def _unset(what: str):
    def check(v):
        return None if v is None else f"names {what}: a record's options never name files (refused)"
    return check


def _own_ptxas_options(v):
    from triton import knobs

    if v == knobs.nvidia.ptxas_options:
        return None
    return ("is passed to ptxas as command-line arguments, and differs from this process's "
            "PTXAS_OPTIONS: set PTXAS_OPTIONS yourself (if you trust it) and run again")


# Triton 3.6's CUDAOptions fields a launch sets (everything but TARGET_DERIVED_OPTIONS, which
# the target's backend derives; a record never carries them).  Ranges: CUDA's 1024 threads a
# block (32 warps), clusters of at most 16 CTAs, .maxnreg at most 255 registers.
OPTION_RULES = {
    "num_warps": _integer(1, 32, power_of_two=True),
    "num_ctas": _integer(1, 16),
    "num_stages": _integer(0, 32),
    "maxnreg": _integer(1, 255, optional=True),
    "ptx_version": _integer(10, 999, optional=True),
    "ptx_options": _own_ptxas_options,
    "ir_override": _unset("a file of IR to compile instead of the kernel"),
    "extern_libs": _unset("library files to link (the default libdevice is never recorded)"),
    "enable_fp_fusion": _boolean,
    "enable_reflect_ftz": _boolean,
    "launch_cooperative_grid": _boolean,
    "launch_pdl": _boolean,
    "default_dot_input_precision": _one_of(*_DOT_PRECISIONS),
    "allowed_dot_input_precisions": _precisions,
    "debug": _boolean,
    "sanitize_overflow": _boolean,
    "instrumentation_mode": _one_of("", "consan"),
}


def option_problems(options: dict) -> list[str]:
    """Why each launch option of an entry is refused (empty: every one passes)."""
    out = []
    for name, value in options.items():
        rule = OPTION_RULES.get(name)
        if rule is None:
            why = ("is derived from the target by Triton, never recorded" if name in TARGET_DERIVED_OPTIONS
                   else "is not one of Triton 3.6's compile options")
            out.append(f"option {shown(name, 40)} {why}")
            continue
        problem = rule(value)
        if problem:
            out.append(f"option {name} {problem}")
    return out


def entry_problems(spec: CompileSpec, allowed: ModuleAllowlist) -> list[str]:
    """Everything that refuses ``spec`` before it is imported or compiled: the modules it
    names, its launch options.  Empty: it may be compiled."""
    problems = []
    problem = kernel_problem(spec.kernel, allowed)
    if problem:
        problems.append(problem)
    for _, value in spec.constexprs:
        for ref in _jit_refs(value):
            if isinstance(ref, str):
                problems.append(f"{spec.kernel.label}: {ref}")
                continue
            problem = kernel_problem(ref, allowed)
            if problem:
                problems.append(f"{spec.kernel.label}: a constexpr names {problem}")
    problems += [f"{spec.kernel.label}: {p}" for p in option_problems(spec.options)]
    return problems


def _jit_refs(value):
    """The @jit functions a constexpr value names (a str: why one is malformed)."""
    if isinstance(value, list):
        for v in value:
            yield from _jit_refs(v)
    elif isinstance(value, dict):
        if "jit" in value:
            try:
                yield _kernel_ref(value["jit"])
            except ReplayProblem as e:
                yield str(e)
        for v in value.values():
            if isinstance(v, (list, dict)):
                yield from _jit_refs(v)


def _kernel_ref(d) -> KernelRef:
    from cachebake.capture.record import _Fields
    from cachebake.errors import InvalidDocument

    try:
        return KernelRef.from_dict(d, _Fields("constexpr"), "jit")
    except InvalidDocument as e:
        raise ReplayProblem(f"a constexpr's @jit function is malformed ({e.reason})") from None


# -- variables ---------------------------------------------------------------------------------

def env_problem(recorded: dict, here: dict) -> str | None:
    """Why an entry recorded under ``recorded`` cache-invalidating variables cannot be compiled
    where Triton reads ``here``, or None.  The variables are listed, never applied."""
    names = sorted(set(recorded) | set(here))
    differ = [n for n in names if recorded.get(n) != here.get(n)]
    if not differ:
        return None
    parts = [f"{shown(n, 60)} (recorded {shown(repr(recorded[n]), 60) if n in recorded else 'unset'}, "
             f"here {shown(repr(here[n]), 60) if n in here else 'unset'})" for n in differ[:8]]
    more = f" and {len(differ) - 8} more" if len(differ) > 8 else ""
    return ("cache-invalidating variables differ from this process's: " + ", ".join(parts) + more
            + "; a record's variables are never applied: set them yourself (if you trust them) "
            "and run again")


def target_of(text: str):
    from triton.backends.compiler import GPUTarget

    from cachebake.gpu import GPUTargetSpec

    t = GPUTargetSpec.parse(text)
    return GPUTarget(t.backend, t.arch, t.warp_size)


def resolve_kernel(ref: KernelRef, allowed: ModuleAllowlist | None = None):
    """The JITFunction ``ref`` names, checked against the recorded source hash.  Its module is
    imported only if ``allowed`` allows it (default: only modules already imported)."""
    import importlib

    from triton.runtime.jit import JITFunction

    problem = kernel_problem(ref, allowed or ModuleAllowlist.already_imported())
    if problem:
        raise ReplayProblem(problem)
    try:
        obj = importlib.import_module(ref.module)
    except (Exception, SystemExit) as e:  # a module that exits on import is not a kernel module
        first = (str(e).splitlines() or [""])[0]
        raise ReplayProblem(f"{ref.label}: module {ref.module} does not import here: "
                            f"{type(e).__name__}: {shown(first, 200)}") from None
    for part in ref.qualname.split("."):
        try:
            obj = getattr(obj, part, None)
        except Exception:  # a module __getattr__ that raises
            obj = None
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


def decode_value(v, allowed: ModuleAllowlist | None = None):
    """A constexpr/config value from its JSON form (record.encode_value's)."""
    if not isinstance(v, dict):
        return v
    if len(v) == 1 and isinstance(v.get("tuple"), list):
        return tuple(decode_value(x, allowed) for x in v["tuple"])
    if len(v) == 1 and isinstance(v.get("list"), list):
        return [decode_value(x, allowed) for x in v["list"]]
    if len(v) == 1 and v.get("float") in ("inf", "-inf", "nan"):
        return float(v["float"])
    if len(v) == 1 and "constexpr" in v:
        import triton.language as tl

        return tl.constexpr(decode_value(v["constexpr"], allowed))
    if len(v) == 1 and isinstance(v.get("dtype"), str):
        import triton.language as tl

        if v["dtype"] not in (tl.dtype.SINT_TYPES + tl.dtype.UINT_TYPES + tl.dtype.FP_TYPES
                              + tl.dtype.OTHER_TYPES):
            raise ReplayProblem(f"a constexpr names dtype {shown(v['dtype'], 40)}, not one of Triton's")
        return tl.dtype(v["dtype"])
    if len(v) == 1 and "jit" in v:
        return resolve_kernel(_kernel_ref(v["jit"]), allowed)
    if "unsupported" in v:
        raise ReplayProblem(f"a constexpr of type {shown(v.get('unsupported'), 60)} "
                            f"({shown(v.get('repr', ''), 60)}) is not data: it cannot be rebuilt from the record")
    raise ReplayProblem(f"a constexpr value {shown(v, 60)} is not one cachebake writes")


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def build_source(spec: CompileSpec, fn=None, allowed: ModuleAllowlist | None = None):
    """The ASTSource the JIT would build for this launch."""
    from triton.compiler import ASTSource

    fn = fn or resolve_kernel(spec.kernel, allowed)
    signature = {name: _tuples(ty) for name, ty in spec.signature}
    constexprs = {tuple(path): decode_value(v, allowed) for path, v in spec.constexprs}
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


def autotune_result_hash(spec: AutotuneSpec, target, fn=None,
                         allowed: ModuleAllowlist | None = None) -> str:
    """The key Autotuner.check_disk_cache computes for this tuning key on ``target``."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key

    if isinstance(target, str):
        target = target_of(target)
    fn = fn or resolve_kernel(spec.kernel, allowed)
    parts = [triton_key(), make_backend(target).hash(), fn.cache_key,
             str(sorted(spec.env_vars.items())), spec.tuning_key]
    parts += [config_text(c, allowed) for c in spec.configs]
    return hashlib.sha256("-".join(parts).encode()).hexdigest()


def make_config(c, allowed: ModuleAllowlist | None = None):
    from triton import Config

    return Config({k: decode_value(v, allowed) for k, v in c.kwargs}, num_warps=c.num_warps,
                  num_stages=c.num_stages, num_ctas=c.num_ctas, maxnreg=c.maxnreg)


def config_text(c, allowed: ModuleAllowlist | None = None) -> str:
    return str(make_config(c, allowed))
