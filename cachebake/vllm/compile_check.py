"""Before the server starts: will vLLM load the bake's torch.compile artifact here?

``cachebake verify --check-only`` runs this in the serving environment (its HOME, XDG dirs,
uid, VLLM_* variables and vLLM install), with the model string and the ``vllm serve`` flags the
server will get.  It imports vLLM but starts no engine and needs no GPU, and recomputes with
vLLM's own code what the server's vLLM will hash (the parts are
cachebake.vllm.identity's):

- the environment: ``envs.compile_factors()`` here, factor by factor against the bake's;
- the model string and the engine arguments: ``EngineArgs(model=..., **flags)`` as vLLM
  resolves them (offline, a hub id becomes its snapshot path), against the bake's; each
  differing argument is named with the config part that hashes it (``parallel_config``...);
- the code hash: the bake's traced source files at this vLLM's and torch's install paths,
  path and content, as backends.py hashes them;
- the compiler: torch's key and Inductor's configs (the GPU itself is install's preflight: it
  cannot be read without one);

then predicts the backend dir and the AOT dir the server will compute and compares them with
the bake's.  The config hash itself needs vLLM's platform, which needs a GPU (vLLM 0.24's CUDA
platform imports libcuda): it is taken as the bake's when every input to it matches, and the
report says so.

A mismatch is ``PreflightMismatch`` (exit 4) with one line per differing factor and what it
costs; the measured cost of a torch.compile miss is shared/FACTS.md's (vLLM 0.24 on an H200).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from cachebake.vllm import identity as vi
from cachebake.vllm.versions import STARTUP_PLAN_DIR, STARTUP_PLAN_UNKEYED, aot_hash_of_reprs, scheme_for
from cachebake.errors import BadInput, PreflightMismatch
from cachebake.errors import shorten
from cachebake.vllm.serveargs import (BAKE_ONLY, DRIVER_OWNED, IDENTITY_KEY, parse_serve_args,
                                 serve_args_to_flags)

# What a miss costs (shared/FACTS.md, "vLLM's torch.compile cache key": vLLM 0.24, Nemotron-H
# 8B, H200: torch.compile 8.2-9.5 s instead of 2.0 s, engine init 17.3-18.7 s against 10.8 s).
COST_AOT = ("the torch.compile cache will not be used: Dynamo and Inductor run again, "
            "~9 s at every start (8.2-9.5 s measured on an H200)")
COST_BACKEND = ("the AOT artifact loads, but its Inductor graphs are looked up in another "
                "cache dir and compiled again at every start (part of the ~9 s a full miss "
                "costs; not measured alone)")
COST_KERNELS = ("the bake's Triton kernels and request plan were made for the baked value: "
                "kernels it did not compile can compile at serve time")
COST_ROOT = "the server looks for the torch.compile cache outside the installed bake"
COST_PLAN = ("the bake carries vLLM's startup plan, whose key does not hold this (vLLM 0.34 "
             "startup_plan.py:42-75): vLLM would apply the KV-cache size profiled under the "
             "baked value, not this one (an OOM or a budget overrun); serve with the baked "
             "value, or remove the vllm role's startup_plan/ (or unset VLLM_ENABLE_STARTUP_PLAN)")
MAX_TRACED_BYTES = 16 << 20  # one traced source file read here


@dataclass
class Difference:
    factor: str
    baked: Any
    here: Any
    cost: str

    def line(self) -> str:
        return f"{self.factor}: {_short(self.baked)} in the bake, {_short(self.here)} here: {self.cost}"

    def to_dict(self) -> dict[str, Any]:
        return {"factor": self.factor, "baked": self.baked, "here": self.here, "cost": self.cost}


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return shorten(text, limit, keep=limit)


@dataclass
class CompileCheck:
    """The verdict of ``check_serving``."""

    source: str  # where the bake's identity came from
    model: str | None
    differences: list[Difference] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # what could not be compared here
    predicted: dict[str, Any] = field(default_factory=dict)  # dirs vLLM will compute here
    baked: dict[str, Any] = field(default_factory=dict)  # the bake's dirs

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        if self.ok:
            dirs = ", ".join(f"torch_compile_cache/{d}" for d in self.predicted.get("backend_dirs") or [])
            aot = ", ".join(f"torch_aot_compile/{h[:12]}..." for h in self.predicted.get("aot") or [])
            return (f"torch.compile would load the bake here: vLLM computes {dirs or '-'}"
                    f"{' and ' + aot if aot else ''}, as the bake did"
                    + (f" (not checked here: {'; '.join(self.unchecked)})" if self.unchecked else ""))
        return (f"torch.compile would not load the bake here: {len(self.differences)} "
                f"factor(s) differ from the bake's ({self.source})")

    def lines(self) -> list[str]:
        return [d.line() for d in self.differences]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "model": self.model, "would_hit": self.ok,
                "differences": [d.to_dict() for d in self.differences],
                "unchecked": self.unchecked, "predicted": self.predicted, "baked": self.baked}

    def check(self) -> None:
        if self.differences:
            raise PreflightMismatch("\n".join([self.summary(), *self.lines()]))


# ---------------------------------------------------------------------------- the bake's side
def identity_from_bake(bake: dict[str, Any]) -> dict[str, Any]:
    identity = bake.get(IDENTITY_KEY)
    if not isinstance(identity, dict) or identity.get("error") or "env_factors" not in identity:
        why = identity.get("error") if isinstance(identity, dict) else None
        raise BadInput("this bake records no vLLM compile identity"
                       + (f" (the round could not record it: {why})" if why else
                          " (made by an older cachebake, or not by the vllm driver)")
                       + "; check against the installed tree instead (--cache without --artifact)")
    return identity


def identity_from_tree(vllm_root: str) -> dict[str, Any]:
    """What vLLM itself wrote into the installed ``vllm`` role: each backend dir's
    ``cache_key_factors.json`` (the raw env factors and the four hashes) and the AOT dirs."""
    dirs = vi.vllm_cache_dirs(vllm_root)
    if not dirs:
        raise BadInput(f"{vllm_root}: no torch.compile cache with vLLM's cache_key_factors.json "
                       "(the bake has no vllm role, or it was left out at install)")
    first = os.path.join(vllm_root, "torch_compile_cache", dirs[0]["hash"], dirs[0]["rank"],
                         dirs[0]["prefix"], "cache_key_factors.json")
    from cachebake import jsonio

    doc = jsonio.load_document(first, "cache_key_factors.json", 4 << 20)
    aot_base = os.path.join(vllm_root, "torch_compile_cache", "torch_aot_compile")
    try:
        aot = sorted(os.listdir(aot_base))
    except OSError:
        aot = []
    # vLLM >= 0.34 writes the factor dicts themselves, its version among the config's
    # (config/vllm.py:544-546); 0.24's file holds hashes: no version, the 0.24 scheme
    config = doc.get("config") if isinstance(doc, dict) else None
    version = config.get("version") if isinstance(config, dict) else None
    return {"vllm_version": version if isinstance(version, str) and len(version) < 64 else None,
            "env_factors": vi.env_factor_values(doc.get("env") or {}),
            "env_hash": vi.hash_factors(doc.get("env") or {}),
            "config_hash": dirs[0].get("config_hash"), "code_hash": dirs[0].get("code_hash"),
            "compiler_hash": dirs[0].get("compiler_hash"),
            "backend_dirs": [f"{d['hash']}/{d['rank']}/{d['prefix']}" for d in dirs],
            "aot": [{"hash": h} for h in aot], "from_tree": True}


# ---------------------------------------------------------------------------- the server's side
def split_server_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    """(model, flags) of a ``vllm serve`` command line: ``[vllm] [serve] [MODEL] --flags...``
    (``--model M`` works too)."""
    args = list(argv)
    if args[:1] == ["vllm"]:
        args = args[1:]
    if args[:1] == ["serve"]:
        args = args[1:]
    model = None
    if args and not args[0].startswith("-"):
        model, args = args[0], args[1:]
    for i, a in enumerate(args):
        if not a.startswith("--") and a.startswith("-"):
            raise BadInput(f"{a}: write the server's flags the long way (--tensor-parallel-size, "
                           "not -tp): they are compared by name")
    return model, args


def server_engine_args(model: str, flags: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The server's engine arguments as vLLM resolves them (``EngineArgs.__post_init__``: the
    offline hub-id replacement, plugins), normalized as the bake recorded its own; and the
    flags that are no engine argument (frontend flags: --port, --host...), not compared."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    parsed = parse_serve_args(" ".join(_quote(a) for a in flags)) if flags else {}
    if "model" in parsed:
        other = parsed.pop("model")
        if model is not None and other != model:
            raise BadInput(f"the server's command names two models: {model} and {other}")
        model = str(other)
    names = {f.name for f in dataclasses.fields(EngineArgs)}
    frontend = sorted(k for k in parsed if k not in names)
    kwargs = {k: v for k, v in parsed.items() if k in names}
    import huggingface_hub.constants as hc

    offline = hc.HF_HUB_OFFLINE
    # A model directory the check cannot see (an init container without the model's volume):
    # vLLM keeps an existing path as it is (repo_utils ``get_model_path``), which is what the
    # server, where it exists, will do; offline, vLLM would take a missing one for a repo id.
    keep_path = bool(model) and os.path.isabs(model) and not os.path.exists(model)
    try:
        if keep_path:
            hc.HF_HUB_OFFLINE = False
        ea = EngineArgs(model=model, **{**BAKE_ONLY, **kwargs})
    except Exception as e:  # noqa: BLE001 - vLLM refuses the flags: the server would too
        raise BadInput(f"vLLM refuses the server's arguments: {e}") from None
    finally:
        hc.HF_HUB_OFFLINE = offline
    return vi.engine_args_values(ea), frontend


def _quote(arg: str) -> str:
    return shlex.quote(arg)


def _traced_here(identity: dict[str, Any], roots: dict[str, str]) -> tuple[list[str], list[str]]:
    """The bake's traced files at this machine's install paths (by the longest recorded root
    each was under; other files at their recorded path), and the files whose text differs."""
    baked_roots = identity.get("roots") or {}
    paths, changed = [], []
    for rec in (identity.get("traced_files") or [])[:vi.MAX_TRACED]:
        path = rec.get("path") if isinstance(rec, dict) else None
        if not isinstance(path, str):
            continue
        here = path
        best = ""
        for key, root in baked_roots.items():
            if isinstance(root, str) and path.startswith(root.rstrip("/") + "/") and len(root) > len(best):
                best, rel = root, path[len(root.rstrip("/")) + 1:]
                if key in roots and ".." not in rel.split("/"):
                    here = os.path.join(roots[key], rel)
        paths.append(here)
        digest = _sha256_text(here)
        if rec.get("sha256") and digest != rec.get("sha256"):
            changed.append(here)
    return paths, changed


def _sha256_text(path: str) -> str | None:
    try:
        return hashlib.sha256(_read_bounded(path).encode()).hexdigest()
    except (OSError, UnicodeDecodeError):
        return None


def _read_bounded(path: str) -> str:
    """A traced file's text as vLLM reads it (links followed, the locale's encoding), for the
    paths a record names: regular files only (never a FIFO or a device), at most
    MAX_TRACED_BYTES; anything else reads as unreadable, as a missing file does for vLLM."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TRACED_BYTES:
            raise OSError(f"{path}: not a regular file of at most {MAX_TRACED_BYTES} bytes")
        os.set_blocking(fd, True)
        with os.fdopen(fd, closefd=False) as f:
            text = f.read(MAX_TRACED_BYTES + 1)
    finally:
        os.close(fd)
    if len(text) > MAX_TRACED_BYTES:
        raise OSError(f"{path} grew past {MAX_TRACED_BYTES} bytes")
    return text


