"""Fold serve-time misses into the next artifact, without a GPU.

``fold_misses(base, logs, out)`` is ``cachebake replay --base ART --misses LOG... --out ART2``:

1. merge the logs (``misses.merge``) and open the base bake (verified, as install reads it);
2. check that this machine computes the server's keys: the base fingerprint's Triton build
   (``triton_key``, version, Python tag) and ptxas must be this machine's (PREFLIGHT, exit 4);
3. extract the base layer into a scratch tree;
4. compile the logged kernel misses with the replay engine (``replay.engine.compile_record``):
   each miss's ``record`` is a ``CompileSpec`` entry, the shape a bake's compile record holds,
   so the misses are compiled exactly as ``cachebake replay`` compiles a record: in ``jobs``
   worker processes, with Triton's own file cache, for the base bake's target, under the
   same rules (this process's own environment, the recorded variables compared with it; the
   option allowlist; modules from the allowlist, which here also holds every module the base
   artifact's own compile record names).  The key Triton computes must equal the key the
   server logged, or the entry is dropped and reported (an entry under another key would never
   be read);
5. launcher helpers: the engine also builds ``cuda_utils`` and each compiled kernel's
   ``__triton_launcher`` with gcc (against a stub ``libcuda.so.1`` where there is none, as
   replay does).  A logged helper miss is reported as folded when its file is now in the cache,
   else as built on the target at first launch;
6. autotune misses: every candidate config the server benchmarked compiled there, so each is
   a kernel miss of its own and is folded by step 4.  The result the server measured on the
   target GPU travels in the log line (``timings``); it is written where Triton's autotuner
   reads it, and listed as carried from serve time.  A result the log lacks is listed as
   needing a benchmark on the target;
6b. vllm misses (torch.compile dirs, cachebake.replay.vllm_fold): planned as one ``build``
   round per logged flag set with ``--seed`` the base; the round needs vLLM and the target GPU
   (exit 7 naming what is missing, before anything is compiled; ``dry_run`` shows the plan and
   writes nothing); only the dirs the round wrote are packed, never the pod's bytes;
7. pack the scratch tree as a new artifact with the base's fingerprint, roles and layer root;
   its compile record is the base's plus the folded entries (so a later ``replay`` for another
   target compiles them too), and the bake section gains a ``folded`` entry (``inspect`` shows
   it).  Carried autotune results enter no record: a log line names the kernel's file stem,
   not the module a record needs.

A miss log is written by serving pods, which may be compromised.  Every key, kernel name and
file name a line gives passes the name rules install uses before it names anything on disk:
one path component of the characters Triton's file names use (``[A-Za-z0-9_.+-]``, not ``.``
or ``..``, at most NAME_MAX bytes), and a key is one of Triton's key dirs (52 base32 or 64 hex
characters).  A line that fails them is listed as not folded and touches nothing, not even a
``stat``.  Fold-back writes only under its scratch tree, through directory fds without
following links (cachebake.fsops); an autotune result is rewritten from its checked
values (configs without ``ir_override`` or ``pre_hook``), never copied.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cachebake.artifact.groups import GROUP_PREFIX
from cachebake.artifact.snapshot import TRITON_KEY_DIR
from cachebake.capture.keys import OPTION_RULES, ModuleAllowlist, module_name_problem
from cachebake.capture.record import RECORD_MEDIA_TYPE, CompileRecord, CompileSpec, shown
from cachebake.errors import BadInput, InvalidDocument, PreflightMismatch, Unsupported
from cachebake.fsops import DIR_FLAGS, rmtree_at, write_all
from cachebake.replay import misses as misses_mod

# Fingerprint fields that enter every kernel key this machine would compute.
KEY_FIELDS = ("triton_version", "triton_key", "python_tag", "ptxas")
# A file name from a log: the characters Triton's cache file names use (the group files'
# canonical child names, cachebake.artifact.groups), one component, within NAME_MAX.
_FILE_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,255}")
AUTOTUNE_SUFFIX = ".autotune.json"
MAX_FAILED_RECORDED = 1000
_CONFIG_FIELDS = ("kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg", "pre_hook", "ir_override")


@dataclass
class FoldReport:
    base: str
    out: str
    target: str
    base_layer_digest: str
    logs: list[str]
    layer_digest: str = ""
    manifest_digest: str = ""
    compiled: list[dict] = field(default_factory=list)  # kernel misses now in the artifact
    in_base: list[dict] = field(default_factory=list)  # logged, but the base already has them
    failed: list[dict] = field(default_factory=list)  # could not be compiled here: why
    autotune: list[dict] = field(default_factory=list)  # carried results / benchmark needed
    helpers: list[dict] = field(default_factory=list)  # logged helper misses: folded or not
    helpers_built: int = 0  # launcher helpers the engine built here (logged or not)
    problems: list[str] = field(default_factory=list)  # engine problems not tied to a miss (helper builds)
    jobs: int = 0
    # the logs' lines: how many, and how many were unreadable, foreign or malformed (skipped)
    log_lines: dict = field(default_factory=dict)
    record: dict = field(default_factory=dict)  # the new artifact's compile record, summarized
    seconds: float = 0.0
    vllm: list[dict] = field(default_factory=list)  # the vllm rounds (vllm_fold.VllmRound)
    vllm_in_base: list[dict] = field(default_factory=list)  # logged torch.compile dirs the base has
    dry_run: bool = False  # the plan only: nothing compiled, nothing written
    planned: list[dict] = field(default_factory=list)  # dry run: the kernel misses it would compile

    @property
    def ok(self) -> bool:
        return True  # partial folds are reported, not refused

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items()}

    def folded_entry(self) -> dict:
        """What the new bake records about this fold (``inspect`` shows it)."""
        return {"base_layer_digest": self.base_layer_digest, "logs": len(self.logs),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "kernels": [{k: c[k] for k in ("kernel", "key", "specialization", "count", "replicas")}
                            for c in self.compiled],
                "autotune": [{k: a[k] for k in ("kernel", "key", "result")} for a in self.autotune],
                # what could not be folded, at most MAX_FAILED_RECORDED of it: a log is the
                # serving pods' and may hold any number of refused lines (--json lists all)
                "failed": [{k: f[k] for k in ("kernel", "key", "reason")}
                           for f in self.failed[:MAX_FAILED_RECORDED]],
                "failed_total": len(self.failed),
                "helpers": [{k: h[k] for k in ("file", "folded")} for h in self.helpers],
                "vllm": [{"serve_args": r["serve_args"], "packed": r["packed"],
                          "not_reproduced": r["not_reproduced"]} for r in self.vllm]}


def check_same_compiler(base_fingerprint: dict, target: str) -> None:
    """PreflightMismatch unless this machine computes the keys the server computed."""
    from cachebake.artifact.fingerprint import current_fingerprint

    here = current_fingerprint(target).to_json()
    diff = [f"{k}: server {base_fingerprint.get(k)!r}, here {here.get(k)!r}"
            for k in KEY_FIELDS if base_fingerprint.get(k) != here.get(k)]
    if diff:
        raise PreflightMismatch(
            "the misses cannot be compiled here: this machine's Triton/ptxas is not the server's, "
            "so every key would differ:\n" + "\n".join(f"  {line}" for line in diff))


def fold_misses(base: os.PathLike | str, logs: list[str], out: os.PathLike | str, *,
                target: str | None = None, jobs: int | None = None,
                progress: Callable[[str], None] | None = None,
                allow_modules: Iterable[str] = (), dry_run: bool = False) -> FoldReport:
    """``allow_modules``: modules the logged records may name beyond the kernel packages
    cachebake bakes and the modules of the base's own compile record.  ``dry_run``: the plan
    (kernel misses, vllm rounds with their command lines), nothing compiled or written."""
    from cachebake.replay import vllm_fold

    from cachebake.artifact.pack import CacheRoot, check_out, pack_artifact, work_dir_beside
    from cachebake.artifact.reader import open_source

    started = time.monotonic()
    base, out = os.fspath(base), os.fspath(out)
    if os.path.abspath(out) == os.path.abspath(base):
        raise BadInput(f"--out {out} is the base artifact: fold into a new one")
    try:
        ModuleAllowlist(allow_modules)
    except ValueError as e:
        raise BadInput(str(e)) from None
    merged = misses_mod.merge(logs)
    source = open_source(base)
    bake = source.select(target)
    manifest = bake.manifest
    check_same_compiler(manifest.fingerprint.to_json(), bake.target)
    record = _base_record(source, bake)
    report = FoldReport(base=base, out=out, target=bake.target, base_layer_digest=bake.layer_digest,
                        logs=merged.logs,
                        log_lines={"lines": merged.lines, "unreadable": merged.unreadable,
                                   "foreign": merged.foreign, "malformed": merged.malformed,
                                   "skipped_files": merged.skipped})
    rounds, base_units = [], set()
    vllm_groups = misses_mod.misses_of(merged, "vllm")
    if vllm_groups:
        base_units = vllm_fold.layer_units(source, bake)
        rounds, report.vllm_in_base, refused = vllm_fold.plan_rounds(
            vllm_groups, base_units, manifest.bake, base, bake.target, manifest.layer_root)
        report.failed += refused
    if dry_run:
        report.dry_run = True
        report.planned = [_summary(g) for g in misses_mod.misses_of(merged, "kernel") if _names_ok(g, report)]
        for r in rounds:
            r.status = "dry-run"
        report.vllm = [r.to_dict() for r in rounds]
        report.seconds = round(time.monotonic() - started, 3)
        return report
    if rounds:
        vllm_fold.preflight(rounds)  # exit 7 before anything is compiled or written
    _writable_parent(Path(out).absolute().parent)
    check_out(out)  # before any compile: an --out in the way (a file, a link) wastes none
    # beside --out, locked while we live: what a killed fold leaves, the next pack removes
    work, lock_fd = work_dir_beside(Path(out).absolute(), "fold")
    try:
        root = work / "root"
        _extract_base(source, bake, root)
        triton_dir = root / "triton"
        triton_dir.mkdir(exist_ok=True)
        allowed = set(allow_modules) | record_modules(record)
        tfd = os.open(triton_dir, DIR_FLAGS)
        try:
            kernels = [g for g in misses_mod.misses_of(merged, "kernel") if _names_ok(g, report)]
            folded = _fold_kernels(kernels, triton_dir, tfd, report, jobs, progress, allowed)
            for g in misses_mod.misses_of(merged, "autotune"):
                if _names_ok(g, report):
                    _fold_autotune(g, tfd, report)
            report.helpers = [_helper(g, tfd) for g in misses_mod.misses_of(merged, "helper")
                              if _names_ok(g, report)]
        finally:
            os.close(tfd)
        for i, r in enumerate(rounds):
            round_art = vllm_fold.run_round(r, i, work, base, bake.target, manifest.layer_root, jobs,
                                            tuple(allowed), progress=None)
            vllm_fold.settle(r, vllm_fold.take_round_units(round_art, bake.target, base_units,
                                                           root / "vllm", work))
        report.vllm = [r.to_dict() for r in rounds]
        record.add(CompileRecord(compiles=folded))
        report.record = record.summary()
        bake_section = manifest.bake.to_json()
        bake_section["folded"] = list(bake_section.get("folded") or []) + [report.folded_entry()]
        roles = [CacheRoot(r, root / r) for r in manifest.roles if (root / r).is_dir()]
        if not any(c.role == "triton" for c in roles):
            roles.append(CacheRoot("triton", triton_dir))
        if (root / "vllm").is_dir() and not any(c.role == "vllm" for c in roles):
            roles.append(CacheRoot("vllm", root / "vllm"))
        packed = pack_artifact(roles, out, target=bake.target, bake=bake_section, record=record,
                               layer_root=manifest.layer_root, fingerprint_from=manifest.fingerprint.to_json())
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(lock_fd)
    report.layer_digest = packed.manifest.layer.digest
    report.manifest_digest = packed.manifest_digest
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _base_record(source, bake) -> CompileRecord:
    """The base bake's compile record (read through its digest), or an empty one naming this
    machine's Triton build (checked to be the server's) where the base carries none."""
    from cachebake.capture.recorder import triton_build

    desc = bake.manifest.record
    if not desc or not hasattr(source, "read_json_blob"):  # packed without one, or a bare layer
        return CompileRecord(**triton_build())
    if desc.get("mediaType") != RECORD_MEDIA_TYPE:
        raise Unsupported(f"{bake.target}'s compile record is a {desc.get('mediaType')!r}")
    return CompileRecord.from_dict(source.read_json_blob(desc))


def _writable_parent(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"--out {parent}: not writable")
    return parent


def _extract_base(source, bake, root: Path) -> None:
    """The base layer, verified and checked entry by entry exactly as install reads it."""
    from cachebake.install import extract, relocate

    limits = extract.LayerLimits.from_manifest(bake.manifest, bake.layer_size, (str(root),))
    root.parent.mkdir(parents=True, exist_ok=True)
    with source.open_layer(bake) as compressed:
        extract.extract_to(compressed, limits, root, relocate.group_rewriter(str(root)))


def record_modules(record: CompileRecord) -> set[str]:
    """The modules a bake's own compile record names (its monitor saw them compile): the
    logged misses of the same kernels may be imported from them."""
    names = {c.kernel.module for c in record.compiles} | {a.kernel.module for a in record.autotune}
    return {n for n in names if module_name_problem(n) is None}


def _summary(g) -> dict:
    return {"kernel": g.kernel, "key": g.key, "specialization": g.specialization,
            "count": g.count, "replicas": list(g.replicas)}


def file_names(g) -> list[str]:
    """The files in its key dir a miss group names: what fold-back would look up or write."""
    if g.kind == "kernel":
        return [f"{GROUP_PREFIX}{g.kernel}.json"]
    if g.kind == "autotune":
        return [f"{g.kernel}{AUTOTUNE_SUFFIX}"]
    return [g.entry.get("file", g.kernel)]


def name_problem(g) -> str | None:
    """Why a miss group's key or file names may not name anything on disk, or None."""
    if not TRITON_KEY_DIR.fullmatch(g.key):
        return f"key {shown(g.key, 80)} is not a Triton cache key (52 base32 or 64 hex characters)"
    for name in [g.kernel] + file_names(g):
        if not _FILE_NAME.fullmatch(name) or name in (".", "..") or len(name.encode()) > 255:
            return f"name {shown(name, 80)} is not a plain file name (one component of [A-Za-z0-9_.+-])"
    return None


