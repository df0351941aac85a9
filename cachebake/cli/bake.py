"""``cachebake`` build and verify: run warmup rounds under the compile monitor, to bake or to check a bake."""

from __future__ import annotations

import os

import click

from cachebake.bake.rounds import DEFAULT_MAX_ROUNDS, DEFAULT_QUIET_ROUNDS
from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import ABSOLUTE_PATH, GPU_TARGET, POSITIVE_INT, SERVE_ARGS
from cachebake.cli.replay import ALLOW_MODULE_OPTION
from cachebake.errors import Interrupted, printable

_DRIVER_HELP = ("What runs one warmup round: vllm (vLLM's engine with the serve args), kernels "
                "(vLLM's Mamba2 Triton ops at the model's shapes), or command (the CMD after --). "
                "Default: -- CMD if given, else vllm where vLLM and a GPU are, else kernels where "
                "torch and vLLM's ops are.")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--model", help="Recipe name (see `cachebake recipes`) or model directory.")
@click.option("--driver", type=click.Choice(["vllm", "kernels", "command"]), help=_DRIVER_HELP)
@click.option("--tp", type=POSITIVE_INT, default=None, help="Tensor-parallel size (default: the recipe's).")
@click.option("--serve-args", "serve_args", type=SERVE_ARGS, default=None,
              help="The exact vLLM serving arguments: JSON or `vllm serve` flags (default: the recipe's).")
@click.option("--model-dir", "model_dir", default=None,
              help="vllm driver: the model reference the server passes to `vllm serve`: the "
                   "directory it serves from, or a hub id (org/name: the config goes into the "
                   "Hugging Face cache layout under HF_HOME).")
@click.option("--out", type=click.Path(), default=None,
              help="Artifact directory to write (default: ./cachebake-MODEL).")
@click.option("--root", default=None, type=click.Path(),
              help="Cache root to bake in; serve from the same path (default /var/cache/cachebake). "
                   "Must be empty unless --reuse-root.")
@click.option("--reuse-root", is_flag=True,
              help="Bake on top of the caches already under --root (they are packed too, and kept).")
@click.option("--keep-root", is_flag=True,
              help="Keep the caches under --root after packing (default: removed once they are "
                   "in the artifact, so the next build and `install --to ROOT` find it empty).")
@click.option("--target", type=GPU_TARGET, help="GPU target, e.g. sm_90 (default: the visible GPU).")
@click.option("--until-stable/--no-until-stable", default=True, show_default=True,
              help="Run rounds until --quiet-rounds rounds in a row compile nothing (exit 10 if "
                   "--max-rounds run out first); --no-until-stable runs exactly one round.")
@click.option("--quiet-rounds", type=POSITIVE_INT, default=DEFAULT_QUIET_ROUNDS, show_default=True,
              help="Consecutive rounds without a compile, autotune or helper build that make a "
                   "bake stable (recorded in the manifest).")
@click.option("--max-rounds", type=POSITIVE_INT, default=DEFAULT_MAX_ROUNDS, show_default=True,
              help="Give up (exit 10) when the bake is not stable after this many rounds.")
@click.option("--work-dir", type=click.Path(file_okay=False),
              help="Keep round logs and events here (default: a temp dir, removed at the end).")
@click.option("--allow-env", is_flag=True,
              help="Cache-invalidating variables are set on purpose: record them without warning.")
@click.option("--layer-root", type=ABSOLUTE_PATH,
              help="Absolute path the server mounts the cache at (default: the bake root).")
@click.option("--prune-ir", is_flag=True, help="Drop .ttir/.ttgir/.llir/.ptx from the layer.")
@click.option("--plan", "plan_file", type=click.Path(exists=True, dir_okay=False),
              help="--driver kernels: an engine plan file (`cachebake plan --json`), for a "
                   "builder without vLLM whose serve args have no stored plan.")