def _config_sha256(model_dir: str) -> str | None:
    """The sha256 the bake records for its config.json (vllm_engine.config_bytes), of the
    config.json the server's vLLM will parse; None where the check cannot see it."""
    from cachebake import jsonio
    from cachebake.vllm.engine import config_bytes
    from cachebake.errors import CachebakeError

    path = os.path.join(model_dir, "config.json")
    if not os.path.isabs(model_dir) or not os.path.isfile(path):
        return None
    try:  # a Hugging Face snapshot's config.json links into blobs/: read what it names
        doc = jsonio.load_document(os.path.realpath(path), "the model's config.json", 16 << 20)
    except CachebakeError:
        return "(unreadable)"
    return hashlib.sha256(config_bytes(doc)).hexdigest() if isinstance(doc, dict) else "(not an object)"


def _hashed_args(identity: dict[str, Any]) -> dict[str, str]:
    """Engine-argument name -> the config part whose hash holds it: a factor of that name
    (``tensor_parallel_size`` -> parallel_config), or the part itself (``compilation_config``,
    ``speculative_config``: EngineArgs takes those whole)."""
    out: dict[str, str] = {}
    for part, entry in (identity.get("config_parts") or {}).items():
        out.setdefault(part, part)
        for name in (entry or {}).get("factors") or {}:
            out.setdefault(name, part)
    return out