def _names_ok(g, report: FoldReport) -> bool:
    problem = name_problem(g)
    if problem:
        report.failed.append({**_summary(g), "reason": f"refused, nothing read or written: {problem}"})
    return problem is None


def _regular_in(tfd: int, key: str, name: str) -> bool:
    """Whether ``key/name`` under the tree ``tfd`` is a regular file; no link is followed."""
    try:
        kfd = os.open(key, DIR_FLAGS, dir_fd=tfd)
    except OSError:  # absent, or not a directory (a link is refused by O_NOFOLLOW)
        return False
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=kfd, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(kfd)


def _fold_kernels(groups, triton_dir: Path, tfd: int, report: FoldReport, jobs, progress,
                  allowed: set[str]) -> list[CompileSpec]:
    """Compile the kernel misses the base lacks; the entries (as compiled here, verified) whose
    key is the one the server logged, for the new record."""
    from triton.runtime.cache import _base32

    from cachebake.replay.engine import compile_record

    queued: dict[str, tuple[CompileSpec, list]] = {}  # spec_id -> (entry, the groups that logged it)
    for g in groups:
        if _regular_in(tfd, g.key, file_names(g)[0]):
            report.in_base.append(_summary(g))
            continue
        if not g.entry.get("record"):
            why = g.entry.get("record_error", "no listener saw it")
            report.failed.append({**_summary(g), "reason": "the miss was logged without its compile "
                                  f"record ({shown(why, 200)})"})
            continue
        try:
            spec = CompileSpec.from_dict(g.entry["record"], f"the record of {g.kernel} {g.key}")
        except InvalidDocument as e:
            report.failed.append({**_summary(g), "reason": str(e)})
            continue
        if spec.target != report.target:
            report.failed.append({**_summary(g), "reason": f"missed on {shown(spec.target, 64)}, "
                                  f"the base bake is for {report.target}"})
            continue
        queued.setdefault(spec.spec_id(), (spec, []))[1].append(g)
    before = set(os.listdir(tfd))
    done: dict[str, CompileSpec] = {}
    problems: dict[str, str] = {}
    if queued:
        # One pool, this process's environment: an entry recorded under other variables is
        # refused by the workers, never compiled under the variables it names.
        res = compile_record(CompileRecord(compiles=[spec for spec, _ in queued.values()]),
                             report.target, triton_dir, jobs=jobs, progress=progress,
                             allow_modules=allowed)
        report.jobs, report.helpers_built = res.jobs, res.helpers_built
        done.update((s.spec_id(), s) for s in res.replayed)
        problems.update(res.failed)
        report.problems += [p for p in res.problems if p not in res.failed.values()]
    folded = []
    for sid, (spec, gs) in queued.items():
        got = done.get(sid)
        key = _base32(got.hash) if got is not None else None
        for g in gs:
            if got is None:
                report.failed.append({**_summary(g), "reason": problems.get(sid, "not compiled")})
            elif key != g.key:
                report.failed.append({**_summary(g), "reason": f"compiled here under key {key}, not "
                                      "the server's: the kernel's source, options or environment differ"})
            else:
                report.compiled.append(_summary(g))
        if got is not None and key in {g.key for g in gs}:
            folded.append(got)
        elif key is not None and key not in before:  # an entry no server would read: not packed
            rmtree_at(tfd, key)  # a name Triton computed here
    return folded


