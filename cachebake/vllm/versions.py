"""What differs between vLLM releases, in one place: one object per way vLLM names its
torch.compile cache (like vLLM's own compiler_interface.py: one interface, one class per kind).

Everything else in the wing asks ``scheme_for(version)`` (the installed vLLM's ``__version__``
inside vLLM's processes, the bake's recorded version where vLLM is not imported) and never
tests a version itself.  Two schemes are known, read from vLLM's source:

``HashList`` (vLLM 0.24 .. 0.33)
    backend dir ``sha256(str([env_hash, config_hash, code_hash, compiler_hash]))[:10]``
    (0.24 compilation/backends.py ``VllmBackend.__call__``; 0.33 backends.py:1091-1094);
    config hash ``VllmConfig.compute_hash()``; compiler hash
    ``CompilerManager.compute_hash(cfg)``; code hash sha256 of "path\\ntext\\n..." of the
    traced files (0.33 backends.py:1083).
``FactorDicts`` (vLLM 0.34 ..)
    ``compute_env_and_config_hashes`` (0.34 compilation/caching.py:442-453): the config hash is
    ``hash_factors(VllmConfig.compile_factors())`` (config/vllm.py:490; ``compute_hash`` is
    gone); the compiler hash ``hash_factors(CompilerManager.compile_factors(cfg))``
    (backends.py:163-164, 1066-1067); the code hash ``hash_factors({"files":
    get_code_factors(...)})`` (caching.py:38-61, backends.py:1072-1073); the backend dir
    ``hash_factors({"env", "config", "code", "compiler"})[:10]`` of the four factor dicts
    (backends.py:1074-1091).  With the mega AOT artifact (default on torch >= 2.12, envs.py:412-419)
    the AOT hash also holds ``get_inductor_factors()`` (caching.py:612-623) and a load never
    reaches the backend dir (caching.py:415-416).

Both name the AOT artifact ``sha256(str(factors))`` (decorators.py), so a record keeps each
factor's ``repr`` (``str`` of a list is "[" + ", ".join(reprs) + "]") and the dir can be
predicted from the reprs alone (``aot_hash_of_reprs``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable


def hash_factors(items: Any) -> str:
    """vLLM's ``hash_factors`` (config/utils.py, the same in 0.24 and 0.34: sha256 of the
    sorted-keys JSON), so a record's factors can be re-hashed where vLLM is not importable."""
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


def aot_hash_of_reprs(reprs: list[str]) -> str:
    """The AOT dir name from each factor's ``repr``: ``sha256(str(factors))`` (decorators.py)."""
    return hashlib.sha256(("[" + ", ".join(reprs) + "]").encode()).hexdigest()


def version_tuple(version: str | None) -> tuple[int, ...]:
    """(major, minor, patch) of a vLLM version string ("0.34.0", "0.24.1.dev3+g..."); () if none."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(g or 0) for g in m.groups()) if m else ()


class CompileHashes:
    """How one range of vLLM releases names its torch.compile cache."""

    name = "?"
    only_v2_runner = False
    # whether an AOT load still runs VllmBackend.__call__ (and so needs the backend dir)
    aot_load_needs_backend_dir = True

    def config_hash(self, vllm_config: Any) -> str:
        raise NotImplementedError

    def compiler_hash(self, backend: Any, vllm_config: Any) -> str:
        raise NotImplementedError

    def config_parts(self, vllm_config: Any, value: Callable[[Any], Any]) -> dict[str, Any]:
        """Each sub-config (a VllmConfig field): {"hash", "factors": {name: value(v)}}."""
        raise NotImplementedError

    def code_hash(self, paths: list[str] | set[str], read: Callable[[str], str]) -> str:
        raise NotImplementedError

    def dir_hash(self, env_hash: str, config_hash: str, code_hash: str, compiler_hash: str,
                 all_factors: dict[str, Any] | None = None) -> str | None:
        """The backend dir's name; None where the scheme needs factors that were not given."""
        raise NotImplementedError

    def backend_factors(self, backend: Any, vllm_config: Any, env_factors: dict[str, Any],
                        paths: list[str] | set[str], read: Callable[[str], str]) -> dict[str, Any] | None:
        """Inside ``VllmBackend.__call__``: the factor dicts the dir is named by (None where
        the scheme names it by hashes alone)."""
        return None

    def backend_inductor_factors(self, backend: Any, vllm_config: Any) -> list[Any]:
        """Inside ``VllmBackend.__call__``: the Inductor factors its compiler hash holds."""
        from vllm.compilation import compiler_interface as ci

        return list(ci.get_inductor_factors())

    def inductor_factors(self, aot_compile: bool) -> list[Any]:
        """vLLM's ``get_inductor_factors`` as its compiler hash and (mega AOT) its AOT hash
        take it in a process that is not inside torch's AOT compile."""
        raise NotImplementedError