@click.option("--seed", type=click.Path(exists=True), help="An artifact or record: precompile its launches before round 1.")
@click.option("--jobs", type=POSITIVE_INT, default=None, help="Processes for --seed (default: all cores).")
@click.option("--retune", is_flag=True, help="--seed: do not carry its autotune results (benchmark afresh).")
@ALLOW_MODULE_OPTION
@click.option("--gpu-name", help="Cross-target bake: the target GPU's name, for vLLM's per-GPU config tables.")
@click.option("--image", help="Run the bake inside this (serving) image through the Docker API, "
              "so its fingerprint is the image's (needs cachebake in the image, the docker extra).")
@click.option("--gpus", default="all", show_default=True,
              help="With --image: GPUs to request (all, a count, device=0,1, none).")
@JSON_OPTION
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def build(model, driver, tp, serve_args, model_dir, out, root, reuse_root, keep_root, target, until_stable,
          quiet_rounds, max_rounds, work_dir, allow_env, layer_root, prune_ir, plan_file, seed, jobs,
          retune, allow_modules, gpu_name, image, gpus, as_json, cmd):
    """Bake: warm up until rounds stop compiling, then pack.

    Check everything, run a warmup under the compile monitor until rounds stop compiling,
    then pack the caches it filled.  `cachebake build --model nemotron-h` needs no other flag."""
    from cachebake.drivers.registry import default_out

    if allow_modules and not seed:
        raise click.UsageError("--allow-module is for --seed (the modules its record may name)")
    if image:
        if seed or jobs or retune or gpu_name or plan_file:
            raise click.UsageError("--seed, --jobs, --retune, --gpu-name and --plan do not apply with --image")
        if keep_root:
            raise click.UsageError("--keep-root does not apply with --image (the bake root is a temp "
                             "directory of the container's, removed with it)")
        _build_in_image(image, gpus, out=out or default_out(model), root=root, work_dir=work_dir,
                        model=model, driver=driver, tp=tp, serve_args=serve_args,
                        model_dir=model_dir, target=target, until_stable=until_stable,
                        quiet_rounds=quiet_rounds, max_rounds=max_rounds, reuse_root=reuse_root,
                        allow_env=allow_env, layer_root=layer_root, prune_ir=prune_ir,
                        as_json=as_json, cmd=cmd)
        return
    out_ = output(as_json)
    out = out or default_out(model)
    report = None
    try:
        from cachebake.bake.build import BuildOptions
        from cachebake.bake.build import build as run_build
        from cachebake.cli.progress import PackProgress, RoundProgress
        from cachebake.cli.render import render_build
        from cachebake.drivers.registry import make_driver
        from cachebake.roles import DEFAULT_ROOT

        drv = make_driver(driver, cmd, model=model, tp=tp, serve_args=serve_args, model_dir=model_dir,
                          plan=plan_file)
        with PackProgress(out_.err_console) as bar:
            options = BuildOptions(out=out, root=root or DEFAULT_ROOT, target=target,
                                   max_rounds=max_rounds, quiet_rounds=quiet_rounds,
                                   until_stable=until_stable, reuse_root=reuse_root, keep_root=keep_root,
                                   allow_invalidating=allow_env, work_dir=work_dir, seed=seed, jobs=jobs,
                                   gpu_name=gpu_name, retune=retune, allow_modules=tuple(allow_modules),
                                   layer_root=layer_root, prune_ir=prune_ir)
            report = run_build(drv, options, progress=RoundProgress(out_.err_console, verb="bake"),
                               warn=out_.warn, pack_progress=bar.factory)
        out_.emit(report, render=render_build)
    except KeyboardInterrupt:  # outside the rounds and the pack, which say what they left
        if report is None:
            raise Interrupted(f"the bake was stopped; nothing was packed and {os.path.abspath(out)} "
                              "is as it was") from None
        raise Interrupted(f"the bake is packed in {report.plan.out}; only its report was cut short") from None


def _build_in_image(image, gpus, *, out, root, work_dir, **build_options):
    """``build --image``: the same bake, run by the cachebake inside ``image``."""
    from cachebake.distribute.image import build_args, plan_bake_in_image, run_bake_in_image
    from cachebake.roles import DEFAULT_ROOT

    if work_dir:
        raise click.UsageError("--work-dir does not apply with --image (logs stay next to --out on failure)")
    plan = plan_bake_in_image(image, build_args(**build_options), out=out,
                              root=str(root or DEFAULT_ROOT), gpus=gpus)
    run_bake_in_image(plan)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--cache", required=True, type=click.Path(),
              help="An installed cache root (the --to DIR of install).")
