"""Fold serve-time misses into the next artifact, without a GPU.

``fold_misses(base, logs, out)`` is ``cachebake replay --base ART --misses LOG... --out ART2``:

1. merge the logs (``misses.merge``) and open the base bake (verified, as install reads it);
2. check that this machine computes the server's keys: the base fingerprint's Triton build
   (``triton_key``, version, Python tag) and ptxas must be this machine's (PREFLIGHT, exit 4);
3. extract the base layer into a scratch tree;
4. compile the logged kernel misses with the replay engine (``replay.engine.compile_record``):
   each miss's ``record`` is a ``CompileSpec`` entry, the shape a bake's compile record holds,
   so the misses are compiled exactly as ``cachebake replay`` compiles a record: in ``jobs``
   worker processes, with Triton's own file cache, under the recorded cache-invalidating
   variables (one pool per set of them), for the base bake's target.  The key Triton computes
   must equal the key the server logged, or the entry is dropped and reported (an entry under
   another key would never be read);
5. launcher helpers: the engine also builds ``cuda_utils`` and each compiled kernel's
   ``__triton_launcher`` with gcc (against a stub ``libcuda.so.1`` where there is none, as
   replay does).  A logged helper miss is reported as folded when its file is now in the cache,
   else as built on the target at first launch;
6. autotune misses: every candidate config the server benchmarked compiled there, so each is
   a kernel miss of its own and is folded by step 4.  The result the server measured on the
   target GPU travels in the log line (``timings``); it is written where Triton's autotuner
   reads it, and listed as carried from serve time.  A result the log lacks is listed as
   needing a benchmark on the target;
7. pack the scratch tree as a new artifact with the base's fingerprint, roles and layer root;
   its compile record is the base's plus the folded entries (so a later ``replay`` for another
   target compiles them too), and the bake section gains a ``folded`` entry (``inspect`` shows
   it).  Carried autotune results enter no record: a log line names the kernel's file stem,
   not the module a record needs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cachebake.artifact.groups import GROUP_PREFIX
from cachebake.capture.record import RECORD_MEDIA_TYPE, CompileRecord, CompileSpec
from cachebake.errors import BadInput, InvalidDocument, PreflightMismatch, Unsupported
from cachebake.replay import misses as misses_mod

# Fingerprint fields that enter every kernel key this machine would compute.
KEY_FIELDS = ("triton_version", "triton_key", "python_tag", "ptxas")


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
    record: dict = field(default_factory=dict)  # the new artifact's compile record, summarized
    seconds: float = 0.0

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
                "failed": [{k: f[k] for k in ("kernel", "key", "reason")} for f in self.failed],
                "helpers": [{k: h[k] for k in ("file", "folded")} for h in self.helpers]}

    def render(self, console) -> None:
        console.print(f"folded {len(self.compiled)} kernel misses and "
                      f"{sum(a['result'] == 'carried' for a in self.autotune)} autotune results "
                      f"from {len(self.logs)} logs into [bold]{self.out}[/] ({self.target}, "
                      f"layer {self.layer_digest[:19]}; {self.helpers_built} launcher helpers "
                      f"built, {self.jobs} jobs)", highlight=False)
        for c in self.compiled:
            console.print(f"  compiled  {c['kernel']}  {c['specialization']}  "
                          f"(missed {c['count']}x on {len(c['replicas'])} replicas)", highlight=False)
        for c in self.in_base:
            console.print(f"  in base   {c['kernel']}  {c['specialization']}", highlight=False)
        for a in self.autotune:
            what = ("result carried from serve time" if a["result"] == "carried"
                    else "NEEDS A BENCHMARK on the target")
            console.print(f"  autotune  {a['kernel']}  tuning key {a['tuning_key']}: {what}",
                          highlight=False)
        for h in self.helpers:
            where = "built here" if h["folded"] else "built by gcc at first launch on the target"
            console.print(f"  helper    {h['file']}: {where}", highlight=False)
        for line in self.problems:
            console.print(f"  [yellow]problem[/] {line}", highlight=False)
        for f in self.failed:
            console.print(f"  [yellow]not folded[/] {f['kernel']} ({f['key'][:12]}): {f['reason']}",
                          highlight=False)


def check_same_compiler(base_fingerprint: dict, target: str) -> None:
    """PreflightMismatch unless this machine computes the keys the server computed."""
    from cachebake.artifact.fingerprint import current_fingerprint

    here = current_fingerprint(target).to_dict()
    diff = [f"{k}: server {base_fingerprint.get(k)!r}, here {here.get(k)!r}"
            for k in KEY_FIELDS if base_fingerprint.get(k) != here.get(k)]
    if diff:
        raise PreflightMismatch(
            "the misses cannot be compiled here: this machine's Triton/ptxas is not the server's, "
            "so every key would differ:\n" + "\n".join(f"  {line}" for line in diff))


def fold_misses(base: os.PathLike | str, logs: list[str], out: os.PathLike | str, *,
                target: str | None = None, jobs: int | None = None,
                progress: Callable[[str], None] | None = None) -> FoldReport:
    from cachebake.artifact.pack import CacheRoot, pack_artifact
    from cachebake.artifact.reader import open_source

    started = time.monotonic()
    base, out = os.fspath(base), os.fspath(out)
    if os.path.abspath(out) == os.path.abspath(base):
        raise BadInput(f"--out {out} is the base artifact: fold into a new one")
    merged = misses_mod.merge(logs)
    source = open_source(base)
    bake = source.select(target)
    manifest = bake.manifest
    check_same_compiler(manifest.fingerprint, bake.target)
    record = _base_record(source, bake)
    report = FoldReport(base=base, out=out, target=bake.target, base_layer_digest=bake.layer_digest,
                        logs=merged.logs)
    work = Path(tempfile.mkdtemp(prefix=".cachebake-fold-",
                                 dir=_writable_parent(Path(out).absolute().parent)))
    try:
        root = work / "root"
        _extract_base(source, bake, root)
        triton_dir = root / "triton"
        triton_dir.mkdir(exist_ok=True)
        folded = _fold_kernels(misses_mod.misses_of(merged, "kernel"), triton_dir, report, jobs, progress)
        for g in misses_mod.misses_of(merged, "autotune"):
            _fold_autotune(g, triton_dir, report)
        report.helpers = [_helper(g, triton_dir) for g in misses_mod.misses_of(merged, "helper")]
        record.add(CompileRecord(compiles=folded))
        report.record = record.summary()
        bake_section = dict(manifest.bake)
        bake_section["folded"] = list(bake_section.get("folded") or []) + [report.folded_entry()]
        roles = [CacheRoot(r, root / r) for r in manifest.roles if (root / r).is_dir()]
        if not any(c.role == "triton" for c in roles):
            roles.append(CacheRoot("triton", triton_dir))
        packed = pack_artifact(roles, out, target=bake.target, bake=bake_section, record=record,
                               layer_root=manifest.layer_root, fingerprint_from=manifest.fingerprint)
    finally:
        shutil.rmtree(work, ignore_errors=True)
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


def _summary(g) -> dict:
    return {"kernel": g.kernel, "key": g.key, "specialization": g.specialization,
            "count": g.count, "replicas": list(g.replicas)}


def _fold_kernels(groups, triton_dir: Path, report: FoldReport, jobs, progress) -> list[CompileSpec]:
    """Compile the kernel misses the base lacks; the entries (as compiled here, verified) whose
    key is the one the server logged, for the new record."""
    from triton.runtime.cache import _base32

    from cachebake.replay.engine import compile_record

    queued: dict[str, tuple[CompileSpec, list]] = {}  # spec_id -> (entry, the groups that logged it)
    for g in groups:
        if (triton_dir / g.key / f"{GROUP_PREFIX}{g.kernel}.json").is_file():
            report.in_base.append(_summary(g))
            continue
        if not g.entry.get("record"):
            report.failed.append({**_summary(g), "reason": "the miss was logged without its compile "
                                  "record (" + g.entry.get("record_error", "no listener saw it") + ")"})
            continue
        try:
            spec = CompileSpec.from_dict(g.entry["record"], f"the record of {g.kernel} {g.key}")
        except InvalidDocument as e:
            report.failed.append({**_summary(g), "reason": str(e)})
            continue
        if spec.target != report.target:
            report.failed.append({**_summary(g), "reason": f"missed on {spec.target}, "
                                  f"the base bake is for {report.target}"})
            continue
        queued.setdefault(spec.spec_id(), (spec, []))[1].append(g)
    before = {p.name for p in triton_dir.iterdir()}
    by_env: dict[str, list[CompileSpec]] = {}
    for spec, _ in queued.values():
        by_env.setdefault(json.dumps(spec.env_vars, sort_keys=True), []).append(spec)
    done: dict[str, CompileSpec] = {}
    problems: dict[str, str] = {}
    for specs in by_env.values():  # the engine's workers run under one set of variables each
        res = compile_record(CompileRecord(compiles=specs), report.target, triton_dir, jobs=jobs,
                             progress=progress)
        report.jobs, report.helpers_built = res.jobs, report.helpers_built + res.helpers_built
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
            shutil.rmtree(triton_dir / key, ignore_errors=True)
    return folded


def _helper(g, triton_dir: Path) -> dict:
    file = g.entry.get("file", g.kernel)
    return {"kernel": g.kernel, "key": g.key, "file": file,
            "folded": (triton_dir / g.key / file).is_file(), "replicas": list(g.replicas)}


def _fold_autotune(g, triton_dir: Path, report: FoldReport) -> None:
    entry = {"kernel": g.kernel, "key": g.key, "tuning_key": g.entry.get("tuning_key"),
             "configs": len(g.entry.get("configs") or []), "replicas": list(g.replicas)}
    target = triton_dir / g.key / f"{g.kernel}.autotune.json"
    timings = g.entry.get("timings")
    if target.is_file():
        entry["result"] = "in base"
    elif timings:
        target.parent.mkdir(parents=True, exist_ok=True)
        # The shape Triton's Autotuner.check_disk_cache writes and reads.
        target.write_text(json.dumps({"key": g.entry.get("tuning_key"), "configs_timings": timings}))
        entry["result"] = "carried"
    else:
        entry["result"] = "needs benchmark"
    report.autotune.append(entry)
