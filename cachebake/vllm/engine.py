"""The ``vllm`` driver: boot the real vLLM engine with dummy weights, then send the request plan.

A bake must compile exactly what the serving vLLM compiles.  So the driver starts vLLM's own
``LLM`` engine with the serve args unchanged, in the pinned bake environment (the Triton/vLLM/
FlashInfer cache roots the server will use), with ``load_format="dummy"`` (weights never enter a
kernel key), ``skip_tokenizer_init=True`` (prompts are token ids) and ``HF_HUB_OFFLINE=1`` (no
download).  The recipe's ``config.json`` is put where the *server's* model reference finds it:
in the directory the server uses, or, for a hub id the server serves (``vllm serve org/name``),
in the Hugging Face cache layout (``write_model_dir``).  The reference enters torch.compile's
cache key, so the round records it with the rest of vLLM's compile identity
(cachebake.vllm.identity: every factor of the hashes vLLM computed, and whether
torch.compile loaded the AOT artifact or compiled) for serve-args and verify.

vLLM's startup runs its own warmups (profile run, JIT warmup registry, CUDA graph capture); then
the plan from ``vllm_plan.plan_requests`` drives what only traffic reaches.  Each round is one
fresh process, so in-memory caches never hide a disk miss: ``run_warmup`` is the round body that
``cachebake build --driver vllm`` starts (``drivers.registry``), under the compile monitor, until
a round compiles nothing; ``run_engine_round`` runs one round as a child process on its own
(``python -m cachebake.vllm.engine SPEC REPORT``).

Nothing here fakes the engine: without vLLM (or without a GPU) a round fails with the child's
own error.

Why a round can compile after a quiet one (what "stable" has to rule out).  A Triton kernel
compiles once per specialization, and several of vLLM's kernels specialize on values that
depend on how requests were batched: an int argument equal to 1 becomes a constant, a multiple
of 16 gets ``tt.divisibility=16`` (``_zero_kv_blocks_kernel``'s ``n_blocks`` is the number of
KV blocks allocated in one step; the sampler's and the Mamba kernels' batch and token counts).
So a step whose composition never occurred before can compile, and composition varies:

* admission: with vLLM's default multiprocess engine the EngineCore starts stepping as soon as
  the first request of a ``generate`` arrives over ZMQ, so how many of a batch's prompts share
  the first step depends on timing.  The driver pauses the scheduler (``pause_scheduler("keep")``,
  a utility call in vLLM 0.24 and 0.33), enqueues the whole batch, then resumes: every round
  admits the same requests to the same steps (``BatchResult.admitted_at_once``);
* async scheduling and output processing overlap steps but do not change what a step holds
  once admission is fixed (finishing is fixed too: ``ignore_eos`` and a set ``max_tokens``);
* KV-cache pressure: the number of KV blocks comes from profiling free GPU memory at start-up,
  which varies slightly between processes; a batch near the limit can be preempted in one
  round and not in another.  The plan keeps its batches far below it;
* sampled tokens: unseeded sampling changes token ids, not shapes, except under speculative
  decoding, where accepted drafts decide the next step's shapes: the plan seeds every sampled
  request when drafts are on;
* autotuning: Triton benchmarks every config in the round that first meets a key and caches
  the winner; later rounds read it (no compile), whatever the timings.

What stays out of reach: traffic the plan does not send (another batch composition or sampling
parameter), and compiles that depend on the GPU's free memory.  Hence two quiet rounds, or a
plan whose coverage is checked (``plan_digest`` records exactly what was sent).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cachebake import jsonio
from cachebake.capture.env import MONITOR_LOG_ENV, ROUND_ENV
from cachebake.vllm import identity as vllm_identity
from cachebake.vllm import versions
from cachebake.vllm.request_plan import (EngineLimits, RequestBatch, limits_from_serve_args,
                                         limits_from_vllm_config, plan_digest, plan_requests,
                                         plan_summary)
from cachebake.errors import BadInput, CommandFailed
from cachebake.recipes import CAP_MODEL_CONFIG, Recipe
from cachebake.roles import ROLE_ENV
from cachebake.vllm.serveargs import (BAKE_ONLY, IDENTITY_KEY, model_reference, resolve,
                                 serve_args_to_flags, validate_serve_args)

# What every vLLM bake process runs with besides the pinned cache roots: no network, no telemetry.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


# Besides the cache roots, variables that change what the server compiles: the server needs
# them as the bake had them (the V2 model runner samples with other kernels than V1).
SERVE_ENV_VARS = ("TRITON_CACHE_AUTOTUNING", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_AOT_COMPILE",
                  "VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_USE_STANDALONE_COMPILE",
                  versions.STARTUP_PLAN_ENV)


def config_bytes(hf_config: dict[str, Any]) -> bytes:
    return (json.dumps(hf_config, indent=2, sort_keys=True) + "\n").encode()


def write_model_dir(recipe: Recipe, model_dir: os.PathLike | str, *,
                    revision: str | None = None, hub_cache: str | None = None) -> str:
    """Put the recipe's config.json where vLLM finds it for ``model_dir``, the reference the
    server will pass to ``vllm serve``; return that reference unchanged.

    - an absolute path: ``model_dir/config.json``;
    - a hub id ("org/name"): the Hugging Face cache layout vLLM reads offline
      (repo_utils ``get_model_path`` -> huggingface_hub ``snapshot_download(local_files_only)``):
      ``HF_HUB_CACHE/models--org--name/refs/<revision>`` naming a snapshot,
      ``snapshots/<commit>/config.json``.  ``revision``: a commit (40 hex) or a ref, default
      "main"; a ref that does not exist yet points at a snapshot named by the config's sha1.

    An existing config.json is kept only if it describes the same model: a bake never
    overwrites a real model's config with different hyperparameters."""
    text = os.fspath(model_dir)
    if not os.path.isabs(text):
        kind, ref = model_reference(text)
        if kind != "hub":
            raise BadInput(f"model dir {text} must be absolute: the path enters torch.compile's "
                           "cache key, so it must be the path the server uses")
        place_hub_config(recipe, ref, revision=revision, hub_cache=hub_cache)
        return ref
    _write_config(recipe, Path(text), "or use --model with that directory")
    return text


