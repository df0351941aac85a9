"""Fold the ``vllm`` role's serve-time misses: one ``build`` round per logged flag set.

A vllm miss line (cachebake.serve.vllm_misses) names a torch.compile dir the server wrote
because it ran with flags the bake was not made for.  Its bytes stay in the pod: they are
pickles and Python, and a pod's overlay is hostile.  What fold-back packs is what a round on
the fold machine writes:

1. plan (``plan_rounds``): the logged units the base lacks, grouped by the server's serve
   flags; each group is one round of the base bake's own warmup (its recipe, tp and model dir,
   as install.json's ``warmup`` takes it) with the logged flags over its serve args,
   ``--seed BASE`` (the base's Triton entries precompiled), ``--no-until-stable`` (one round),
   the base's target and layer root.  Flags outside ``serveargs.FOLD_FLAGS`` (anything that
   loads code, names a place, a service or another model) keep that group out, named; so does
   a base that records no ``vllm``-driver warmup; a base whose own serve args are off that
   list is refused (UnsafeArtifact, exit 6: ``serveargs.carried_serve_args``);
2. preflight (``preflight``): the vllm driver's own (vLLM importable, a GPU visible, a C
   toolchain), before anything is compiled or written: exit 7 naming what is missing (the plan
   is still shown by ``replay --dry-run``);
3. the round (``run_round``): ``cachebake.bake.build.build`` in a work dir beside ``--out``;
4. pack (``take_round_units``): the round's artifact is read as install reads it (verified,
   every entry checked) and only its torch.compile dirs that the base lacks are copied into the
   fold's ``vllm`` role, beside the base's: the next bake holds both flag sets' dirs.  A logged
   dir the round did not write (its identity differs: model reference, environment, vLLM) is
   listed as not reproduced.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from cachebake.errors import Unsupported
from cachebake.serve.vllm_misses import ROLE, Unit, unit_of, units_of
from cachebake.vllm.serveargs import SERVING_ONLY_FLAGS, fold_flag_problem, serve_args_to_flags


@dataclass
class VllmRound:
    """One planned round: the logged flags, the units it should produce, how it runs."""

    serve_args: dict  # as the server logged them
    models: list[str]  # the model references the server logged
    units: list[dict] = field(default_factory=list)  # logged units the base lacks
    recipe: str = ""
    tp: int | None = None
    model_dir: str | None = None
    round_serve_args: dict = field(default_factory=dict)  # the base's serve args updated by the log
    argv: list[str] = field(default_factory=list)  # the `cachebake build` the round is
    left_out: list[str] = field(default_factory=list)  # logged serving-only flags (never applied)
    status: str = "planned"  # planned | dry-run | built
    packed: list[str] = field(default_factory=list)  # dirs the round wrote that are now packed
    not_reproduced: list[str] = field(default_factory=list)  # logged dirs the round did not write

    def to_dict(self) -> dict:
        return dict(vars(self))


def _unit_summary(g) -> dict:
    e = g.entry
    return {"unit": e.get("unit"), "dir": e.get("aot") or e.get("backend_dir"), "key": g.key,
            "kernel": g.kernel, "count": g.count, "replicas": list(g.replicas),
            "files": e.get("files"), "bytes": e.get("bytes")}


def plan_rounds(groups: list, base_units: set[Unit], bake_record, base: str, target: str,
                layer_root: str | None) -> tuple[list[VllmRound], list[dict], list[dict]]:
    """(rounds, in base, refused) for the vllm miss groups (cachebake.replay.misses)."""
    import json

    from cachebake.install.inventory import warmup_of

    warmup = warmup_of(bake_record)
    # the base's args run on this machine under every round: the base is an artifact, held to a
    # log's rules (the one allowlist); a base that fails them keeps its rounds out, named
    base_problem = base_warmup_problem(warmup)
    base_args = {k: v for k, v in (warmup.get("serve_args") or {}).items() if k not in SERVING_ONLY_FLAGS}
    rounds: dict[str, VllmRound] = {}
    in_base, refused = [], []
    for g in groups:
        summary = _unit_summary(g)
        unit = unit_of(summary["dir"] or "")
        if unit is None:  # misses.line_problem checked the shape; kept for a direct caller
            refused.append({**summary, "reason": "not a torch.compile dir name"})
            continue
        if unit in base_units:
            in_base.append(summary)
            continue
        args = g.entry.get("serve_args")
        left_out: list[str] = []
        if isinstance(args, dict):  # the server's own flags: how it was reached is no compile flag
            left_out = sorted(str(k) for k in args if k in SERVING_ONLY_FLAGS)
            args = {k: v for k, v in args.items() if k not in SERVING_ONLY_FLAGS}
        problem = fold_flag_problem(args) or base_problem
        if problem is not None:
            refused.append({**summary, "reason": f"not folded: {problem}"})
            continue
        ident = json.dumps(args, sort_keys=True)
        r = rounds.get(ident)
        if r is None:
            merged = {**base_args, **args}
            r = rounds[ident] = VllmRound(serve_args=dict(args), models=[], recipe=warmup["model"],
                                          tp=warmup.get("tp"), model_dir=warmup.get("model_dir"),
                                          round_serve_args=merged)
            r.argv = round_argv(r, base, target, layer_root)
        r.left_out = sorted(set(r.left_out) | set(left_out))
        model = g.entry.get("model")
        if isinstance(model, str) and model and model not in r.models:
            r.models.append(model)
        r.units.append(summary)
    return list(rounds.values()), in_base, refused


def base_warmup_problem(warmup: dict) -> str | None:
    """Why the base bake's own warmup may not drive a fold round (None: it may).  The base is an
    artifact, so what it records is held to a log's rules: its serve args to ``FOLD_FLAGS``
    (serving-only flags left out, as a log's are), its model dir a hub id or a normalized
    absolute path under ``MODEL_DIR_BASE`` (the round writes the model's config.json there)."""
    from cachebake.vllm.serveargs import carried_model_dir_problem

    if warmup.get("driver") != "vllm":
        return ("the base bake records no vllm-driver warmup (recipe, serve args, model dir) to run "
                "again with these flags")
    args = {k: v for k, v in (warmup.get("serve_args") or {}).items() if k not in SERVING_ONLY_FLAGS}
    problem = fold_flag_problem(args, source="an artifact")
    if problem is not None:
        return f"the base bake's own serve args: {problem}"
    problem = carried_model_dir_problem(warmup.get("model_dir"))
    if problem is not None:
        return (f"the base bake's {problem} (run the planned `cachebake build` yourself with "
                "--model-dir)")
    return None


def round_argv(r: VllmRound, base: str, target: str, layer_root: str | None) -> list[str]:
    """The `cachebake build` command line the round is (shown in the plan; run in-process)."""
    argv = ["cachebake", "build", "--model", r.recipe, "--driver", "vllm",
            "--serve-args", " ".join(serve_args_to_flags(r.round_serve_args)),
            "--seed", base, "--target", target, "--no-until-stable"]
    if r.tp is not None:
        argv += ["--tp", str(r.tp)]
    if r.model_dir:
        argv += ["--model-dir", r.model_dir]
    if layer_root:
        argv += ["--layer-root", layer_root]
    return argv


def make_round_driver(r: VllmRound):
    from cachebake.drivers.registry import make_driver

    return make_driver("vllm", None, model=r.recipe, tp=r.tp, serve_args=r.round_serve_args,
                       model_dir=r.model_dir)


def preflight(rounds: list[VllmRound]) -> None:
    """Unsupported (exit 7) naming what this machine lacks for the rounds, before any work."""
    for r in rounds:
        try:
            make_round_driver(r).preflight()
        except Unsupported as e:
            raise Unsupported(
                f"the vllm fold round ({len(r.units)} torch.compile dirs, flags "
                f"{' '.join(serve_args_to_flags(r.serve_args))}) cannot run here: {e.line()}",
                hint="run it where vLLM and the target GPU are; `replay --dry-run` shows the plan") from None


def run_round(r: VllmRound, index: int, work: Path, base: str, target: str, layer_root: str | None,
              jobs: int | None, allow_modules: tuple[str, ...], progress=None) -> Path:
    """The round itself (vLLM on the GPU): its artifact's path."""
    from cachebake.bake.build import BuildOptions, build

    out = work / f"vllm-round-{index}.art"
    options = BuildOptions(out=out, root=work / f"vllm-round-{index}-root", target=target,
                           until_stable=False, seed=base, jobs=jobs, allow_modules=allow_modules,
                           layer_root=layer_root)
    build(make_round_driver(r), options, progress=progress)
    r.status = "built"
    return out


def take_round_units(round_art: Path, target: str, base_units: set[Unit], vllm_dir: Path,
                     work: Path) -> list[str]:
    """Copy the torch.compile dirs of the round's artifact (read as install reads it) that the
    base lacks into ``vllm_dir`` (the fold's vllm role); the dirs copied, relative to it."""
    from cachebake.artifact.reader import open_source
    from cachebake.install import extract

    source = open_source(str(round_art))
    bake = source.select(target)
    tree = work / f"{round_art.name}-tree"
    limits = extract.LayerLimits.from_manifest(bake.manifest, bake.layer_size, (str(tree),))
    with source.open_layer(bake) as compressed:
        stats = extract.extract_to(compressed, limits, tree)
    prefix = ROLE + "/"
    made = units_of(name[len(prefix):] for name in stats.inventory if name.startswith(prefix))
    copied = []
    for unit in sorted(made - base_units, key=lambda u: u.rel):
        dest = vllm_dir / unit.rel
        if dest.exists():  # another round of this fold made it first
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(tree / ROLE / unit.rel, dest)  # extract wrote no links: install's checks
        copied.append(unit.rel)
    shutil.rmtree(tree, ignore_errors=True)
    return copied


def settle(r: VllmRound, packed: list[str]) -> None:
    """Which logged dirs the round reproduced."""
    r.packed = packed
    r.not_reproduced = [u["dir"] for u in r.units if u["dir"] not in packed]


def layer_units(source, bake) -> set[Unit]:
    """The base layer's torch.compile dirs, from its entries (checked, nothing written)."""
    from cachebake.install import extract

    limits = extract.LayerLimits.from_manifest(bake.manifest, bake.layer_size, ("/",))
    with source.open_layer(bake) as compressed:
        stats = extract.extract_layer(compressed, limits, None)
    prefix = ROLE + "/"
    return units_of(n[len(prefix):] for n in stats.inventory if n.startswith(prefix))