def _helper(g, tfd: int) -> dict:
    file = file_names(g)[0]
    return {"kernel": g.kernel, "key": g.key, "file": file,
            "folded": _regular_in(tfd, g.key, file), "replicas": list(g.replicas)}


def _fold_autotune(g, tfd: int, report: FoldReport) -> None:
    entry = {"kernel": g.kernel, "key": g.key, "tuning_key": g.entry.get("tuning_key"),
             "configs": len(g.entry.get("configs") or []), "replicas": list(g.replicas)}
    name = file_names(g)[0]
    timings = g.entry.get("timings")
    if _regular_in(tfd, g.key, name):
        entry["result"] = "in base"
    elif timings:
        try:
            checked = autotune_timings(timings)
        except ValueError as e:
            report.failed.append({**_summary(g), "reason": f"its autotune result is refused: {e}"})
            return
        # The shape Triton's Autotuner.check_disk_cache writes and reads (json.dumps: a failed
        # candidate's inf timing as Infinity, which Triton's json.load reads back).
        body = json.dumps({"key": g.entry.get("tuning_key"), "configs_timings": checked})
        _write_new(tfd, g.key, name, body.encode())
        entry["result"] = "carried"
    else:
        entry["result"] = "needs benchmark"
    report.autotune.append(entry)