def _write_config(recipe: Recipe, d: Path, remedy: str) -> None:
    path = d / "config.json"
    data = config_bytes(recipe.hf_config)
    if path.exists():
        existing = jsonio.load_document(os.path.realpath(path), str(path), CAP_MODEL_CONFIG,
                                        missing=BadInput)
        if existing != recipe.hf_config:
            raise BadInput(f"{path} already holds a different config; bake into an empty directory "
                           + remedy)
        return
    d.mkdir(parents=True, exist_ok=True)
    jsonio.write_atomic(path, data)


_COMMIT = re.compile(r"[0-9a-f]{40}\Z")
_REF = re.compile(r"[A-Za-z0-9._-]{1,200}\Z")


def hub_cache_dir() -> str:
    """The Hugging Face hub cache this process reads: huggingface_hub's own constant where it
    is importable (vLLM brings it), else its documented rule (HF_HUB_CACHE, HF_HOME/hub,
    XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub)."""
    try:
        import huggingface_hub.constants as hc

        return os.path.abspath(hc.HF_HUB_CACHE)
    except ImportError:
        env = os.environ
        if env.get("HF_HUB_CACHE"):
            return os.path.abspath(env["HF_HUB_CACHE"])
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
        return os.path.abspath(os.path.join(home, "hub"))