# ---------------------------------------------------------------------------- the comparison
def server_side(identity: dict[str, Any], *, model: str | None, flags: list[str],
                cache_root: str | None = None) -> dict[str, Any]:
    """What this process's vLLM computes for the server (see the module doc): the one part
    that imports vLLM; ``compare`` takes it from here."""
    # vLLM logs to stdout by default, where --json prints its one object: to stderr instead.
    # VLLM_LOGGING_STREAM is in compile_factors' ignore list (envs.py): the hash stays the same.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import vllm
    import vllm.envs as envs

    raw = envs.compile_factors()
    out: dict[str, Any] = {"vllm_version": vllm.__version__, "env_factors": vi.env_factor_values(raw),
                           "env_hash": vi.hash_factors(raw), "engine_args": None,
                           "frontend_flags": [], "vllm_cache_root": envs.VLLM_CACHE_ROOT}
    if identity.get("engine_args") and model:
        out["engine_args"], out["frontend_flags"] = server_engine_args(model, flags)
    resolved = (out["engine_args"] or {}).get("model") or model
    out["config_sha256"] = _config_sha256(resolved) if isinstance(resolved, str) else None
    if identity.get("traced_files") is not None and identity.get("code_hash"):
        out["roots"] = vi.install_roots()
        paths, out["changed_files"] = _traced_here(identity, out["roots"])
        out["code_hash"] = vi.code_hash(paths, read=_read_bounded, version=vllm.__version__)
    if identity.get("compiler_factors"):
        # the bake's engine took its compiler hash under torch's AOT compile where it made
        # (or loaded) an AOT artifact: compute the factors in the same context
        out["compiler_factors"] = vi.compiler_factors(aot_compile=bool(identity.get("aot")))
    if any(len(a.get("factor_reprs") or []) > 3 for a in identity.get("aot") or []
           if isinstance(a, dict)):
        # the mega AOT artifact's hash holds Inductor's factors (vLLM 0.34 caching.py:612-623)
        out["aot_inductor_reprs"] = [repr(f) for f in vi.scheme_for(vllm.__version__).inductor_factors(True)]
    return out