def _read_all(paths: list[str] | set[str], read: Callable[[str], str]):
    for path in paths:
        try:
            yield path, read(path)
        except (OSError, UnicodeDecodeError):
            yield path, None


class HashList(CompileHashes):
    """vLLM 0.24 .. 0.33 (see the module doc)."""

    name = "hash-list"
    only_v2_runner = False  # 0.24 defaults to V1, 0.33 to V2; both have VllmConfig.use_v2_model_runner

    def config_hash(self, vllm_config: Any) -> str:
        return vllm_config.compute_hash()

    def compiler_hash(self, backend: Any, vllm_config: Any) -> str:
        return backend.compiler_manager.compute_hash(vllm_config)

    def config_parts(self, vllm_config, value):
        """Each part's ``compute_hash()``, and the dict it passed to vLLM's ``hash_factors``
        (recorded by wrapping that function for the call: 0.24 returns only the hash)."""
        import dataclasses

        import vllm.config.utils as cu

        original = cu.hash_factors
        seen: list[Any] = []

        def recording(items):
            seen.append(items)
            return original(items)

        parts: dict[str, Any] = {}
        cu.hash_factors = recording
        try:
            for f in dataclasses.fields(vllm_config):
                sub = getattr(vllm_config, f.name, None)
                if sub is None or not callable(getattr(sub, "compute_hash", None)):
                    continue
                seen.clear()
                try:
                    h = sub.compute_hash()
                except Exception as e:  # noqa: BLE001 - record what could not be hashed
                    parts[f.name] = {"error": repr(e)[:300]}
                    continue
                entry: dict[str, Any] = {"hash": str(h)}
                if seen and isinstance(seen[-1], dict):  # the outermost call comes last
                    entry["factors"] = {str(k): value(v) for k, v in seen[-1].items()}
                parts[f.name] = entry
        finally:
            cu.hash_factors = original
        return parts

    def code_hash(self, paths, read):
        parts: list[str] = []
        for path, text in _read_all(sorted(p for p in paths if p != "<string>"), read):
            parts.append(path)
            if text is not None:
                parts.append(text)
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def dir_hash(self, env_hash, config_hash, code_hash, compiler_hash, all_factors=None):
        return hashlib.sha256(str([env_hash, config_hash, code_hash, compiler_hash]).encode()).hexdigest()[:10]

    # torch 2.11 runs a backend under AOT compile inside this functorch patch
    # (torch/_dynamo/aot_compile.py ``aot_compile_fullgraph``), and vLLM 0.24's compiler hash
    # is taken inside the backend, so functorch's portable config (a factor of that hash) is
    # the patched one there.  Measured on the H200 bake of 2026-12-01: with it the check's
    # digest is the engine's (sha256:0a242af4...), without it not.
    AOT_COMPILE_FUNCTORCH_PATCH = {"strict_autograd_cache": True, "bypass_autograd_cache_key": True,
                                   "bundled_autograd_cache": True,
                                   "force_non_lazy_backward_lowering": True,
                                   "force_autograd_cache": True}

    def inductor_factors(self, aot_compile):
        from vllm.compilation import compiler_interface as ci

        if not aot_compile:
            return list(ci.get_inductor_factors())
        import torch._functorch.config as functorch_config

        with functorch_config.patch(self.AOT_COMPILE_FUNCTORCH_PATCH):
            return list(ci.get_inductor_factors())


