"""``cachebake`` replay and misses: compile a record for a target ahead of time, or fold serve-time misses."""

from __future__ import annotations

import os

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import ABSOLUTE_PATH, GPU_TARGET, POSITIVE_INT


def _module_names(ctx, param, values):
    from cachebake.capture.keys import module_name_problem

    for name in values:
        problem = module_name_problem(name)
        if problem:
            raise click.BadParameter(f"{name!r} {problem}")
    return tuple(values)


# Also on `build --seed` (cachebake.cli.bake).
ALLOW_MODULE_OPTION = click.option(
    "--allow-module", "allow_modules", multiple=True, metavar="NAME", callback=_module_names,
    help="A module (and its submodules) whose kernels a record may name, beyond vllm and triton; "
         "repeatable.  Records are data: any other module they name is refused, never imported.")


@main.command()
@click.argument("source", type=click.Path(), metavar="[ART|RECORD]", required=False)
@click.option("--target", type=GPU_TARGET, help="GPU target to compile for, e.g. sm_90, sm_120 (--base: "
              "which of the base's bakes, default its only one).")
@click.option("--out", required=True, type=click.Path(), help="Artifact directory to write (or add this target to).")
@click.option("--base", type=click.Path(), help="Fold serve-time misses (--misses) into a copy of this artifact.")
@click.option("--misses", multiple=True, metavar="LOG|DIR",
              help="With --base: a miss log (install --overlay) or a directory of them; repeatable.")
@click.option("--jobs", type=POSITIVE_INT, default=None, help="Compile processes (default: all cores).")
@click.option("--partial", is_flag=True, help="Pack what compiled even if some entries could not be replayed.")
@click.option("--layer-root", type=ABSOLUTE_PATH, help="Serving root for group files (default: the source bake's).")
@click.option("--gpu-name", help="The target GPU's name for the fingerprint (default: the source bake's, same target only).")
@click.option("--dry-run", is_flag=True, help="With --base: show the plan (kernel misses to compile, "
              "one vLLM build round per logged flag set, as a command line) and write nothing.")
@ALLOW_MODULE_OPTION
@JSON_OPTION
def replay(source, target, out, base, misses, jobs, partial, layer_root, gpu_name, allow_modules, dry_run,
           as_json):
    """Compile a record or served misses, no GPU needed.

    Compile a bake's compile record for TARGET on this machine (no GPU needed) and pack it;
    or, with --base ART --misses LOG..., fold a server's logged misses into a copy of ART
    (vLLM torch.compile misses: one build round with the logged flags, on a GPU; exit 7 where
    vLLM or the GPU is missing)."""
    out_ = output(as_json)
    progress = None if as_json else out_.progress
    if base or misses:
        if source:
            raise click.UsageError(f"{source}: ART|RECORD does not mix with --base/--misses (replay a "
                                   "record, or fold misses into --base ART)")
        if not (base and misses):
            raise click.UsageError("--base ART and --misses LOG|DIR go together")
        if partial or layer_root or gpu_name:
            raise click.UsageError("--partial, --layer-root and --gpu-name do not apply with --base "
                                   "(a fold keeps the base's root and fingerprint, and lists what it could not fold)")
        from cachebake.cli.render import render_fold
        from cachebake.replay.foldback import fold_misses

        report = fold_misses(base, list(misses), out, target=target, jobs=jobs, progress=progress,
                             allow_modules=allow_modules, dry_run=dry_run)
        out_.emit(report, render=render_fold)
        return
    if dry_run:
        raise click.UsageError("--dry-run is for --base ART --misses LOG (the fold's plan)")
    if not source or not target:
        raise click.UsageError("give ART|RECORD and --target, or --base ART --misses LOG|DIR")
    from cachebake.cli.render import render_replay
    from cachebake.replay.engine import replay as run_replay

    report = run_replay(source, target=target, out=out, jobs=jobs, partial=partial,
                        layer_root=layer_root, gpu_name=gpu_name, progress=progress,
                        allow_modules=allow_modules)
    out_.emit(report, render=render_replay)


@main.command("misses")
@click.argument("logs", nargs=-1, required=True, metavar="LOG|DIR...")
@click.option("--vllm-cache", type=click.Path(file_okay=False), metavar="DIR",
              help="First log the torch.compile dirs this server's VLLM_CACHE_ROOT (or a copy) "
                   "holds that the bake lacks into LOG (one file); exit 6 on a link or odd name.")
@click.option("--bake", type=click.Path(), metavar="ART",
              help="--vllm-cache: the bake's dirs from this artifact (default: the install DIR/vllm belongs to).")
@click.option("--target", type=GPU_TARGET, help="--bake: which of its bakes (default: its only one).")
@click.option("--serve-args", "serve_args", metavar="FLAGS",
              help="--vllm-cache: the server's `vllm serve` flags, logged for fold-back.")
@click.option("--model-ref", "model_ref", metavar="REF",
              help="--vllm-cache: the model the server passed to `vllm serve`.")
@JSON_OPTION
def misses_cmd(logs, vllm_cache, bake, target, serve_args, model_ref, as_json):
    """Merge the serve-time miss logs of many replicas.

    Logs of install --overlay; misses per kernel and
    specialization (and vLLM torch.compile dir), replicas, first and last seen, count."""
    from cachebake.cli.render import render_misses
    from cachebake.replay.misses import merge, record_vllm_cache

    recorded = None
    if serve_args is not None:  # a value of the wrong form: a usage error, before any scan
        from cachebake.errors import BadInput
        from cachebake.vllm.serveargs import parse_serve_args

        try:
            parse_serve_args(serve_args)
        except BadInput as e:
            raise click.BadParameter(str(e), param_hint="--serve-args") from None
    if vllm_cache:
        if len(logs) != 1 or os.path.isdir(logs[0]):
            raise click.UsageError("--vllm-cache appends to one LOG file: give exactly one")
        recorded = record_vllm_cache(vllm_cache, logs[0], bake=bake, target=target,
                                     serve_args=serve_args, model=model_ref)
    elif bake or target or serve_args or model_ref:
        raise click.UsageError("--bake, --target, --serve-args and --model-ref are for --vllm-cache")
    report = merge(list(logs))
    if recorded is not None:
        report.recorded = recorded.to_dict()
    output(as_json).emit(report, render=render_misses)