def check_serving(identity: dict[str, Any], *, source: str, model: str | None = None,
                  server_argv: list[str] | None = None, baked_serve_args: dict[str, Any] | None = None,
                  cache_root: str | None = None, baked_config_sha256: str | None = None,
                  startup_plan: dict[str, Any] | None = None) -> CompileCheck:
    """Compare what vLLM will hash in this process's environment with the bake's identity.

    ``model``/``server_argv``: the server's model string and ``vllm serve`` arguments (default:
    the bake's, as serve-args prints them); ``cache_root``: the installed ``vllm`` role the
    server's VLLM_CACHE_ROOT must name."""
    argv_model, flags = split_server_argv(server_argv or [])
    if server_argv is None and baked_serve_args is not None:
        flags = serve_args_to_flags({k: v for k, v in baked_serve_args.items()
                                     if k not in DRIVER_OWNED})
    requested = (identity.get("model") or {}).get("requested")
    if model and argv_model and argv_model != model:
        raise BadInput(f"--model-ref {model} and the server's command ({argv_model}) disagree")
    model = model or argv_model or requested
    server = server_side(identity, model=model, flags=flags, cache_root=cache_root)
    return compare(identity, server, source=source, model=model, baked_serve_args=baked_serve_args,
                   cache_root=cache_root, baked_config_sha256=baked_config_sha256,
                   startup_plan=startup_plan)