def code_factors(paths: list[str] | set[str], read: Callable[[str], str]) -> list[dict[str, str]]:
    """vLLM 0.34's ``get_code_factors(read_code_files(paths))`` (caching.py:38-61): per file
    {"path", "hash": hash_factors({"content": text})}, sorted as ``Path`` objects sort (by
    their parts); an unreadable file or a "<...>" name keeps its path only."""
    out = []
    for path, text in sorted(_read_all(list(paths), read), key=lambda pt: pt[0].split("/")):
        entry = {"path": path}
        if text is not None and not path.startswith("<"):
            entry["hash"] = hash_factors({"content": text})
        out.append(entry)
    return out


class FactorDicts(CompileHashes):
    """vLLM 0.34 .. (see the module doc)."""

    name = "factor-dicts"
    only_v2_runner = True  # Model Runner V1 removed (platforms/interface.py:1481-1490)
    aot_load_needs_backend_dir = False  # the mega artifact rebuilds the graphs itself

    def config_hash(self, vllm_config: Any) -> str:
        return hash_factors(vllm_config.compile_factors())

    def compiler_hash(self, backend: Any, vllm_config: Any) -> str:
        return hash_factors(backend.compiler_manager.compile_factors(vllm_config))

    def config_parts(self, vllm_config, value):
        """Each field of VllmConfig with ``compile_factors()`` (the dicts
        ``VllmConfig.compile_factors`` nests, config/vllm.py:490-548), named as the field."""
        import dataclasses

        parts: dict[str, Any] = {}
        for f in dataclasses.fields(vllm_config):
            sub = getattr(vllm_config, f.name, None)
            fn = getattr(sub, "compile_factors", None)
            if sub is None or not callable(fn):
                continue
            try:
                factors = fn()
            except Exception as e:  # noqa: BLE001 - record what could not be hashed
                parts[f.name] = {"error": repr(e)[:300]}
                continue
            entry: dict[str, Any] = {"hash": hash_factors(factors)}
            if isinstance(factors, dict):
                entry["factors"] = {str(k): value(v) for k, v in factors.items()}
            parts[f.name] = entry
        return parts

    def code_hash(self, paths, read):
        return hash_factors({"files": code_factors(paths, read)})

    def backend_factors(self, backend, vllm_config, env_factors, paths, read):
        return {"env": env_factors, "config": vllm_config.compile_factors(),
                "code": {"files": code_factors(paths, read)},
                "compiler": backend.compiler_manager.compile_factors(vllm_config)}

    def backend_inductor_factors(self, backend, vllm_config):
        return list(backend.compiler_manager.compile_factors(vllm_config).get("inductor") or [])

    def dir_hash(self, env_hash, config_hash, code_hash, compiler_hash, all_factors=None):
        if not all_factors:
            return None
        return hash_factors(all_factors)[:10]

    def inductor_factors(self, aot_compile):
        from vllm.compilation import compiler_interface as ci

        return list(ci.get_inductor_factors(aot_compile))


# ---------------------------------------------------------------------------- the startup plan
# vLLM 0.34's v1/worker/startup_plan.py (not in 0.24 or 0.33): with VLLM_ENABLE_STARTUP_PLAN=1
# (envs.py:293, 2095-2096; not a compile factor, envs.py:2504) each worker saves the KV-cache size
# its memory profiling found to VLLM_CACHE_ROOT/startup_plan/startup_plan_<fp16>.json
# (startup_plan.py:78-85, 180-189) and a later start applies it, skipping the profiling, when
# the schema and key match and free memory >= the recorded baseline (99-132).  The key
# (42-75) holds the config hash, the GPU's name, memory and capability, torch, CUDA, rank and
# world size; NOT the cache budget (CacheConfig's compile factors ignore these, config/cache.py
# 428-440): a server with another budget is given the baked size.  ``verify --check-only``
# compares them (compile_check).
STARTUP_PLAN_ENV = "VLLM_ENABLE_STARTUP_PLAN"
STARTUP_PLAN_MODULE = "vllm.v1.worker.startup_plan"
STARTUP_PLAN_DIR = "startup_plan"  # under VLLM_CACHE_ROOT, i.e. in the vllm role
STARTUP_PLAN_UNKEYED = ("gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override")


def has_startup_plan() -> bool:
    """Whether the vLLM importable here has the startup plan (its module is there)."""
    import importlib.util

    try:
        return importlib.util.find_spec(STARTUP_PLAN_MODULE) is not None
    except (ImportError, ValueError):
        return False


