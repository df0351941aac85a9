"""A vLLM bake's torch.compile identity, as vLLM computed it inside the round.

vLLM finds its torch.compile cache by two hashes (read in vLLM 0.24.0; 0.33.0 computes them
the same way, see README "Moving a vLLM bake"):

- the backend's cache dir ``VLLM_CACHE_ROOT/torch_compile_cache/<sha256(str([env_hash,
  config_hash, code_hash, compiler_hash]))[:10]>/rank_{r}_{dp}/<prefix>``
  (vllm/compilation/backends.py ``VllmBackend.__call__``): ``env_hash`` is
  ``hash_factors(envs.compile_factors())`` (every vLLM variable not in its ignore list: in 0.24
  that includes VLLM_CONFIG_ROOT and VLLM_XLA_CACHE_PATH, paths derived from HOME/XDG), the
  config hash ``VllmConfig.compute_hash()`` (vLLM's version and one hash per sub-config: the
  model string, the serve args...), ``code_hash`` over the traced source files, path and
  content, and ``compiler_hash`` (Inductor's system and torch key, compiler_interface.py);
- the AOT artifact ``torch_compile_cache/torch_aot_compile/<sha256(str([env_hash, config_hash,
  (mega AOT: inductor factors), _model_hash_key(forward)]))>/rank_{r}_{dp}/model``
  (compilation/decorators.py ``__call__``, caching.py ``aot_compile_hash_factors``), loaded by
  ``_try_load_aot_compiled_fn`` ("Directly load AOT compilation from path ...").  A loaded AOT
  artifact still goes through ``VllmBackend.__call__`` (caching.py ``finalize_loading``), whose
  dir must hold the Inductor graphs, or they are compiled again.

Two halves:

- the probe (``install_probe``) runs inside vLLM's engine and worker processes: the cachebake
  vLLM plugin (cachebake.serve.vllm_plugin) installs it there when ``$CACHEBAKE_VLLM_PROBE``
  names a file, which the vllm driver sets for its rounds only.  It wraps those two functions
  and appends one JSON line per call: the four hashes as vLLM computed them, the traced files
  (vLLM clears its set inside the call, so it is read on the way in), the dirs, and vLLM's own
  compilation counters before and after, i.e. whether the AOT artifact loaded and whether
  Inductor compiled any graph;
- the round's side (``bake_identity``, in the driver's process once the engine is up): the
  compile factors' values, which of them follow HOME/XDG (vLLM's own getters re-run with
  other HOME/XDG values), the variables the round set, the config hash with each sub-config's
  hash and the factor dict it hashed (so a mismatch can name ``tensor_parallel_size``), the
  engine arguments as vLLM resolved them (a hub id becomes a snapshot path when offline), the
  versions and install dirs, and the probe's engine-side record, checked against it.

Everything here is JSON (``jsonio.dumps``) and bounded (``factor_value``, ``MAX_TRACED``).
Nothing of vLLM is imported at module level: the plugin imports this module in every vLLM
process when the probe is on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from cachebake.vllm.versions import HashList, aot_hash_of_reprs, hash_factors, scheme_for

PROBE_ENV = "CACHEBAKE_VLLM_PROBE"  # absolute path of the JSON-lines file the probe appends to
MAX_VALUE_CHARS = 2048  # one factor value, as JSON
MAX_TRACED = 4096  # traced source files recorded
MAX_PROBE_BYTES = 16 << 20
IDENTITY_SCHEMA = 1
# vLLM's compilation counters (vllm/compilation/counter.py) the probe reads around each call.
COUNTERS = ("num_aot_compiles", "num_aot_artifacts_loaded", "num_aot_artifacts_saved",
            "num_backend_compilations", "num_inductor_compiles", "num_compiled_artifacts_saved",
            "num_compiled_artifacts_loaded", "num_cache_entries_updated")
# HOME/XDG values the round re-runs vLLM's getters with: a factor that changes follows them.
_PERTURBED = ({"HOME": "/nonexistent/cachebake-home-a"},
              {"HOME": "/nonexistent/cachebake-home-b",
               "XDG_CONFIG_HOME": "/nonexistent/cachebake-xdg-config",
               "XDG_CACHE_HOME": "/nonexistent/cachebake-xdg-cache"})
_XDG = ("XDG_CONFIG_HOME", "XDG_CACHE_HOME")
# Variables whose values are credentials: recorded (and compared) as digests only.  vLLM 0.24
# hashes VLLM_API_KEY as a compile factor (0.33 stopped: "must not be persisted").
_SECRET = re.compile(r"(?:API_KEY|SECRET|ACCESS_KEY|ACCESS_KEY_ID|PASSWORD|_TOKEN|CREDENTIALS?)\Z")


# ---------------------------------------------------------------------------- values
def factor_value(value: Any) -> Any:
    """A factor's value as the record keeps it, the same way on both sides of a comparison:
    JSON scalars as they are, small containers as JSON lists/objects (vLLM's tuples become
    lists), anything nested or large as one string (its canonical JSON, or a digest of it),
    so a record stays shallow (jsonio.MAX_NESTING) and bounded."""
    if value is None or isinstance(value, (bool, int, str)):
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            return _digest(value)
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    try:
        text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > MAX_VALUE_CHARS:
        return _digest(text)
    data = json.loads(text) if text[:1] in "[{" else text
    if isinstance(data, list) and all(v is None or isinstance(v, (bool, int, float, str)) for v in data):
        return data
    return text


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def env_factor_values(factors: dict[str, Any]) -> dict[str, Any]:
    """``envs.compile_factors()`` as recorded: ``factor_value`` each, credentials as digests."""
    out = {}
    for name, value in factors.items():
        value = factor_value(value)
        if _SECRET.search(name) and value is not None:
            value = _digest(json.dumps(value))
        out[str(name)] = value
    return out


def code_hash(paths: list[str] | set[str], read: Callable[[str], str] | None = None,
              version: str | None = None) -> str:
    """vLLM's code hash over the traced files, as vLLM ``version`` computes it
    (cachebake.vllm.versions; default: 0.24's sha256 of "path\\ntext\\n...", "<string>"
    skipped, an unreadable file keeping its path only)."""
    return scheme_for(version).code_hash(paths, read or _read_text)


def _read_text(path: str) -> str:
    with open(path) as f:  # as vLLM reads it: text mode, the locale's encoding
        return f.read()


def dir_hash(env_hash: str, config_hash: str, code: str, compiler_hash: str) -> str:
    """vLLM 0.24 .. 0.33's backend cache dir name (backends.py): sha256 of the factor list's
    str, 10 hex (0.34's needs the factor dicts: ``versions.FactorDicts.dir_hash``)."""
    return HashList().dir_hash(env_hash, config_hash, code, compiler_hash)


def aot_hash(factors: list[Any]) -> str:
    """The AOT artifact's dir name (decorators.py): sha256 of the factor list's str."""
    return hashlib.sha256(str(list(factors)).encode()).hexdigest()


# ---------------------------------------------------------------------------- the probe
_lock = threading.Lock()
_installed = False


def _append(record: dict[str, Any]) -> None:
    path = os.environ.get(PROBE_ENV)
    if not path:
        return
    from cachebake import jsonio

    line = (jsonio.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line)  # one write on O_APPEND: lines of several processes never interleave
    finally:
        os.close(fd)


def _counters() -> dict[str, int]:
    from vllm.compilation.counter import compilation_counter

    return {k: int(getattr(compilation_counter, k, 0)) for k in COUNTERS}


def _delta(before: dict[str, int]) -> dict[str, int]:
    after = _counters()
    return {k: after[k] - before.get(k, 0) for k in after}


def _rank(vllm_config: Any) -> str:
    pc = getattr(vllm_config, "parallel_config", None)
    return f"rank_{getattr(pc, 'rank', 0)}_{getattr(pc, 'data_parallel_index', 0)}"


def _module_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        f = getattr(module, "__file__", None)
        if isinstance(f, str):
            files.setdefault(f, name)
    return files


def traced_records(paths: list[str] | set[str]) -> list[dict[str, Any]]:
    """Each traced file: its path, the module it belongs to, the sha256 of its text."""
    modules = _module_files()
    out = []
    for path in sorted(paths)[:MAX_TRACED]:
        rec: dict[str, Any] = {"path": path, "module": modules.get(path)}
        try:
            rec["sha256"] = hashlib.sha256(_read_text(path).encode()).hexdigest()
        except (OSError, UnicodeDecodeError):
            rec["sha256"] = None
        out.append(rec)
    return out


AOT_COMPILE_FUNCTORCH_PATCH = HashList.AOT_COMPILE_FUNCTORCH_PATCH


def _installed_version() -> str | None:
    import vllm

    return getattr(vllm, "__version__", None)


def compiler_factors(aot_compile: bool = False, version: str | None = None) -> dict[str, Any]:
    """What vLLM's compiler hash is made of (compiler_interface.py ``get_inductor_factors``:
    Inductor's system info, the torch key, Inductor's and functorch's portable configs), the
    configs as digests.  ``aot_compile``: as the engine's backend sees them under AOT compile
    (the installed vLLM's scheme says how, cachebake.vllm.versions); inside the engine itself
    under vLLM 0.24, leave it False."""
    return summarize_inductor_factors(scheme_for(version or _installed_version()).inductor_factors(aot_compile))


def summarize_inductor_factors(factors: list[Any]) -> dict[str, Any]:
    """``get_inductor_factors``' list as recorded: system, torch key, config digests."""
    out: dict[str, Any] = {}
    if factors:
        out["system"] = factor_value(factors[0])
    if len(factors) > 1:
        key = factors[1]
        out["torch_key"] = key.hex() if isinstance(key, (bytes, bytearray)) else factor_value(key)
    for i, name in ((2, "inductor_config"), (3, "functorch_config")):
        if len(factors) > i:
            out[name] = _digest(str(factors[i]))
    return out


def factor_reprs(factors: list[Any]) -> list[dict[str, Any]]:
    """Each AOT hash factor as the record keeps it: the sha256 of its ``repr`` (what
    ``str(factors)`` is made of), and the repr itself where it is small enough to keep, so a
    check can rebuild the AOT dir name from its own values and the bake's
    (``versions.aot_hash_of_reprs``)."""
    out = []
    for f in factors:
        text = repr(f)
        rec: dict[str, Any] = {"sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()}
        if len(text) <= MAX_VALUE_CHARS:
            rec["repr"] = text
        out.append(rec)
    return out


def install_probe() -> bool:
    """Wrap ``VllmBackend.__call__`` and ``decorators._try_load_aot_compiled_fn`` in this
    process (idempotent).  Never raises: a probe must not stop vLLM; False if it could not."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from vllm.compilation import backends, decorators
        except Exception as e:  # noqa: BLE001 - another vLLM layout: say so, run unprobed
            print(f"cachebake: vLLM compile probe off in pid {os.getpid()}: {e!r}", file=sys.stderr)
            return False
        _wrap_backend(backends)
        _wrap_aot_load(decorators)
        _installed = True
        return True


def _wrap_backend(backends: Any) -> None:
    original = backends.VllmBackend.__call__

    def __call__(self, graph, example_inputs):
        try:
            # cleared inside the call; Path objects in vLLM 0.34, str in 0.24
            traced = {str(p) for p in self.compilation_config.traced_files}
            before = _counters()
        except Exception:  # noqa: BLE001
            traced, before = None, None
        t0 = time.monotonic()
        result = original(self, graph, example_inputs)
        if traced is not None:
            try:
                _append(_backend_record(self, traced, before, time.monotonic() - t0))
            except Exception as e:  # noqa: BLE001
                _append({"event": "backend", "pid": os.getpid(), "error": repr(e)[:500]})
        return result

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    backends.VllmBackend.__call__ = __call__


def _backend_record(backend: Any, traced: set[str], before: dict[str, int],
                    seconds: float) -> dict[str, Any]:
    import vllm.envs as envs

    scheme = scheme_for(_installed_version())
    cfg = backend.vllm_config
    factors = envs.compile_factors()
    env_hash = hash_factors(factors)
    config_hash = scheme.config_hash(cfg)
    compiler_hash = scheme.compiler_hash(backend, cfg)
    code = scheme.code_hash(traced, _read_text)
    everything = scheme.backend_factors(backend, cfg, factors, traced, _read_text)
    cache_dir = backend.compilation_config.cache_dir or ""
    return {
        "event": "backend", "pid": os.getpid(), "rank": _rank(cfg), "scheme": scheme.name,
        "prefix": backend.prefix, "seconds": round(seconds, 3),
        "cache_dir": cache_dir, "local_cache_dir": backend.compilation_config.local_cache_dir,
        "env_hash": env_hash, "config_hash": config_hash, "code_hash": code,
        "compiler_hash": compiler_hash,
        "dir_hash": scheme.dir_hash(env_hash, config_hash, code, compiler_hash, everything),
        "env_factors": env_factor_values(factors),
        "compiler_factors": summarize_inductor_factors(scheme.backend_inductor_factors(backend, cfg)),
        "traced_files": traced_records(traced),
        "counters": _delta(before),
    }


def _wrap_aot_load(decorators: Any) -> None:
    original = decorators._try_load_aot_compiled_fn

    def _try_load_aot_compiled_fn(model, aot_compilation_path):
        rec: dict[str, Any] = {"event": "aot_load", "pid": os.getpid(),
                               "path": aot_compilation_path,
                               "existed": os.path.exists(aot_compilation_path)}
        try:
            before = _counters()
        except Exception:  # noqa: BLE001
            before = {}
        try:
            loaded = original(model, aot_compilation_path)
        except BaseException as e:  # VLLM_FORCE_AOT_LOAD re-raises the load failure
            rec.update(loaded=False, error=repr(e)[:500])
            _safe_aot_append(rec, model, before)
            raise
        rec["loaded"] = loaded is not None
        _safe_aot_append(rec, model, before)
        return loaded

    _try_load_aot_compiled_fn.__wrapped__ = original  # type: ignore[attr-defined]
    decorators._try_load_aot_compiled_fn = _try_load_aot_compiled_fn


def _safe_aot_append(rec: dict[str, Any], model: Any, before: dict[str, int]) -> None:
    try:
        from vllm.compilation.caching import aot_compile_hash_factors
        from vllm.compilation.decorators import _model_hash_key

        factors = list(aot_compile_hash_factors(model.vllm_config))
        factors.append(_model_hash_key(model.forward))
        rec.update(rank=_rank(model.vllm_config), aot_factors=[factor_value(f) for f in factors],
                   aot_factor_reprs=factor_reprs(factors),
                   aot_hash=aot_hash(factors), counters=_delta(before))
    except Exception as e:  # noqa: BLE001
        rec["probe_error"] = repr(e)[:500]
    try:
        _append(rec)
    except OSError:
        pass


def read_probe(path: os.PathLike | str) -> list[dict[str, Any]]:
    """The probe's records (the file is the round's own; a torn or foreign line is skipped)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROBE_BYTES)
    except FileNotFoundError:
        return []
    out = []
    for line in data.splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # a torn or foreign line
            continue
        if isinstance(rec, dict) and rec.get("event") in ("backend", "aot_load"):
            out.append(rec)
    return out