def compare(identity: dict[str, Any], server: dict[str, Any], *, source: str, model: str | None,
            baked_serve_args: dict[str, Any] | None = None, cache_root: str | None = None,
            baked_config_sha256: str | None = None,
            startup_plan: dict[str, Any] | None = None) -> CompileCheck:
    """The verdict, from the bake's identity and ``server_side``'s values (no vLLM here)."""
    report = CompileCheck(source=source, model=model)
    diffs = report.differences
    model_rec = identity.get("model") or {}

    # 1. the environment: vLLM's compile factors, one by one
    baked_env = identity.get("env_factors") or {}
    here = server.get("env_factors") or {}
    path_factors = identity.get("path_factors") or {}
    for name in sorted(set(baked_env) | set(here)):
        if baked_env.get(name) != here.get(name):
            cost = COST_AOT
            if name in path_factors:
                cost += f" ({name} follows HOME/XDG: export it as `cachebake serve-args` prints it)"
            diffs.append(Difference(f"env {name}", baked_env.get(name, "(not a factor)"),
                                    here.get(name, "(not a factor)"), cost))

    # 2. vLLM itself: its version is the config hash's first factor
    if identity.get("vllm_version") and identity["vllm_version"] != server.get("vllm_version"):
        diffs.append(Difference("vLLM version", identity["vllm_version"], server.get("vllm_version"),
                                COST_AOT))

    # 3. the model string and the engine arguments, as vLLM resolves them
    config_same, config_checked = True, False
    server_args = server.get("engine_args")
    if identity.get("engine_args") and server_args is not None:
        config_checked = True
        baked_args = identity["engine_args"]
        if baked_args.get("model") != server_args.get("model"):
            config_same = False
            note = ""
            if model_rec.get("hf_hub_cache"):
                note = (" (offline, vLLM hashes a hub id's snapshot path: the server needs "
                        "HF_HUB_OFFLINE=1, the same HF_HUB_CACHE and the same snapshot)")
            diffs.append(Difference("model (ModelConfig.model)", baked_args.get("model"),
                                    server_args.get("model"), COST_AOT + note))
        hashed = _hashed_args(identity)
        compared = (set(baked_serve_args or {}) | set(hashed)) & (set(baked_args) | set(server_args))
        for name in sorted(compared - {"model", *DRIVER_OWNED}):
            if baked_args.get(name) != server_args.get(name):
                part = hashed.get(name)
                if part:
                    config_same = False
                diffs.append(Difference(f"serve arg {name}", baked_args.get(name), server_args.get(name),
                                        f"{COST_AOT} (vLLM's {part} hash holds it)" if part else COST_KERNELS))
        _check_plan_budget(report, baked_args, server_args, startup_plan, cache_root)
        if server.get("frontend_flags"):
            report.unchecked.append("frontend flags " + ", ".join(
                "--" + f.replace("_", "-") for f in server["frontend_flags"]))
        mine = server.get("config_sha256")
        if baked_config_sha256 and mine and mine != baked_config_sha256:
            config_same = False
            diffs.append(Difference("the model's config.json", baked_config_sha256[:16] + "...",
                                    mine[:16] + "...", COST_AOT + " (vLLM's model_config hash "
                                    "holds the parsed config; bake with this config.json: "
                                    "--model DIR)"))
        elif baked_config_sha256 and not mine:
            report.unchecked.append("the model's config.json (not readable here)")
    elif model and model_rec.get("requested") and model != model_rec.get("requested"):
        config_same = False
        diffs.append(Difference("model", model_rec.get("requested"), model, COST_AOT))
    else:
        report.unchecked.append("the model string and serve args (no engine arguments in the "
                                "bake's record: pass --artifact)")

    # 4. the code hash: the traced files at this install's paths
    scheme = scheme_for(identity.get("vllm_version"))
    code_same = True
    if (server.get("code_hash") and identity.get("code_hash")
            and not scheme.aot_load_needs_backend_dir and identity.get("aot")):
        # vLLM 0.34's mega AOT load checks the traced files' content where they are now
        # (decorators.py:274-289 ``_verify_source_unchanged``), not their recorded paths, and
        # never reaches the backend dir: a moved install still loads, a changed file does not
        changed = server.get("changed_files") or []
        if changed:
            code_same = False
            diffs.append(Difference("traced source files", "as baked",
                                    f"{len(changed)} differ (first: {_short(changed[0], 100)})",
                                    COST_AOT + " (vLLM: \"Source code has changed since the last "
                                    "compilation\")"))
    elif server.get("code_hash") and identity.get("code_hash"):
        if server["code_hash"] != identity["code_hash"]:
            code_same = False
            roots, baked_roots = server.get("roots") or {}, identity.get("roots") or {}
            moved = [f"{k} {baked_roots[k]} -> {roots.get(k, '?')}" for k in sorted(baked_roots)
                     if roots.get(k) != baked_roots[k]]
            what = ("install paths " + "; ".join(moved)) if moved else ""
            changed = server.get("changed_files") or []
            if changed:
                what += ("; " if what else "") + f"{len(changed)} traced file(s) differ (first: {_short(changed[0], 100)})"
            diffs.append(Difference("code hash (traced source files)", identity["code_hash"][:16] + "...",
                                    server["code_hash"][:16] + "...", COST_BACKEND + (f": {what}" if what else "")))
    elif identity.get("code_hash"):
        report.unchecked.append("the code hash (no traced files in the bake's record: pass --artifact)")

    # 5. the compiler: torch's key, Inductor's and functorch's configs; the GPU is install's
    compiler_same = True
    baked_cf, mine = identity.get("compiler_factors") or {}, server.get("compiler_factors") or {}
    if baked_cf:
        for key in ("torch_key", "inductor_config", "functorch_config"):
            if baked_cf.get(key) and mine.get(key) != baked_cf.get(key):
                compiler_same = False
                diffs.append(Difference(f"compiler {key}", baked_cf.get(key), mine.get(key), COST_BACKEND))
        report.unchecked.append("the GPU in Inductor's system info (install's preflight checks it)")

    # 6. where the server's vLLM will look: VLLM_CACHE_ROOT must be the installed role
    if cache_root is not None and server.get("vllm_cache_root") is not None:
        if os.path.realpath(server["vllm_cache_root"]) != os.path.realpath(cache_root):
            diffs.append(Difference("VLLM_CACHE_ROOT", cache_root, server["vllm_cache_root"], COST_ROOT))

    # The dirs vLLM will compute here, where every input of the parts it cannot compute matched.
    report.baked = {"backend_dirs": identity.get("backend_dirs") or [],
                    "aot": [a.get("hash") for a in identity.get("aot") or [] if isinstance(a, dict)]}
    # The config hash the engine's backend hashed, where the probe saw it: the engine resolves
    # more of the config during its start (found on the H200: the round's own VllmConfig hashed
    # cd695692e2, the engine's db6c470b36, and only the latter names the baked dirs).  A server
    # with the same inputs resolves the same.
    engine_config_hash = (identity.get("engine") or {}).get("config_hash")
    if config_same and (engine_config_hash or identity.get("config_hash")):
        env_hash, config_hash = server.get("env_hash"), engine_config_hash or identity["config_hash"]
        code = server.get("code_hash") or identity.get("code_hash")
        if (compiler_same and code_same and identity.get("compiler_hash") and code
                and scheme.aot_load_needs_backend_dir):
            report.predicted["backend_dirs"] = [vi.dir_hash(env_hash, config_hash, code,
                                                            identity["compiler_hash"])]
        aots = []
        for a in identity.get("aot") or []:
            predicted = _predict_aot(a, env_hash, config_hash, server, diffs) if isinstance(a, dict) else None
            if predicted:
                aots.append(predicted)
        if aots:
            report.predicted["aot"] = aots
        if config_checked:
            report.unchecked.append("the config hash itself (vLLM's platform needs a GPU): "
                                    "taken as the bake's, every input to it matched")
    if cache_root is not None and not report.differences:
        _check_installed(report, cache_root)
    return report