def place_hub_config(recipe: Recipe, repo_id: str, *, revision: str | None = None,
                     hub_cache: str | None = None) -> Path:
    """The snapshot dir holding the recipe's config.json for ``repo_id`` in the hub cache
    (see ``write_model_dir``); a snapshot that exists without config.json is refused (a real
    download in progress is not ours to complete)."""
    cache = Path(hub_cache or hub_cache_dir())
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    revision = revision or "main"
    if not isinstance(revision, str) or not (_COMMIT.match(revision) or _REF.match(revision)) \
            or revision in (".", ".."):
        raise BadInput(f"revision {revision!r}: not a commit hash or a ref name")
    if _COMMIT.match(revision):
        commit = revision
    else:
        ref_file = repo_dir / "refs" / revision
        try:
            commit = ref_file.read_text().strip()
        except FileNotFoundError:
            commit = hashlib.sha1(config_bytes(recipe.hf_config)).hexdigest()
            ref_file.parent.mkdir(parents=True, exist_ok=True)
            jsonio.write_atomic(ref_file, commit.encode())
        if not _COMMIT.match(commit):
            raise BadInput(f"{ref_file} does not name a snapshot (a 40-hex commit)")
    snapshot = repo_dir / "snapshots" / commit
    if snapshot.is_dir() and not (snapshot / "config.json").exists():
        raise BadInput(f"{snapshot} exists without config.json (an unfinished download?): "
                       "finish it, or bake with HF_HOME at an empty directory")
    _write_config(recipe, snapshot, "or bake with HF_HOME at an empty directory")
    return snapshot


def engine_kwargs(model_dir: os.PathLike | str, serve_args: dict[str, Any]) -> dict[str, Any]:
    """The exact ``LLM(...)`` / ``EngineArgs(...)`` arguments of a bake."""
    validate_serve_args(serve_args)
    return {"model": os.fspath(model_dir), **BAKE_ONLY, **serve_args}


def bake_environment(env: dict[str, str]) -> dict[str, str]:
    """The child's environment: the pinned bake env (``capture.env.BakeEnv.env``) + offline."""
    return {**env, **OFFLINE_ENV}


@dataclass
class BatchResult:
    label: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    seconds: float
    admitted_at_once: bool = False  # scheduler paused while the batch was enqueued


@dataclass
class VllmRoundReport:
    """One fresh-process round: engine startup, then the plan."""

    model_dir: str
    serve_args: dict[str, Any]
    startup_seconds: float = 0.0
    seconds: float = 0.0
    limits: dict[str, Any] = field(default_factory=dict)
    batches: list[BatchResult] = field(default_factory=list)
    vllm_version: str | None = None
    model_runner: str | None = None  # "v1" | "v2": vLLM 0.24 defaults to V1, 0.33 to V2
    plan_digest: str | None = None
    returncode: int = 0
    # vLLM's torch.compile identity as this round computed it (cachebake.vllm.identity)
    compile_identity: dict[str, Any] | None = None
    # what torch.compile did in this round: the AOT artifact loaded, or compiled again
    torch_compile: dict[str, Any] | None = None
    # vLLM's startup plan (vLLM >= 0.34): on, the plan files in the vllm role, the cache budget
    startup_plan: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VllmRoundReport":
        d = dict(d)
        d["batches"] = [BatchResult(**b) for b in d.get("batches", [])]
        return cls(**d)


def bake_record(recipe: Recipe, serve_args: dict[str, Any], model_dir: str,
                serve_env: dict[str, str], report: VllmRoundReport | None = None) -> dict[str, Any]:
    """The manifest's ``bake`` section for a vLLM bake: what `serve-args` and `inspect` show."""
    model = recipe.identity()
    model["path"] = model_dir  # the reference the server passes: a path or a hub id
    model["reference"] = model_reference(model_dir)[0]
    model["config_sha256"] = hashlib.sha256(config_bytes(recipe.hf_config)).hexdigest()
    rec: dict[str, Any] = {
        "driver": "vllm",
        "model": model,
        "serve_args": dict(serve_args),
        "serve_env": dict(serve_env),
        "vllm_flags": serve_args_to_flags(serve_args),
    }
    if report is not None:
        rec["vllm_version"] = report.vllm_version
        rec["model_runner"] = report.model_runner
        rec["engine_limits"] = report.limits
        rec["plan"] = [asdict(b) for b in report.batches]
        rec["plan_digest"] = report.plan_digest
        if report.compile_identity is not None:
            rec[IDENTITY_KEY] = report.compile_identity
        if report.torch_compile is not None:
            rec["torch_compile"] = report.torch_compile
        if report.startup_plan is not None:
            rec["startup_plan"] = report.startup_plan
    return rec