@click.option("--model", help="Recipe name or model directory (for --driver kernels|vllm; default: "
              "the installed bake's, with its driver, tp, serve args and model dir).")
@click.option("--driver", type=click.Choice(["vllm", "kernels", "command"]), help=_DRIVER_HELP)
@click.option("--tp", type=POSITIVE_INT, default=None, help="Tensor-parallel size (default: the recipe's).")
@click.option("--serve-args", "serve_args", type=SERVE_ARGS, default=None,
              help="As for build: the bake's serving arguments.")
@click.option("--model-dir", "model_dir", type=click.Path(), default=None, help="As for build.")
@click.option("--work-dir", type=click.Path(file_okay=False),
              help="Keep the round log and events here (default: a temp dir, removed at the end).")
@click.option("--check-only", is_flag=True,
              help="Run no round: in the serving environment (no GPU needed), check that vLLM "
                   "would compute the bake's torch.compile hashes for the server's model and "
                   "flags (after --); exit 4 naming each factor that differs.")
@click.option("--artifact", help="--check-only: the bake's artifact (or manifest JSON), for its "
              "full record; default: what vLLM wrote into the installed tree.")
@click.option("--target", type=GPU_TARGET, help="--check-only --artifact: the GPU target's bake.")
@click.option("--model-ref", "model_ref", help="--check-only: the model string the server passes "
              "to `vllm serve` (default: the bake's).")
@JSON_OPTION
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD... | -- SERVE ARGS...]")
def verify(cache, model, driver, tp, serve_args, model_dir, work_dir, check_only, artifact, target,
           model_ref, as_json, cmd):
    """Check an installed cache: one round, exit 8 on a compile.

    Run one warmup round against an installed cache (the --to DIR of install); exit 8 on any
    compile, autotune benchmark or helper build (with --driver vllm: also when torch.compile did
    not load the baked artifact).  --check-only: no round; exit 4 when the server's vLLM would
    not use the baked torch.compile cache."""
    if check_only:
        from cachebake.verify import check_only as run_check
        from cachebake.cli.render import render_compile_check

        given = [n for n, v in (("--model", model), ("--driver", driver), ("--tp", tp),
                                ("--serve-args", serve_args), ("--model-dir", model_dir),
                                ("--work-dir", work_dir)) if v]
        if given:
            raise click.UsageError(f"{', '.join(given)}: no round runs with --check-only (give the "
                                   "server's model with --model-ref and its flags after --)")
        report = run_check(cache, artifact=artifact, target=target, model_ref=model_ref,
                           server_argv=list(cmd) if cmd else None)
        output(as_json).emit(report, render=render_compile_check)
        report.check()
        return
    if artifact or target or model_ref:
        raise click.UsageError("--artifact, --target and --model-ref are for --check-only")
    from cachebake.verify import installed_warmup, verify as run_verify
    from cachebake.cli.progress import RoundProgress
    from cachebake.cli.render import render_verify
    from cachebake.drivers.registry import make_driver

    out = output(as_json)
    if not cmd and not model and driver != "command":
        # the installed bake's own warmup, as it recorded it (options given here win)
        recorded = installed_warmup(cache)
        if recorded:
            driver = driver or recorded["driver"]
            model = recorded["model"]
            tp = tp if tp is not None else recorded.get("tp")
            serve_args = serve_args if serve_args is not None else recorded.get("serve_args")
            if driver == "vllm" and model_dir is None:
                model_dir = recorded.get("model_dir")
            out.note(printable(f"the installed bake's warmup: --driver {driver} --model {model}"
                               + (f" --model-dir {model_dir}" if model_dir else "")))
    drv = make_driver(driver, cmd, model=model, tp=tp, serve_args=serve_args, model_dir=model_dir)
    report = run_verify(drv, cache, work_dir=work_dir, progress=RoundProgress(out.err_console, verb="verify"))
    for line in report.warnings():
        out.warn(line)
    out.emit(report, render=render_verify)
    report.check()