def _check_plan_budget(report: CompileCheck, baked_args: dict[str, Any], server_args: dict[str, Any],
                       startup_plan: dict[str, Any] | None, cache_root: str | None) -> None:
    """Where the bake carries vLLM's startup plan, the cache budget its key leaves out
    (``versions.STARTUP_PLAN_UNKEYED``) must be the server's too: vLLM validates the plan's
    key and free memory only (startup_plan.py:99-132)."""
    plans = (startup_plan or {}).get("plans") if isinstance(startup_plan, dict) else None
    on_disk = bool(cache_root) and os.path.isdir(os.path.join(cache_root, STARTUP_PLAN_DIR)) \
        and any(n.startswith("startup_plan_") for n in os.listdir(os.path.join(cache_root, STARTUP_PLAN_DIR)))
    if not plans and not on_disk:
        return
    for name in STARTUP_PLAN_UNKEYED:
        if baked_args.get(name) == server_args.get(name):
            continue
        line = f"serve arg {name}"
        existing = next((d for d in report.differences if d.factor == line), None)
        if existing is not None:
            existing.cost = f"{existing.cost}; {COST_PLAN}"
        else:
            report.differences.append(Difference(line, baked_args.get(name), server_args.get(name), COST_PLAN))


_INDUCTOR_NAMES = ("system", "torch_key", "inductor_config", "functorch_config")


