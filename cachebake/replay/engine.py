"""``cachebake replay``: compile a record for a target, on any machine, in N processes.

Plan: every recorded launch once (entries of several recorded targets that are the same
launch count once), plus, for each autotuned kernel, every candidate config it tried at each
specialization it was tuned at, so the first serve-time autotune only benchmarks.  Then the
plan's entries compile in a pool of worker processes into a fresh cache; launcher helpers are
built from the compiled kernels' launcher sources; recorded autotune results are carried only
when the target is the one they were measured on (another GPU's timings would pick its
configs).  What cannot be compiled as recorded (a module off the allowlist or not importable
here, options off the allowlist, other cache-invalidating variables than this process's, source
changed, a constexpr that is not data, a compile error for this target) is reported, never
guessed; a refused entry never reaches a worker.  The record is data: its variables are never
applied, its modules imported only from ``ModuleAllowlist`` (cachebake.capture.keys).
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cachebake.capture.keys import ModuleAllowlist, entry_problems, kernel_problem
from cachebake.capture.record import (RECORD_DOCUMENT, RECORD_MEDIA_TYPE, AutotuneSpec, CompileRecord,
                                      CompileSpec, shown)
from cachebake.errors import BadInput, Interrupted, Unsupported


@dataclass
class LoadedRecord:
    record: CompileRecord
    source: str
    layer_root: str | None = None  # the bake's serving root, where the source was an artifact
    fingerprints: dict = field(default_factory=dict)  # target -> the source bake's fingerprint


def load_record(source: os.PathLike | str) -> LoadedRecord:
    """A record from an artifact (every target's bake merged), a record JSON file, or a
    monitor's ``*.record.jsonl`` log."""
    path = Path(source)
    if not path.exists():
        raise BadInput(f"{path}: no such artifact or record")
    if path.is_dir():
        from cachebake.artifact import oci

        art = oci.open_artifact(path)
        record, layer_root, fingerprints = CompileRecord(), None, {}
        for target in art.targets():
            ref = art.select(target)
            fingerprints[target] = ref.manifest.fingerprint.to_json()
            desc = ref.manifest.record
            if not desc:
                continue
            if desc.get("mediaType") != RECORD_MEDIA_TYPE:
                raise Unsupported(f"{path}: {target}'s record is a {shown(desc.get('mediaType'), 80)}")
            record.add(CompileRecord.from_dict(art.read_json_blob(desc)))
            layer_root = layer_root or ref.manifest.layer_root
        if not record.compiles:
            raise BadInput(f"{path} carries no compile record (baked before records existed, "
                           "or packed with `cachebake pack`): rebuild it with `cachebake build`")
        return LoadedRecord(record, str(path), layer_root, fingerprints)
    from cachebake.artifact.schema import CAP_BLOB
    from cachebake.jsonio import read_document

    real = os.path.realpath(path)  # the user named it, links included; FIFOs and devices refused
    if path.name.endswith(".jsonl"):
        from cachebake.capture.recorder import load_record_log

        return LoadedRecord(load_record_log(real), str(path))
    return LoadedRecord(CompileRecord.from_json(read_document(real, RECORD_DOCUMENT, CAP_BLOB)), str(path))


@dataclass
class Plan:
    compiles: list[CompileSpec]
    carry: list[AutotuneSpec]  # autotune results to write (recorded on this target)
    derived: int  # autotune candidates added that the record had not compiled
    not_carried: int  # autotune results measured on another target
    problems: list[str] = field(default_factory=list)


def plan(record: CompileRecord, target: str) -> Plan:
    by_id: dict[str, CompileSpec] = {}
    for spec in record.compiles:
        by_id.setdefault(spec.spec_id(), spec)
    by_hash = {(c.target, c.hash): c for c in record.compiles}
    derived, problems = 0, []
    for tune in record.autotune:
        bases = [by_hash[(tune.target, h)] for h in tune.compiles if (tune.target, h) in by_hash]
        if not bases:
            problems.append(f"{tune.kernel.label} key {shown(tune.tuning_key, 80)}: no compile of it "
                            "was recorded, its candidates cannot be derived")
            continue
        for base in bases:
            for config in tune.configs:
                try:
                    spec = with_config(base, config)
                except ValueError as e:
                    problems.append(f"{tune.kernel.label}: {e}")
                    continue
                if spec.spec_id() not in by_id:
                    by_id[spec.spec_id()] = spec
                    derived += 1
    carry = [t for t in record.autotune if t.target == target and t.timings and t.result_hash]
    not_carried = sum(1 for t in record.autotune if t.target != target)
    return Plan(sorted(by_id.values(), key=lambda s: (s.kernel.name, s.spec_id())), carry,
                derived, not_carried, problems)


def with_config(base: CompileSpec, config) -> CompileSpec:
    """``base`` launched with another autotune config: its kwargs replace the constexprs of
    those names, its launch options replace num_warps/num_stages/num_ctas/maxnreg (as
    Autotuner.run passes ``config.all_kwargs()`` to the kernel)."""
    spec = copy.deepcopy(base)
    names = [name for name, _ in spec.signature]
    consts = {tuple(p): i for i, (p, _) in enumerate(spec.constexprs)}
    for name, value in config.kwargs:
        if name not in names:
            raise ValueError(f"config sets {name!r}, which the kernel does not take")
        i = consts.get((names.index(name),))
        if i is None:
            raise ValueError(f"config sets {name!r}, which is not a constexpr of the recorded launch")
        spec.constexprs[i] = [spec.constexprs[i][0], value]
    spec.options.update(num_warps=config.num_warps, num_stages=config.num_stages,
                        num_ctas=config.num_ctas, maxnreg=config.maxnreg)
    spec.hash, spec.verified, spec.seen = "", False, "derived"
    return spec


@dataclass
class CompileResult:
    target: str
    jobs: int
    planned: int = 0
    compiled: int = 0  # real compiles written
    already: int = 0  # entries the cache already held
    derived: int = 0
    autotune_carried: int = 0
    autotune_not_carried: int = 0
    helpers_built: int = 0
    key_mismatches: int = 0
    same_triton_build: bool = False  # the record was made by this Triton build (keys must match)
    compile_seconds: float = 0.0  # summed over workers
    seconds: float = 0.0  # wall
    problems: list[str] = field(default_factory=list)
    replayed: list[CompileSpec] = field(default_factory=list)  # entries for ``target``, with hashes
    failed: dict[str, str] = field(default_factory=dict)  # spec_id -> its problem (also in problems)

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("replayed", "failed")}
        d["compile_seconds"] = round(self.compile_seconds, 3)
        d["seconds"] = round(self.seconds, 3)
        return d