def run_engine_round(recipe: Recipe, serve_args: dict[str, Any], *, model_dir: os.PathLike | str,
                     env: dict[str, str], workdir: os.PathLike | str, python: str = sys.executable,
                     timeout: float | None = None) -> VllmRoundReport:
    """Run one engine round in a fresh process, outside ``build`` (the tests' and benches' way to
    drive the engine alone; ``build``'s rounds are cachebake.bake.rounds.run_round's); raise
    CommandFailed with the log's tail if it fails."""
    validate_serve_args(serve_args)
    mdir = write_model_dir(recipe, model_dir, revision=serve_args.get("revision"))
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    spec_path, report_path, log_path = work / "spec.json", work / "report.json", work / "vllm.log"
    report_path.unlink(missing_ok=True)
    spec = {"engine_kwargs": engine_kwargs(mdir, serve_args), "hf_config": recipe.hf_config,
            "serve_args": serve_args, "probe": str(work / "vllm-probe.jsonl")}
    spec_path.write_text(json.dumps(spec, indent=2))
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.run([python, "-m", "cachebake.vllm.engine",
                                   str(spec_path), str(report_path)],
                                  env=bake_environment(env), stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CommandFailed(f"vllm round timed out after {timeout:.0f} s (log: {log_path})") from None
    if proc.returncode != 0 or not report_path.exists():
        raise CommandFailed(f"vllm round failed (exit {proc.returncode}; log: {log_path}): "
                            + _root_cause(log_path.read_text(errors="replace")))
    return VllmRoundReport.from_dict(json.loads(report_path.read_text()))


def _root_cause(log: str) -> str:
    """The error lines of a failed round's log (vLLM reports the real cause in its worker's
    lines, well before the final 'Engine core initialization failed')."""
    lines = [ln.strip() for ln in log.splitlines()]
    errs = [ln for ln in lines if ("Error:" in ln or "Exception:" in ln) and "plugin" not in ln]
    seen: list[str] = []
    for ln in errs:
        if ln not in seen:
            seen.append(ln)
    if len(seen) > 3:  # the first errors are the cause, the last one says where it surfaced
        seen = seen[:2] + seen[-1:]
    return " | ".join(seen) if seen else " | ".join(lines[-6:])


def _send(llm: Any, batch: RequestBatch, vocab_size: int) -> BatchResult:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in batch.prompts(vocab_size)]
    params = [SamplingParams(max_tokens=batch.max_tokens, ignore_eos=True, detokenize=False,
                             **batch.sampling_for(i)) for i in range(batch.num_requests)]
    t0 = time.monotonic()
    outs, at_once = generate_at_once(llm, prompts, params)
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return BatchResult(batch.label, batch.num_requests, batch.prompt_tokens, n_out,
                       round(time.monotonic() - t0, 3), at_once)


def generate_at_once(llm: Any, prompts: list, params: list) -> tuple[list, bool]:
    """``llm.generate``, with every request admitted before the first step when vLLM allows it:
    the scheduler is paused (``pause_scheduler("keep")``: no step runs, adds are queued) while
    the batch is enqueued, then resumed.  Returns (outputs, whether it was paused); engines
    without the utility (older vLLM) fall back to a plain generate."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and not hasattr(core, "call_utility"):
        # The in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) adds every request of a
        # generate before its first step: at once already.
        return llm.generate(prompts, params, use_tqdm=False), type(core).__name__ == "InprocClient"
    paused = False
    if core is not None and hasattr(llm, "enqueue") and hasattr(llm, "wait_for_completion"):
        try:
            core.call_utility("pause_scheduler", "keep", False)
            paused = True
        except Exception:  # the utility is missing or refused: plain generate below
            paused = False
    if not paused:
        return llm.generate(prompts, params, use_tqdm=False), False
    try:
        llm.enqueue(prompts, params, use_tqdm=False)
    finally:
        core.call_utility("resume_scheduler")
    return llm.wait_for_completion(use_tqdm=False), True


def _step(label: str):
    """The compile monitor's step label (capture.monitor), when that module is present.

    vLLM runs the model in its EngineCore process, started during ``LLM(...)``; labels set
    later reach only this front-end process (events still carry times to match batches by)."""
    try:
        from cachebake.capture.monitor import step
    except ImportError:
        return contextlib.nullcontext()
    return step(label)


def probe_path() -> Path:
    """Where this round's engine processes append their torch.compile records: beside the
    compile monitor's log (one file per round), else in a temp dir."""
    monitor_log = os.environ.get(MONITOR_LOG_ENV)
    if monitor_log:
        return Path(monitor_log).parent / f"vllm-probe-{os.environ.get(ROUND_ENV) or 0}.jsonl"
    import tempfile

    return Path(tempfile.mkdtemp(prefix="cachebake-vllm-probe-")) / "vllm-probe.jsonl"