def _predict_aot(entry: dict[str, Any], env_hash: str, config_hash: str, server: dict[str, Any],
                 diffs: list[Difference]) -> str | None:
    """The AOT dir vLLM will compute here: ``sha256(str(factors))`` of [env hash here, the
    engine's config hash, (mega AOT) Inductor's factors here, the forward's key as baked].
    Inductor's system info holds the GPU, which this check cannot read: it is taken as the
    bake's (install's preflight compares the GPU).  From a record without reprs (cachebake
    before 0.34 support), the 0.24 form: [env, config, *recorded factors[2:]]."""
    reprs = entry.get("factor_reprs")
    factors = entry.get("factors")
    if not isinstance(reprs, list):
        if isinstance(factors, list) and len(factors) >= 3:
            return vi.aot_hash([env_hash, config_hash, *factors[2:]])
        return None
    if len(reprs) < 3 or not all(isinstance(r, dict) for r in reprs):
        return None
    middle = reprs[2:-1]
    mine = server.get("aot_inductor_reprs") or []
    texts = [repr(env_hash), repr(config_hash)]
    same = True
    for i, baked in enumerate(middle):
        name = _INDUCTOR_NAMES[i] if i < len(_INDUCTOR_NAMES) else f"inductor factor {i}"
        if i == 0:  # the GPU's system info: the bake's
            if not isinstance(baked.get("repr"), str):
                return None
            texts.append(baked["repr"])
            continue
        here = mine[i] if i < len(mine) else None
        if here is None or hashlib.sha256(here.encode("utf-8", "surrogatepass")).hexdigest() != baked.get("sha256"):
            same = False
            if not any(d.factor == f"compiler {name}" for d in diffs):
                diffs.append(Difference(f"compiler {name} (AOT hash)", str(baked.get("sha256"))[:16] + "...",
                                        "(absent)" if here is None else
                                        hashlib.sha256(here.encode()).hexdigest()[:16] + "...", COST_AOT))
            continue
        texts.append(here)
    last = reprs[-1].get("repr")
    if not same or not isinstance(last, str):
        return None
    return aot_hash_of_reprs([*texts, last])


def _check_installed(report: CompileCheck, cache_root: str) -> None:
    """The predicted dirs must be in the installed tree (a role left out at install is not)."""
    base = os.path.join(cache_root, "torch_compile_cache")
    for d in report.predicted.get("backend_dirs") or []:
        if not os.path.isdir(os.path.join(base, d)):
            report.differences.append(Difference("installed backend dir", d, "(absent)", COST_BACKEND))
    for h in report.predicted.get("aot") or []:
        if not os.path.isdir(os.path.join(base, "torch_aot_compile", h)):
            report.differences.append(Difference("installed AOT artifact", h, "(absent)", COST_AOT))