def compile_record(record: CompileRecord, target: str, cache_dir: os.PathLike | str, *,
                   jobs: int | None = None, carry_autotune: bool = True,
                   progress: Callable[[str], None] | None = None,
                   allow_modules: Iterable[str] = ()) -> CompileResult:
    """Compile ``record`` for ``target`` into ``cache_dir`` (a Triton cache dir) in ``jobs``
    worker processes.  Problems are collected in the result, not raised.  ``allow_modules``:
    modules (and their submodules) the record may name beyond ``DEFAULT_KERNEL_PACKAGES``."""
    from cachebake.gpu import GPUTargetSpec
    from cachebake.replay import worker
    from cachebake.toolchain import c_toolchain_problem

    spec_t = GPUTargetSpec.parse(target)
    if spec_t.backend != "cuda":
        raise Unsupported(f"replay compiles for CUDA targets only (asked for {spec_t.key})")
    problem = c_toolchain_problem()
    if problem:
        raise Unsupported(f"replay builds Triton's launcher helpers with a C compiler: {problem}")
    target = spec_t.key
    try:
        allowed = ModuleAllowlist(allow_modules)
    except ValueError as e:
        raise BadInput(str(e)) from None
    jobs = max(1, jobs or os.cpu_count() or 1)
    t0 = time.monotonic()
    p = plan(record, target)
    res = CompileResult(target=target, jobs=jobs, planned=len(p.compiles), derived=p.derived,
                        autotune_not_carried=p.not_carried, problems=list(p.problems))
    compiles = []
    for spec in p.compiles:  # refused here never reach a worker (the worker checks again)
        refused = entry_problems(spec, allowed)
        if refused:
            res.problems.append("; ".join(refused))
            res.failed[spec.spec_id()] = res.problems[-1]
        else:
            compiles.append(spec)
    carry = []
    for tune in (p.carry if carry_autotune else []):
        refused = kernel_problem(tune.kernel, allowed)
        if refused:
            res.problems.append(refused)
        else:
            carry.append(tune)
    names = list(allowed.names)
    cache_dir = os.path.abspath(os.fspath(cache_dir))
    os.makedirs(cache_dir, exist_ok=True)
    from cachebake.capture.recorder import triton_build

    same_build = record.triton_key is not None and record.triton_key == triton_build()["triton_key"]
    res.same_triton_build = same_build
    ctx = multiprocessing.get_context("spawn")  # a clean Triton per worker, whatever the parent imported
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=worker.init_worker,
                               initargs=(cache_dir,))
    try:
        _run_pool(pool, worker, compiles, carry, target, names, res, same_build, progress)
    except KeyboardInterrupt:
        # The workers ignore SIGINT (worker.init_worker): this process stops them and says
        # what was done; none of them prints a traceback.
        _stop_pool(pool)
        raise ReplayStopped(res) from None
    pool.shutdown(wait=True)
    res.seconds = time.monotonic() - t0
    return res