# ---------------------------------------------------------------------------- outcome
# vLLM 0.24's log lines for the same events (decorators.py, backends.py); 0.33 may prefix a
# "[tag] ".  Used when a round ran without the probe (no cachebake plugin in that vLLM).
LOG_AOT_LOADED = "Directly load AOT compilation from path"
LOG_AOT_FAILED = "Compiling model again due to a load failure from"
LOG_GRAPH_COMPILED = "Compiling a graph for compile range"
LOG_GRAPHS_LOADED = "Directly load the compiled graph(s) for compile range"
LOG_AOT_SAVED = "saved AOT compiled function to"


def torch_compile_outcome(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What torch.compile did in one round, from the probe: ``aot`` is "loaded" (every AOT
    load attempt loaded), "compiled" (no artifact at its path: Dynamo and Inductor ran),
    "load-failed" (an artifact was there and vLLM compiled again), or "none" (no load was
    attempted: AOT compile off, or no probe); ``graphs_compiled`` counts the Inductor graphs
    compiled rather than loaded from the backend's cache dir."""
    loads = [e for e in events if e.get("event") == "aot_load"]
    backends = [e for e in events if e.get("event") == "backend"]
    out: dict[str, Any] = {"source": "probe", "aot": "none", "aot_paths": [], "graphs_compiled": 0,
                           "graphs_loaded": 0, "cache_dirs": []}
    for e in loads:
        out["aot_paths"].append(e.get("path"))
    if loads:
        if all(e.get("loaded") for e in loads):
            out["aot"] = "loaded"
        elif any(e.get("existed") and not e.get("loaded") for e in loads):
            out["aot"] = "load-failed"
            out["reason"] = next((e.get("error") for e in loads if e.get("error")), None)
        else:
            out["aot"] = "compiled"
    for e in backends:
        c = e.get("counters") or {}
        # 0.24 counts a compiled graph in num_cache_entries_updated; 0.34's mega AOT bake
        # writes no cache entry (it bundles the artifact), only num_inductor_compiles moves
        out["graphs_compiled"] += max(int(c.get("num_cache_entries_updated", 0) or 0),
                                      int(c.get("num_inductor_compiles", 0) or 0))
        out["graphs_loaded"] += int(c.get("num_compiled_artifacts_loaded", 0) or 0)
        if e.get("local_cache_dir"):
            out["cache_dirs"].append(e["local_cache_dir"])
    return out


def outcome_from_log(text: str) -> dict[str, Any]:
    """``torch_compile_outcome`` from vLLM's own log lines (when the probe did not run)."""
    loaded = text.count(LOG_AOT_LOADED)
    failed = text.count(LOG_AOT_FAILED)
    compiled = text.count(LOG_GRAPH_COMPILED)
    aot = ("load-failed" if failed else "loaded" if loaded
           else "compiled" if compiled or LOG_AOT_SAVED in text else "none")
    return {"source": "log", "aot": aot, "graphs_compiled": compiled,
            "graphs_loaded": text.count(LOG_GRAPHS_LOADED)}


def outcome_problem(outcome: dict[str, Any] | None) -> str | None:
    """Why torch.compile did not run from the bake's artifact, or None when it did."""
    if not outcome:
        return None
    aot = outcome.get("aot")
    if aot == "load-failed":
        return ("vLLM found the AOT artifact but compiled again"
                + (f" ({outcome['reason']})" if outcome.get("reason") else ""))
    if aot == "compiled":
        return ("no AOT artifact at the path vLLM computed ("
                + ", ".join(str(p) for p in outcome.get("aot_paths") or []) + "): Dynamo and "
                "Inductor ran again (its hash differs from the bake's; "
                "`cachebake verify --check-only` names the factor)")
    if outcome.get("graphs_compiled"):
        return (f"Inductor compiled {outcome['graphs_compiled']} graph(s) instead of loading them "
                "from the baked cache dir (the code or compiler hash differs from the bake's)")
    return None


# ---------------------------------------------------------------------------- the round's side
@contextmanager
def _environ(changes: dict[str, str | None]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def path_factors(compile_factors: Callable[[], dict[str, Any]]) -> dict[str, str]:
    """The compile factors whose values follow HOME/XDG here: vLLM's own getters
    (``compile_factors``) re-run with other HOME/XDG values; the ones that change, with the
    values they have now.  In vLLM 0.24: VLLM_CONFIG_ROOT, VLLM_XLA_CACHE_PATH (envs.py,
    ``get_default_config_root``/``get_default_cache_root``); none in 0.33."""
    base = env_factor_values(compile_factors())
    moved: set[str] = set()
    for variant in _PERTURBED:
        changes: dict[str, str | None] = {k: None for k in _XDG}
        changes.update(variant)
        with _environ(changes):
            other = env_factor_values(compile_factors())
        moved |= {k for k, v in base.items() if other.get(k) != v}
    return {k: base[k] for k in sorted(moved) if isinstance(base[k], str) and os.path.isabs(base[k])}


def set_factors(factor_names: list[str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The compile factors set in the environment, as set (raw strings; credentials digested)."""
    env = os.environ if environ is None else environ
    out = {}
    for name in factor_names:
        if name in env:
            out[name] = _digest(json.dumps(env[name])) if _SECRET.search(name) else env[name]
    return out


def config_parts(vllm_config: Any, version: str | None = None) -> dict[str, Any]:
    """Each sub-config's hash and the factor dict it hashed (``tensor_parallel_size`` under
    ``parallel_config``...), as the installed vLLM computes them (``versions``)."""
    return scheme_for(version or _installed_version()).config_parts(vllm_config, factor_value)


def engine_args_values(engine_args: Any) -> dict[str, Any]:
    """Every EngineArgs field as vLLM resolved it (after ``__post_init__``)."""
    import dataclasses

    from vllm.config.utils import normalize_value

    out = {}
    for f in dataclasses.fields(engine_args):
        value = getattr(engine_args, f.name, None)
        try:
            value = normalize_value(value)
        except Exception:  # noqa: BLE001 - a callable or an object vLLM does not hash
            value = repr(value)[:200]
        out[f.name] = factor_value(value)
    return out


def install_roots() -> dict[str, str]:
    """Where the traced files' packages live: vLLM, torch, the stdlib, site-packages."""
    import sysconfig

    import torch
    import vllm

    roots = {"vllm": os.path.dirname(os.path.abspath(vllm.__file__)),
             "torch": os.path.dirname(os.path.abspath(torch.__file__))}
    for key in ("stdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots[key] = path
    return roots


def vllm_cache_dirs(cache_root: str | None) -> list[dict[str, Any]]:
    """vLLM's own record of each backend dir under ``cache_root`` (``cache_key_factors.json``,
    written by backends.py): its hash, rank, prefix and the four hashes it was built from."""
    if not cache_root:
        return []
    from cachebake import jsonio
    from cachebake.errors import CachebakeError

    base = os.path.join(cache_root, "torch_compile_cache")
    out = []
    try:
        hashes = sorted(os.listdir(base))
    except OSError:
        return []
    for h in hashes:
        if h == "torch_aot_compile" or not os.path.isdir(os.path.join(base, h)):
            continue
        for rank in sorted(os.listdir(os.path.join(base, h))):
            rdir = os.path.join(base, h, rank)
            if not os.path.isdir(rdir):
                continue
            for prefix in sorted(os.listdir(rdir)):
                p = os.path.join(rdir, prefix, "cache_key_factors.json")
                try:
                    doc = jsonio.load_document(p, "cache_key_factors.json", 4 << 20, missing=None)
                except (FileNotFoundError, CachebakeError):
                    continue
                if not isinstance(doc, dict):
                    continue
                entry = {"hash": h, "rank": rank, "prefix": prefix}
                entry.update({k: doc.get(k) for k in ("config_hash", "code_hash", "compiler_hash")
                              if isinstance(doc.get(k), str)})
                if isinstance(doc.get("env"), dict):
                    entry["env_hash"] = hash_factors(doc["env"])
                out.append(entry)
    return out


@contextmanager
def _only_environ(env: dict[str, str] | None) -> Iterator[None]:
    """``os.environ`` is ``env`` for the duration (vLLM's getters read it live)."""
    if env is None:
        yield
        return
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def bake_identity(vllm_config: Any, kwargs: dict[str, Any], events: list[dict[str, Any]],
                  engine_args: Any = None, start_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The bake's torch.compile identity: what a server must match (see the module doc).

    ``start_env``: the environment the round started with, before vLLM set variables of its
    own while building its config (its CPU platform sets VLLM_DISABLE_SHARED_EXPERTS_STREAM,
    config/vllm.py may set VLLM_USE_BREAKABLE_CUDAGRAPH): the factors are recorded as a server
    process computes them from the same start, which is what ``verify --check-only`` does; the
    engine's own hash is recorded beside them (``engine``)."""
    import torch
    import vllm
    import vllm.envs as envs

    version = getattr(vllm, "__version__", None)
    scheme = scheme_for(version)
    with _only_environ(start_env):
        factors = envs.compile_factors()
        moved = path_factors(envs.compile_factors)
        were_set = set_factors(list(factors))
    recorded = env_factor_values(factors)
    backends = [e for e in events if e.get("event") == "backend" and "env_hash" in e]
    loads = [e for e in events if e.get("event") == "aot_load" and "aot_hash" in e]
    requested = str(kwargs.get("model"))
    resolved = str(vllm_config.model_config.model)
    model: dict[str, Any] = {"requested": requested, "resolved": resolved, "hf_hub_cache": None}
    if resolved != requested:  # a hub id that vLLM resolved offline to a snapshot path
        try:
            import huggingface_hub.constants as hc

            cache = os.path.abspath(hc.HF_HUB_CACHE)
            if resolved.startswith(cache + os.sep):
                model["hf_hub_cache"] = cache
        except ImportError:
            pass
    identity: dict[str, Any] = {
        "schema": IDENTITY_SCHEMA,
        "vllm_version": version,
        "torch_version": str(torch.__version__),
        "python": sys.version.split()[0],
        "roots": install_roots(),
        "model": model,
        "env_factors": recorded,
        "env_hash": hash_factors(factors),
        "path_factors": moved,
        "set_factors": were_set,
        "hash_scheme": scheme.name,
        "config_hash": scheme.config_hash(vllm_config),
        "config_parts": config_parts(vllm_config, version),
        "engine_args": engine_args_values(engine_args) if engine_args is not None else None,
        "engine": {"probed": bool(backends or loads)},
        "cache_dirs": vllm_cache_dirs(os.environ.get("VLLM_CACHE_ROOT")),
        "aot": [{"hash": e["aot_hash"], "rank": e.get("rank"), "factors": e.get("aot_factors"),
                 **({"factor_reprs": e["aot_factor_reprs"]} if e.get("aot_factor_reprs") else {})}
                for e in loads],
    }
    if backends:
        b = backends[0]
        identity.update(code_hash=b["code_hash"], compiler_hash=b["compiler_hash"],
                        compiler_factors=b.get("compiler_factors"),
                        traced_files=b.get("traced_files") or [],
                        backend_dirs=sorted({f"{e['dir_hash']}/{e.get('rank')}/{e.get('prefix')}"
                                             for e in backends}))
        # What the engine hashed is the truth; where it differs from this process, say so.
        engine = identity["engine"]
        engine["env_hash"], engine["config_hash"] = b["env_hash"], b["config_hash"]
        if b["env_hash"] != identity["env_hash"]:
            ef = b.get("env_factors") or {}
            engine["env_differs"] = sorted(k for k in set(ef) | set(recorded) if ef.get(k) != recorded.get(k))
        if b["config_hash"] != identity["config_hash"]:
            engine["config_differs"] = True
    return identity