def warmup(kwargs: dict[str, Any], hf_config: dict[str, Any],
           serve_args: dict[str, Any], probe: os.PathLike | str | None = None) -> VllmRoundReport:
    """In this process (already in the bake env): build the engine, send the plan."""
    os.environ.update(OFFLINE_ENV)  # before vLLM / huggingface_hub read them at import
    # The engine's processes inherit it: the cachebake vLLM plugin installs the probe there.
    probe_file = Path(probe) if probe else probe_path()
    probe_file.unlink(missing_ok=True)
    os.environ[vllm_identity.PROBE_ENV] = str(probe_file)
    # Where the installed vLLM has it, the bake carries the startup plan (the memory-profiling
    # result, in the vllm role: versions.STARTUP_PLAN_*); an explicit 0 in the bake env is kept.
    if versions.has_startup_plan():
        os.environ.setdefault(versions.STARTUP_PLAN_ENV, "1")
    start_env = dict(os.environ)  # before vLLM sets variables of its own
    t0 = time.monotonic()
    with _step("vllm-startup"):
        import vllm
        from vllm import LLM

        vllm_identity.install_probe()  # this process too (an in-process engine compiles here)
        llm = LLM(**kwargs)
    startup = time.monotonic() - t0
    vllm_config = llm.llm_engine.vllm_config
    events = vllm_identity.read_probe(probe_file)
    try:
        from vllm.engine.arg_utils import EngineArgs

        identity = vllm_identity.bake_identity(vllm_config, kwargs, events, EngineArgs(**kwargs),
                                               start_env=start_env)
    except Exception as e:  # noqa: BLE001 - the bake stands; the record says what is missing
        identity = {"schema": vllm_identity.IDENTITY_SCHEMA, "error": repr(e)[:500]}
        print(f"cachebake: vLLM's compile identity could not be recorded: {e!r}", flush=True)
    limits = limits_from_vllm_config(vllm_config, hf_config)
    vocab = int(hf_config.get("vocab_size") or 32000)
    plan = plan_requests(hf_config, serve_args, limits)
    v2 = versions.uses_v2_runner(vllm_config)  # 0.34: V2 only
    report = VllmRoundReport(model_dir=kwargs["model"], serve_args=serve_args,
                             startup_seconds=round(startup, 3), limits=limits.to_dict(),
                             vllm_version=getattr(vllm, "__version__", None),
                             model_runner="v2" if v2 else "v1",
                             plan_digest=plan_digest(plan, vocab),
                             compile_identity=identity,
                             torch_compile=(vllm_identity.torch_compile_outcome(events)
                                            if events else None))
    report.startup_plan = startup_plan_record(vllm_config)
    for batch in plan:
        with _step(f"plan:{batch.label}"):
            report.batches.append(_send(llm, batch, vocab))
        print(f"cachebake: {batch.label}: {report.batches[-1].seconds} s", flush=True)
    report.seconds = round(time.monotonic() - t0, 3)
    return report


