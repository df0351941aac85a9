"""Fold serve-time misses into the next artifact, without a GPU.

``fold_misses(base, logs, out)`` is ``cachebake replay --base ART --misses LOG... --out ART2``:

1. merge the logs (``misses.merge``) and open the base bake (verified, as install reads it);
2. check that this machine computes the server's keys: the base fingerprint's Triton build
   (``triton_key``, version, Python tag) and ptxas must be this machine's (PREFLIGHT, exit 4);
3. extract the base layer into a scratch tree;
4. compile each logged kernel miss from its record (``compile_record.decode``) into the
   scratch Triton cache, for the recorded target, with the recorded cache-invalidating
   variables; the key Triton computes must equal the key the server logged, or the entry is
   dropped and reported (an entry under another key would never be read);
5. autotune misses: every candidate config the server benchmarked compiled there, so each is
   a kernel miss of its own and is folded by step 4.  The result the server measured on the
   target GPU travels in the log line (``timings``); it is written where Triton's autotuner
   reads it, and listed as carried from serve time.  A result the log lacks is listed as
   needing a benchmark on the target;
6. pack the scratch tree as a new artifact with the base's fingerprint, roles and layer root,
   and a ``folded`` entry in the bake section (``inspect`` shows it).

Launcher helpers (``cuda_utils``, ``__triton_launcher``) are listed, not built: gcc links
them against the target machine's libcuda, which a CPU builder does not have.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cachebake.errors import BadInput, PreflightMismatch
from cachebake.runtime import misses as misses_mod
from cachebake.runtime.compile_record import NotReplayable

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
    helpers: list[dict] = field(default_factory=list)  # built on the target at first launch
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
                "helpers": [h["file"] for h in self.helpers]}

    def render(self, console) -> None:
        console.print(f"folded {len(self.compiled)} kernel misses and "
                      f"{sum(a['result'] == 'carried' for a in self.autotune)} autotune results "
                      f"from {len(self.logs)} logs into [bold]{self.out}[/] ({self.target}, "
                      f"layer {self.layer_digest[:19]})", highlight=False)
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
            console.print(f"  helper    {h['file']}: built by gcc at first launch on the target",
                          highlight=False)
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
                target: str | None = None) -> FoldReport:
    from cachebake.artifact.pack import CacheRoot, pack_artifact
    from cachebake.install.source import open_source

    started = time.monotonic()
    base, out = os.fspath(base), os.fspath(out)
    if os.path.abspath(out) == os.path.abspath(base):
        raise BadInput(f"--out {out} is the base artifact: fold into a new one")
    merged = misses_mod.merge(logs)
    source = open_source(base)
    bake = source.select(target)
    manifest = bake.manifest
    check_same_compiler(manifest.fingerprint, bake.target)
    report = FoldReport(base=base, out=out, target=bake.target, base_layer_digest=bake.layer_digest,
                        logs=merged.logs)
    work = Path(tempfile.mkdtemp(prefix=".cachebake-fold-",
                                 dir=_writable_parent(Path(out).absolute().parent)))
    try:
        root = work / "root"
        _extract_base(source, bake, root)
        triton_dir = root / "triton"
        triton_dir.mkdir(exist_ok=True)
        for g in misses_mod.misses_of(merged, "kernel"):
            _fold_kernel(g, triton_dir, report)
        for g in misses_mod.misses_of(merged, "autotune"):
            _fold_autotune(g, triton_dir, report)
        report.helpers = [{"kernel": g.kernel, "key": g.key, "file": g.entry.get("file", g.kernel)}
                          for g in misses_mod.misses_of(merged, "helper")]
        bake_section = dict(manifest.bake)
        bake_section["folded"] = list(bake_section.get("folded") or []) + [report.folded_entry()]
        roles = [CacheRoot(r, root / r) for r in manifest.roles if (root / r).is_dir()]
        if not any(c.role == "triton" for c in roles):
            roles.append(CacheRoot("triton", triton_dir))
        packed = pack_artifact(roles, out, target=bake.target, bake=bake_section,
                               layer_root=manifest.layer_root, fingerprint_from=manifest.fingerprint)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.layer_digest = packed.manifest.layer.digest
    report.manifest_digest = packed.manifest_digest
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _writable_parent(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"--out {parent}: not writable")
    return parent


def _extract_base(source, bake, root: Path) -> None:
    """The base layer, verified and checked entry by entry exactly as install reads it."""
    from cachebake.install import extract, relocate

    limits = extract.LayerLimits.from_manifest(bake.manifest.to_dict(), bake.layer_size)
    with source.open_layer(bake) as compressed:
        layer = extract.load_layer(compressed, limits, relocate.group_rewriter(str(root)))
    root.mkdir(parents=True)
    extract.extract_layer(layer, str(root))


def _summary(g) -> dict:
    return {"kernel": g.kernel, "key": g.key, "specialization": g.specialization,
            "count": g.count, "replicas": list(g.replicas)}


def _fold_kernel(g, triton_dir: Path, report: FoldReport) -> None:
    key_dir = triton_dir / g.key
    if (key_dir / f"__grp__{g.kernel}.json").is_file():
        report.in_base.append(_summary(g))
        return
    record = g.entry.get("record")
    if not record:
        report.failed.append({**_summary(g), "reason": "the miss was logged without its compile "
                              "record (" + g.entry.get("record_error", "no listener saw it") + ")"})
        return
    if record.get("target") != report.target:
        report.failed.append({**_summary(g), "reason": f"missed on {record.get('target')}, "
                              f"the base bake is for {report.target}"})
        return
    try:
        key = _compile(record, triton_dir)
    except NotReplayable as e:
        report.failed.append({**_summary(g), "reason": str(e)})
        return
    except Exception as e:  # a compile error of the user's kernel: report it, fold the rest
        report.failed.append({**_summary(g), "reason": f"compile failed: {type(e).__name__}: {e}"})
        return
    if key != g.key:
        shutil.rmtree(triton_dir / key, ignore_errors=True)
        report.failed.append({**_summary(g), "reason": f"compiled here under key {key}, not the "
                              "server's: the kernel's source, options or environment differ"})
        return
    report.compiled.append(_summary(g))


def _compile(record: dict, triton_dir: Path) -> str:
    """Compile one record into ``triton_dir`` with Triton's own file cache; the key dir."""
    import triton
    from triton import knobs
    from triton.runtime.cache import FileCacheManager, _base32

    from cachebake.runtime import compile_record

    src, target, options, env_vars = compile_record.decode(record)
    with _triton_cache(knobs, str(triton_dir), FileCacheManager), _environ(env_vars):
        kernel = triton.compile(src, target=target, options=options, _env_vars=env_vars)
    return _base32(kernel.hash)


@contextlib.contextmanager
def _triton_cache(knobs, cache_dir: str, manager):
    """Point Triton's file cache at ``cache_dir`` with its own manager for the duration (this
    process may itself run under TRITON_CACHE_MANAGER=layered); Triton's ``scope`` restores
    both knobs and the variables behind them."""
    with knobs.cache.scope():
        knobs.cache.dir = cache_dir
        knobs.cache.manager_class = manager
        yield


@contextlib.contextmanager
def _environ(env_vars: dict):
    """The server's cache-invalidating variables, set while compiling (they steer option
    defaults such as fp fusion, not only the key)."""
    saved = {k: os.environ.get(k) for k in env_vars}
    os.environ.update({k: str(v) for k, v in env_vars.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _fold_autotune(g, triton_dir: Path, report: FoldReport) -> None:
    import json

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