def autotune_timings(timings) -> list:
    """An autotune result's ``configs_timings`` from a log line, rebuilt from checked values:
    each ``[config, timing]`` with the fields of a ``triton.Config`` and nothing else, its
    launch options within the replay's option allowlist, no ``pre_hook`` and no
    ``ir_override`` (a file of IR the server would compile in place of the kernel); kwargs of
    scalar values; a timing a number or a list of them.  ValueError says what is wrong."""
    if not isinstance(timings, list) or len(timings) > 4096:
        raise ValueError("configs_timings is not a list of [config, timing]")
    out = []
    for i, item in enumerate(timings):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], dict)):
            raise ValueError(f"configs_timings[{i}] is not a [config, timing] pair")
        config, timing = item
        extra = sorted(set(config) - set(_CONFIG_FIELDS))
        if extra:
            raise ValueError(f"configs_timings[{i}] has fields a triton.Config has not: {shown(extra, 80)}")
        for hook in ("pre_hook", "ir_override"):
            if config.get(hook) is not None:
                raise ValueError(f"configs_timings[{i}] sets {hook}")
        kwargs = config.get("kwargs", {})
        if not (isinstance(kwargs, dict) and all(
                isinstance(k, str) and (v is None or isinstance(v, (bool, int, float, str)))
                for k, v in kwargs.items())):
            raise ValueError(f"configs_timings[{i}].kwargs is not an object of scalars")
        clean = {"kwargs": dict(kwargs)}
        for name, default in (("num_warps", 4), ("num_stages", 3), ("num_ctas", 1), ("maxnreg", None)):
            value = config.get(name, default)
            problem = OPTION_RULES[name](value)
            if problem:
                raise ValueError(f"configs_timings[{i}].{name} {problem}")
            clean[name] = value
        clean.update(pre_hook=None, ir_override=None)
        out.append([clean, _timing(timing, i)])
    return out


def _timing(t, i: int):
    values = t if isinstance(t, list) else [t]
    if not 0 < len(values) <= 16:
        raise ValueError(f"configs_timings[{i}] has no timing")
    out = []
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
        elif v in ("inf", "-inf", "nan"):  # how a strict JSON writer writes non-finite floats
            out.append(float(v))
        else:
            raise ValueError(f"configs_timings[{i}] has a timing that is not a number")
    if any(math.isnan(v) for v in out):
        raise ValueError(f"configs_timings[{i}] has a NaN timing")
    return out if isinstance(t, list) else out[0]


def _write_new(tfd: int, key: str, name: str, data: bytes) -> None:
    """``key/name`` under the tree ``tfd``, created: the key dir made if absent, both opened
    relative to their parent's fd without following a link; an existing file is an error."""
    try:
        os.mkdir(key, 0o755, dir_fd=tfd)
    except FileExistsError:
        pass
    kfd = os.open(key, DIR_FLAGS, dir_fd=tfd)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644, dir_fd=kfd)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
    finally:
        os.close(kfd)