def startup_plan_record(vllm_config: Any) -> dict[str, Any] | None:
    """The bake's startup plan: whether it was on, the plan files vLLM saved in the vllm role
    (each: its key and the KV-cache bytes, as vLLM wrote them), and the cache budget the engine
    resolved, which the plan's key does not hold (versions.STARTUP_PLAN_UNKEYED).  None where
    the installed vLLM has no startup plan."""
    if not versions.has_startup_plan():
        return None
    cache = getattr(vllm_config, "cache_config", None)
    rec: dict[str, Any] = {"enabled": os.environ.get(versions.STARTUP_PLAN_ENV, "0") not in ("", "0"),
                           "budget": {k: getattr(cache, k, None) for k in versions.STARTUP_PLAN_UNKEYED},
                           "plans": []}
    root = os.environ.get("VLLM_CACHE_ROOT")
    d = Path(root) / versions.STARTUP_PLAN_DIR if root else None
    for p in sorted(d.glob("startup_plan_*.json")) if d and d.is_dir() else []:
        try:
            doc = jsonio.load_document(p, "startup plan", 1 << 16)
        except Exception:  # noqa: BLE001 - vLLM itself ignores an unreadable plan
            continue
        if isinstance(doc, dict):
            rec["plans"].append({"file": p.name, "fingerprint": doc.get("fingerprint"),
                                 "kv_cache_memory_bytes": doc.get("kv_cache_memory_bytes"),
                                 "free_memory_baseline": doc.get("free_memory_baseline")})
    return rec


def prepare(model: str, tp: int | None = None, *, serve_args: dict[str, Any] | str | None = None,
            model_dir: str | None = None) -> tuple[Recipe, dict[str, Any], str]:
    """``serveargs.resolve`` (recipe, serve args, model reference), with the config.json put
    where vLLM finds it for that reference."""
    recipe, args, mdir = resolve(model, tp, serve_args=serve_args, model_dir=model_dir)
    return recipe, args, write_model_dir(recipe, mdir, revision=args.get("revision"))


def run_warmup(model: str = "nemotron-h", tp: int | None = None, *,
               serve_args: dict[str, Any] | str | None = None, model_dir: str | None = None,
               report: str | None = None) -> VllmRoundReport:
    """One round in this process: the entry point of ``--driver vllm`` rounds
    (``cachebake.drivers.registry``'s in-process driver runs it inside the bake env).

    ``model``: a recipe (``name[:variant]``), a model dir or a config.json.  Serve args: the
    recipe's defaults, updated by ``serve_args`` (dict, JSON or ``vllm serve`` flags); ``tp``
    overrides tensor_parallel_size when given.  ``model_dir``: the path the server will use
    (default ``default_model_dir``).

    Writes the bake record (``bake_record``: model identity and path, the exact serve args, the
    limits vLLM resolved, the plan's batches) to ``report``, or else beside the compile
    monitor's log as ``vllm-bake.json``, for the build to put in the manifest."""
    recipe, args, mdir = prepare(model, tp, serve_args=serve_args, model_dir=model_dir)
    result = warmup(engine_kwargs(mdir, args), recipe.hf_config, args)
    serve_env = {v: os.environ[v] for v in (*ROLE_ENV.values(), *SERVE_ENV_VARS)
                 if v in os.environ}
    record = bake_record(recipe, args, str(mdir), serve_env, result)
    monitor_log = os.environ.get(MONITOR_LOG_ENV)
    out = report or (str(Path(monitor_log).parent / "vllm-bake.json") if monitor_log else None)
    if out:
        _write_json(out, record)
    return result


def _write_json(path: str, data: dict[str, Any]) -> None:
    # strict: the record goes into the manifest
    jsonio.write_atomic(path, jsonio.dumps(data, indent=2).encode())


def child_main(spec_path: str, report_path: str) -> int:
    """``run_engine_round``'s child: runs inside the bake environment, writes the report."""
    spec = json.loads(Path(spec_path).read_text())
    result = warmup(spec["engine_kwargs"], spec["hf_config"], spec["serve_args"], spec.get("probe"))
    _write_json(report_path, result.to_dict())
    return 0


__all__ = ["EngineLimits", "RequestBatch", "VllmRoundReport", "bake_record", "engine_kwargs",
           "generate_at_once", "limits_from_serve_args", "plan_requests", "plan_summary", "run_engine_round",
           "run_warmup", "write_model_dir"]

if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m cachebake.vllm.engine SPEC.json REPORT.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(child_main(sys.argv[1], sys.argv[2]))