class ReplayStopped(KeyboardInterrupt):
    """Ctrl-C while the workers compiled: ``result`` holds what they had finished."""

    def __init__(self, result: CompileResult):
        super().__init__()
        self.result = result


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT held back (pending, not lost) while worker processes may be started: a worker
    inherits the blocked mask through fork and exec, so a Ctrl-C cannot reach it while its
    interpreter imports (where it would print a traceback), and ``init_worker`` ignores it
    before unblocking.  This process gets its Ctrl-C when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started, end the workers (SIGTERM: their default action, no
    traceback) and wait for them, so none outlives the command."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        try:
            proc.terminate()
        except (OSError, ValueError):
            pass
    for proc in processes:
        proc.join(timeout=30)


def _run_pool(pool, worker, compiles, carry, target, names, res, same_build, progress) -> None:
    """The pool's work: every entry, then the launcher helpers and the autotune results."""
    with _sigint_blocked():
        futures = {pool.submit(worker.compile_job, s.to_dict(), target, names): s for s in compiles}
    launchers: dict[str, None] = {}
    for n, fut in enumerate(as_completed(futures), 1):
        spec, out = futures[fut], _result(fut, futures[fut].kernel.label)
        res.compile_seconds += out.get("seconds", 0.0)
        if not out["ok"]:
            res.problems.append(out["problem"])
            res.failed[spec.spec_id()] = out["problem"]
            continue
        if out["cache_hit"]:
            res.already += 1
        else:
            res.compiled += 1
        if out["launcher"] is not None:  # None: this Triton has no per-kernel launcher
            launchers[out["launcher"]] = None
        done = copy.deepcopy(spec)
        done.target, done.hash, done.verified, done.seen = target, out["hash"], True, "compile"
        res.replayed.append(done)
        # The same Triton build must reproduce the recorded key; another build (version,
        # wheel, Python tag) keys everything anew, which is what a rebuild is for.
        if spec.target == target and spec.hash and out["hash"] != spec.hash and same_build:
            res.key_mismatches += 1
            res.problems.append(f"{spec.kernel.label}: key differs from the recorded one "
                                f"({out['hash'][:12]} vs {shown(spec.hash[:12])}): {spec.label()}")
        if progress is not None and (n == len(futures) or n % max(1, len(futures) // 10) == 0):
            progress(f"replay {target}: {n}/{len(futures)} entries ({len(res.problems)} problems)")
    try:
        with _sigint_blocked():
            helper_futures = [pool.submit(worker.helper_job, worker.cuda_utils_source(), "cuda_utils")]
            helper_futures += [pool.submit(worker.helper_job, src, "__triton_launcher")
                               for src in launchers]
            tune_futures = [pool.submit(worker.autotune_job, t.to_dict(), target, names) for t in carry]
    except BrokenProcessPool:
        res.problems.append("launcher helpers and autotune results not written: a worker process died")
        helper_futures, tune_futures = [], []
    for fut in helper_futures:
        out = _result(fut, "a launcher helper")
        if not out["ok"]:
            res.problems.append(out["problem"])
        elif not out["cache_hit"]:
            res.helpers_built += 1
    for fut in tune_futures:
        out = _result(fut, "an autotune result")
        if out["ok"]:
            res.autotune_carried += 1
        else:
            res.problems.append(out["problem"])


def _result(fut, what: str) -> dict:
    """A worker's answer; a worker that died (a crash inside Triton or LLVM) is a problem of
    the job it ran, not of the whole replay."""
    try:
        return fut.result()
    except BrokenProcessPool:
        return {"ok": False, "problem": f"{what}: the worker process died (a crash in the compiler); "
                "no further entries were compiled", "cache_hit": False}


@dataclass
class ReplayReport:
    source: str
    out: str
    result: CompileResult
    pack: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.result.problems

    def to_dict(self) -> dict:
        return {"source": self.source, "out": self.out, "target": self.result.target,
                **self.result.to_dict(), "pack": self.pack}


def replay(source: os.PathLike | str, *, target: str, out: os.PathLike | str, jobs: int | None = None,
           partial: bool = False, layer_root: str | None = None, gpu_name: str | None = None,
           progress: Callable[[str], None] | None = None,
           allow_modules: Iterable[str] = ()) -> ReplayReport:
    """The whole of ``cachebake replay``: load, compile into a fresh cache, pack."""
    from cachebake.artifact.pack import CacheRoot, check_out, pack_artifact, work_dir_beside

    loaded = load_record(source)
    out_path = check_out(out)  # before any compile: an --out in the way wastes none
    # beside --out, locked while we live: what a killed replay leaves, the next pack removes
    work, lock_fd = work_dir_beside(out_path, "replay")
    result = None
    try:
        cache = work / "triton"
        try:
            result = compile_record(loaded.record, target, cache, jobs=jobs, progress=progress,
                                    allow_modules=allow_modules)
        except ReplayStopped as e:
            shutil.rmtree(work, ignore_errors=True)
            r = e.result
            raise Interrupted(f"replay for {r.target} stopped after {r.compiled + r.already} of "
                              f"{r.planned} entries compiled (the partial cache holding them was "
                              f"removed); nothing written: {out_path} is as it was") from None
        if result.problems and not partial:
            err = Unsupported(f"{len(result.problems)} record entries could not be replayed for "
                              f"{result.target}; nothing written (--partial packs the rest)\n"
                              + "\n".join(result.problems[:20]))
            err.report = ReplayReport(loaded.source, str(out_path), result)
            raise err
        if not result.replayed:
            raise BadInput(f"{source}: nothing was replayed for {result.target}")
        record_out = copy.deepcopy(loaded.record).add(CompileRecord(compiles=result.replayed))
        bake = {"replay": {"from": loaded.source, "record_targets": loaded.record.targets(),
                           "jobs": result.jobs, **result.to_dict()},
                "unverified_on_target": {"how": "replay", "built_on": None}}
        packed = pack_artifact([CacheRoot("triton", cache)], out_path, target=result.target, bake=bake,
                               layer_root=layer_root or loaded.layer_root, record=record_out,
                               fingerprint_from=serving_fingerprint(loaded, result.target, gpu_name))
        return ReplayReport(loaded.source, str(out_path), result,
                            {"manifest_digest": packed.manifest_digest, "targets": packed.targets,
                             "layer_digest": packed.manifest.layer.digest})
    except Interrupted as e:  # pack's: it says what --out holds
        if result is None or e.state.startswith("replay for"):
            raise
        shutil.rmtree(work, ignore_errors=True)
        raise Interrupted(f"replay for {result.target}: all {len(result.replayed)} entries compiled, "
                          f"then the pack was stopped (the compiled cache was removed): {e.state}") from None
    except KeyboardInterrupt:  # between the compiles and the pack
        shutil.rmtree(work, ignore_errors=True)
        done = (f"{len(result.replayed)} entries compiled for {result.target}" if result is not None
                else "stopped before anything was compiled")
        raise Interrupted(f"replay {done} (removed, nothing packed); nothing written: "
                          f"{out_path} is as it was") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(lock_fd)


def serving_fingerprint(loaded: LoadedRecord, target: str, gpu_name: str | None) -> dict:
    """What the replayed bake's fingerprint takes from the source bake rather than from this
    machine: the serving side's torch and vLLM versions (this machine's only imports the
    kernels), and the GPU name where the target is the source's (else ``--gpu-name``)."""
    source = loaded.fingerprints.get(target) or next(iter(loaded.fingerprints.values()), {})
    out = {k: source[k] for k in ("torch_version", "vllm_version") if k in source}
    name = gpu_name or (loaded.fingerprints.get(target) or {}).get("gpu_name")
    if name:
        out["gpu_name"] = name
    return out


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