# ---------------------------------------------------------------------------- moved symbols
# vLLM functions the kernels plan calls that moved or changed between releases, each resolved
# from the installed vLLM (the places are read from 0.33.0's and 0.34.0's source).
def get_block_table_width() -> Callable[..., int]:
    """0.34: vllm/v1/kv_cache_interface.py:337 (the module vllm.v1.worker.block_table is gone);
    0.24 .. 0.33: vllm.v1.worker.block_table.  Same signature."""
    try:
        from vllm.v1.kv_cache_interface import get_block_table_width as fn
    except ImportError:
        from vllm.v1.worker.block_table import get_block_table_width as fn
    return fn


def reserved_block_count(num_tokens: int, spec: Any, *, vllm_config: Any, **kwargs: Any) -> int:
    """vllm.v1.worker.gpu.warmup._reserved_block_count: 0.34 (warmup.py:40) added a required
    keyword ``vllm_config``; 0.33 (warmup.py:34) has none.  Passed where the installed
    function takes it."""
    import inspect

    from vllm.v1.worker.gpu.warmup import _reserved_block_count as fn

    if "vllm_config" in inspect.signature(fn).parameters:
        kwargs["vllm_config"] = vllm_config
    return fn(num_tokens, spec, **kwargs)


def resolve_cudagraph_mode_and_sizes(compilation_config: Any, *args: Any, **kwargs: Any) -> Any:
    """``CompilationConfig.resolve_cudagraph_mode_and_sizes``: 0.33 takes
    ``use_v2_model_runner``; 0.34 (config/compilation.py:1535-1544) has only V2 and no such
    parameter.  Keywords the installed method does not take are left out."""
    import inspect

    fn = compilation_config.resolve_cudagraph_mode_and_sizes
    params = inspect.signature(fn).parameters
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def gpu_memory_utilization(cache_config: Any) -> float:
    """The fraction vLLM budgets: 0.34 leaves ``gpu_memory_utilization`` None unless given and
    resolves it (1.0 with its extensible KV cache, else 0.92: config/cache.py:216-227,
    495-501, ``resolved_gpu_memory_utilization``); 0.33 holds the value itself."""
    resolved = getattr(cache_config, "resolved_gpu_memory_utilization", None)
    return float(resolved if resolved is not None else cache_config.gpu_memory_utilization)


def serve_arg_defaults(version: str | None) -> dict[str, Any]:
    """The serve args vLLM ``version`` fills in with a fixed value when they are unset: set to
    that value they are the same as unset, for a plan that version computed.  Before 0.34
    ``CacheConfig.gpu_memory_utilization`` defaulted to 0.92 (0.24 config/cache.py:67, 0.33
    config/cache.py:215); 0.34 has no fixed default (None, resolved at start to 1.0 with the
    extensible KV cache: config/cache.py:216-227, 495-501)."""
    return {} if version_tuple(version) >= (0, 34) else {"gpu_memory_utilization": 0.92}


# The first vLLM release of each scheme, newest first (read from each release's source).
SCHEMES: tuple[tuple[tuple[int, ...], CompileHashes], ...] = (
    ((0, 34), FactorDicts()),
    ((0, 0), HashList()),
)


def scheme_for(version: str | None) -> CompileHashes:
    """The scheme of vLLM ``version``; an unparsable or missing version is the oldest one
    (the records cachebake wrote before it recorded versions are vLLM 0.24's)."""
    v = version_tuple(version)
    for since, scheme in SCHEMES:
        if v >= since:
            return scheme
    return SCHEMES[-1][1]


def uses_v2_runner(vllm_config: Any) -> bool:
    """Whether the engine of ``vllm_config`` runs Model Runner V2: 0.24/0.33's
    ``VllmConfig.use_v2_model_runner``; 0.34 has no V1 (and no such property)."""
    v2 = getattr(vllm_config, "use_v2_model_runner", None)
    return bool(v2) if v2 is not None else installed_scheme().only_v2_runner


def installed_scheme() -> CompileHashes:
    """The scheme of the vLLM importable here."""
    import vllm

    return scheme_for(getattr(vllm, "__version__", None))
