"""The ``cachebake`` command line: parse, call one function, emit its report.  No logic here.

Every command builds a report (a dataclass with ``to_dict()``) and hands it to
``output(as_json).emit(report, render=...)``: rich text for people, one JSON envelope for
scripts (cachebake.output).  Option values are checked by click parameter types while parsing
(cachebake.params).  Every refusal is a CachebakeError: one line on stderr, the exit code README
documents (``CachebakeGroup.main`` is the one handler; see cachebake.errors for the rules).

Light commands stay light: ``pack``, ``inspect``, ``install``, ``fingerprint``, ``recipes``
and ``serve-args`` import neither torch nor vllm (tests/test_cli_imports.py holds them to it).
"""

from __future__ import annotations

import os
import sys

import click

from cachebake.errors import (CachebakeError, ExitCode, Interrupted, UsageError, from_os_error,
                              missing_dependency, write_crash_log)
from cachebake.output import Output, envelope
from cachebake.params import (ABSOLUTE_PATH, GPU_TARGET, NON_NEGATIVE_SECONDS, POSITIVE_INT,
                              ROLE_DIR, SERVE_ARGS)
from cachebake.rounds import DEFAULT_MAX_ROUNDS, DEFAULT_QUIET_ROUNDS


# click >= 8.2 raises this for a command given no arguments at all (it shows the help)
_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())


class CachebakeGroup(click.Group):
    """The one error boundary (cachebake.errors): every exception becomes one line on stderr
    and a documented exit code; under ``--json`` the error is also the JSON envelope on
    stdout.  Never a traceback: an unexpected exception's traceback goes to a log file whose
    path the one line names."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        options = args[:args.index("--")] if "--" in args else args
        command = next((a for a in options if not a.startswith("-")), "")
        out = Output(command, as_json="--json" in options)
        try:
            code = super().main(args=args, prog_name=prog_name or "cachebake",
                                complete_var=complete_var, standalone_mode=False, obj=out, **extra)
        except click.exceptions.Exit as e:  # --help, --version
            code = e.exit_code
        except _NoArgsIsHelp as e:  # bare `cachebake` or `cachebake pack`: the help, as click
            e.show()
            code = e.exit_code
        except click.ClickException as e:  # bad options: click's message, one line, exit 2
            hint = f"see `cachebake {command} --help`" if command in self.commands else \
                "see `cachebake --help`"
            message = " ".join(e.format_message().split()).rstrip(".")
            out.error(UsageError(message, ExitCode(e.exit_code), hint=hint))
            code = e.exit_code
        except (click.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            out.error(Interrupted())
            code = int(ExitCode.INTERRUPTED)
        except CachebakeError as e:
            out.error(e)
            code = int(e.code)
        except OSError as e:
            # An OS refusal we did not foresee (disk full, permissions on a path we did not
            # check): still one line naming the path, never a traceback.
            out.error(from_os_error(e, what="", error_class=CachebakeError))
            code = int(ExitCode.FAILURE)
        except Exception as e:  # noqa: BLE001 - the boundary: a bug, reported in one line
            error = missing_dependency(e) if isinstance(e, ModuleNotFoundError) else None
            if error is None:
                log = write_crash_log(e)
                error = CachebakeError(f"internal error: {type(e).__name__}: {e}"
                                       + (f" (traceback in {log})" if log else ""))
            out.error(error)
            code = int(error.code)
        code = code if isinstance(code, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


@click.group(cls=CachebakeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cachebake")
def main():
    """Bake Triton kernels and autotune results for a vLLM deployment at image-build time."""


def output(as_json: bool = False) -> Output:
    """The boundary's Output for this invocation (one per command run, so an error after a
    report was emitted does not print a second JSON document)."""
    ctx = click.get_current_context(silent=True)
    out = ctx.find_object(Output) if ctx is not None else None
    if out is None:
        out = Output(ctx.info_name if ctx is not None else "", as_json)
    out.as_json = out.as_json or as_json
    return out


JSON_OPTION = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON object (the cachebake envelope) on stdout.")


@main.command()
@click.argument("roots", nargs=-1, required=True, type=ROLE_DIR, metavar="[ROLE=]CACHE_DIR...")
@click.option("--out", "out", required=True, type=click.Path(),
              help="Artifact directory (an OCI image layout); an existing artifact gains this "
                   "target, or has this target's bake replaced.")
@click.option("--target", type=GPU_TARGET,
              help="GPU target, e.g. sm_90; must match the cache's kernels (default: theirs, "
                   "else the visible GPU).")
@click.option("--layer-root", type=ABSOLUTE_PATH,
              help="Absolute path the server mounts the cache at (default /var/cache/cachebake).")
@click.option("--prune-ir", is_flag=True, help="Drop .ttir/.ttgir/.llir/.ptx: ~3x smaller, kernels still hit.")
@JSON_OPTION
def pack(roots, out, target, layer_root, prune_ir, as_json):
    """Pack cache directories (triton=, vllm=, flashinfer=, inductor=) into an artifact."""
    from cachebake.artifact.pack import pack_artifact
    from cachebake.progress import PackProgress
    from cachebake.render import render_pack

    with PackProgress() as bar:
        report = pack_artifact(list(roots), out, target=target, layer_root=layer_root,
                               prune_ir=prune_ir, progress=bar.factory)
    output(as_json).emit(report, render=render_pack)


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--target", type=GPU_TARGET, help="Show (and verify) only this GPU target's bake.")
@JSON_OPTION
def inspect(artifact, target, as_json):
    """Verify every blob of ARTIFACT and show its fingerprint, kernel inventory, sizes and
    digests.  ARTIFACT: an artifact dir, an OCI layout, or a .tar.zst layer with its
    cachebake.json beside it."""
    from cachebake.inspect import inspect_artifact
    from cachebake.render import render_inspect

    output(as_json).emit(inspect_artifact(artifact, target), render=render_inspect)


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
@click.option("--model-dir", "model_dir", type=click.Path(), default=None,
              help="vllm driver: where the model config goes; use the path the server will use.")
@click.option("--out", type=click.Path(), default=None,
              help="Artifact directory to write (default: ./cachebake-MODEL).")
@click.option("--root", default=None, type=click.Path(),
              help="Cache root to bake in; serve from the same path (default /var/cache/cachebake). "
                   "Must be empty unless --reuse-root.")
@click.option("--reuse-root", is_flag=True,
              help="Bake on top of the caches already under --root (they are packed too).")
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
@click.option("--gpu-name", help="Cross-target bake: the target GPU's name, for vLLM's per-GPU config tables.")
@click.option("--image", help="Run the bake inside this (serving) image through the Docker API, "
              "so its fingerprint is the image's (needs cachebake in the image, the docker extra).")
@click.option("--gpus", default="all", show_default=True,
              help="With --image: GPUs to request (all, a count, device=0,1, none).")
@JSON_OPTION
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def build(model, driver, tp, serve_args, model_dir, out, root, reuse_root, target, until_stable,
          quiet_rounds, max_rounds, work_dir, allow_env, layer_root, prune_ir, plan_file, seed, jobs,
          retune, gpu_name, image, gpus, as_json, cmd):
    """Check everything, run a warmup under the compile monitor until rounds stop compiling,
    then pack the caches it filled.  `cachebake build --model nemotron-h` needs no other flag."""
    from cachebake.drivers.command import default_out

    if image:
        if seed or jobs or retune or gpu_name or plan_file:
            from cachebake.errors import BadInput

            raise BadInput("--seed, --jobs, --retune, --gpu-name and --plan do not apply with --image")
        _build_in_image(image, gpus, out=out or default_out(model), root=root, work_dir=work_dir,
                        model=model, driver=driver, tp=tp, serve_args=serve_args,
                        model_dir=model_dir, target=target, until_stable=until_stable,
                        quiet_rounds=quiet_rounds, max_rounds=max_rounds, reuse_root=reuse_root,
                        allow_env=allow_env, layer_root=layer_root, prune_ir=prune_ir,
                        as_json=as_json, cmd=cmd)
        return
    from cachebake.build import build as run_build
    from cachebake.drivers.command import make_driver
    from cachebake.progress import PackProgress, RoundProgress
    from cachebake.render import render_build
    from cachebake.roles import DEFAULT_ROOT

    out_ = output(as_json)
    drv = make_driver(driver, cmd, model=model, tp=tp, serve_args=serve_args, model_dir=model_dir,
                      plan=plan_file)
    with PackProgress() as bar:
        report = run_build(drv, out=out or default_out(model), root=root or DEFAULT_ROOT,
                           target=target, max_rounds=max_rounds, quiet_rounds=quiet_rounds,
                           until_stable=until_stable, reuse_root=reuse_root,
                           allow_invalidating=allow_env, work_dir=work_dir,
                           progress=RoundProgress(verb="bake"), warn=out_.warn,
                           layer_root=layer_root, prune_ir=prune_ir, pack_progress=bar.factory,
                           seed=seed, jobs=jobs, gpu_name=gpu_name, retune=retune)
    out_.emit(report, render=render_build)


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
@JSON_OPTION
def replay(source, target, out, base, misses, jobs, partial, layer_root, gpu_name, as_json):
    """Compile a bake's compile record for TARGET on this machine (no GPU needed) and pack it;
    or, with --base ART --misses LOG..., fold a server's logged misses into a copy of ART."""
    from cachebake.replay.engine import stderr_progress

    progress = None if as_json else stderr_progress
    if base or misses:
        if source:
            raise click.UsageError(f"{source}: ART|RECORD does not mix with --base/--misses (replay a "
                                   "record, or fold misses into --base ART)")
        if not (base and misses):
            raise click.UsageError("--base ART and --misses LOG|DIR go together")
        if partial or layer_root or gpu_name:
            raise click.UsageError("--partial, --layer-root and --gpu-name do not apply with --base "
                                   "(a fold keeps the base's root and fingerprint, and lists what it could not fold)")
        from cachebake.runtime.foldback import fold_misses

        output(as_json).emit(fold_misses(base, list(misses), out, target=target, jobs=jobs, progress=progress))
        return
    if not source or not target:
        raise click.UsageError("give ART|RECORD and --target, or --base ART --misses LOG|DIR")
    from cachebake.replay.engine import replay as run_replay

    report = run_replay(source, target=target, out=out, jobs=jobs, partial=partial,
                        layer_root=layer_root, gpu_name=gpu_name, progress=progress)
    output(as_json).emit(report)


def _build_in_image(image, gpus, *, out, root, work_dir, **build_options):
    """``build --image``: the same bake, run by the cachebake inside ``image``."""
    from cachebake.distribute.image import build_args, plan_bake_in_image, run_bake_in_image
    from cachebake.errors import BadInput
    from cachebake.roles import DEFAULT_ROOT

    if work_dir:
        raise BadInput("--work-dir does not apply with --image (logs stay next to --out on failure)")
    plan = plan_bake_in_image(image, build_args(**build_options), out=out,
                              root=str(root or DEFAULT_ROOT), gpus=gpus)
    run_bake_in_image(plan)


@main.command("image")
@click.argument("artifact", type=click.Path())
@click.option("--tag", required=True, help="Image name to build, e.g. registry.example/bakes/nemotron:sm_90.")
@click.option("--target", type=GPU_TARGET, help="The GPU target's bake to use (default: the only one).")
@click.option("--root", type=ABSOLUTE_PATH, help="Where the tree sits in the image (default: the bake's serving root).")
@click.option("--push", is_flag=True, help="Push the image through the daemon after building it.")
@JSON_OPTION
def image_cmd(artifact, tag, target, root, push, as_json):
    """Build the cache image in a Docker daemon: FROM scratch, ARTIFACT installed at the serving
    root, for `COPY --from=TAG /var/cache/cachebake /var/cache/cachebake` in a serving Dockerfile."""
    from cachebake.distribute.image import build_cache_image

    output(as_json).emit(build_cache_image(artifact, tag, target=target, root=root, push=push))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--cache", required=True, type=click.Path(),
              help="An installed cache root (the --to DIR of install).")
@click.option("--model", help="Recipe name or model directory (for --driver kernels|vllm).")
@click.option("--driver", type=click.Choice(["vllm", "kernels", "command"]), help=_DRIVER_HELP)
@click.option("--tp", type=POSITIVE_INT, default=None, help="Tensor-parallel size (default: the recipe's).")
@click.option("--serve-args", "serve_args", type=SERVE_ARGS, default=None,
              help="As for build: the bake's serving arguments.")
@click.option("--model-dir", "model_dir", type=click.Path(), default=None, help="As for build.")
@click.option("--work-dir", type=click.Path(file_okay=False),
              help="Keep the round log and events here (default: a temp dir, removed at the end).")
@JSON_OPTION
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def verify(cache, model, driver, tp, serve_args, model_dir, work_dir, as_json, cmd):
    """Run one warmup round against an installed cache; exit 8 on any compile or benchmark."""
    from cachebake.drivers.command import make_driver
    from cachebake.progress import RoundProgress
    from cachebake.render import render_verify
    from cachebake.verify import verify as run_verify

    drv = make_driver(driver, cmd, model=model, tp=tp, serve_args=serve_args, model_dir=model_dir)
    report = run_verify(drv, cache, work_dir=work_dir, progress=RoundProgress(verb="verify"))
    out = output(as_json)
    for line in report.warnings():
        out.warn(line)
    out.emit(report, render=render_verify)
    report.check()


@main.command("recipes")
@JSON_OPTION
def recipes_cmd(as_json):
    """List the model recipes: variants, architecture, Mamba shapes, default serve args."""
    from cachebake.recipes import list_recipes
    from cachebake.render import render_recipes
    from cachebake.reports import RecipesReport

    output(as_json).emit(RecipesReport(list_recipes()), render=render_recipes)


@main.command("plan")
@click.option("--model", default="nemotron-h", show_default=True,
              help="Recipe (name[:variant]), model directory or config.json.")
@click.option("--serve-args", "serve_args", default=None,
              help="The exact vLLM serving arguments: JSON or `vllm serve` flags (default: the recipe's).")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size (default: the serve args').")
@click.option("--gpu-memory", "gpu_memory", default=None,
              help="GPU memory in GiB or a class (h200, h100; default h200).")
@click.option("--stored", is_flag=True, help="Only the stored plan (never compute; no vllm needed).")
@click.option("--json", "as_json", is_flag=True, help="Print the report (with the whole plan) as JSON.")
def plan_cmd(model, serve_args, tp, gpu_memory, stored, as_json):
    """What vLLM's engine will hand its Mamba2 kernels: block and page sizes, state views,
    block table, CUDA-graph sizes, warm-up batch (computed with vllm, CPU is enough)."""
    from cachebake.plan.report import make_plan_report

    output(as_json).emit(make_plan_report(model, tp, serve_args, gpu_memory, stored_only=stored))


@main.command("serve-args")
@click.argument("artifact", type=click.Path())
@click.option("--target", type=GPU_TARGET, help="GPU target whose bake to read (default: the only one).")
@click.option("--root", type=ABSOLUTE_PATH,
              help="Where the artifact is installed (install --to DIR); default: the bake root.")
@click.option("--overlay", type=ABSOLUTE_PATH, default=None,
              help="Writable dir for kernels the bake lacks (as for install --overlay).")
@JSON_OPTION
def serve_args_cmd(artifact, target, root, overlay, as_json):
    """Print the `vllm serve` command and environment that match ARTIFACT's bake."""
    from cachebake.render import render_serve_command
    from cachebake.serving import read_manifest, serve_command

    manifest = read_manifest(artifact, target)
    cmd = serve_command(manifest, root=root)
    if overlay is not None:
        from cachebake.runtime import serving_overlay_env

        baked = cmd.env.get("TRITON_CACHE_DIR")  # <root>/triton
        cmd.env.update(serving_overlay_env(overlay, os.path.dirname(baked) if baked else None,
                                           manifest.get("roles") or ["triton"]))
    output(as_json).emit(cmd, render=render_serve_command)


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--to", "to", required=True, type=click.Path(file_okay=False),
              help="Directory to install into (created if missing; usually a volume).")
@click.option("--target", type=GPU_TARGET, help="GPU target, e.g. sm_90 (default: the serving GPU's).")
@click.option("--fingerprint", "fingerprint_file", type=click.Path(dir_okay=False),
              help="The serving environment's fingerprint (`cachebake fingerprint --out`), "
                   "checked instead of this process's.")
@click.option("--serve-at", type=ABSOLUTE_PATH,
              help="Absolute path the server sees DIR at, if the volume is mounted elsewhere there.")
@click.option("--allow-mismatch", is_flag=True, help="Install despite preflight differences (warns).")
@click.option("--lock-timeout", default=600.0, show_default=True, type=NON_NEGATIVE_SECONDS,
              help="Seconds to wait for another install into DIR before giving up (exit 11).")
@click.option("--overlay", type=ABSOLUTE_PATH, default=None,
              help="Writable dir in the server (emptyDir, /tmp) for kernels the bake lacks: the env "
                   "turns on the layered cache manager and the miss log there.")
@click.option("--tls-verify/--no-tls-verify", default=None,
              help="ARTIFACT docker://...: require HTTPS (default: yes, except loopback registries).")
@click.option("--authfile", type=click.Path(dir_okay=False),
              help="ARTIFACT docker://...: registry credentials (docker config.json format).")
@click.option("--check-only", is_flag=True,
              help="Run every check (the whole layer too) and report what an install would do; write nothing.")
@click.option("--sync/--no-sync", default=True, show_default=True,
              help="Flush the new tree to disk before switching to it. --no-sync where DIR dies with a "
                   "crash of its machine or install runs before every start (an init container's "
                   "emptyDir, a Dockerfile RUN): a crash's damage is repaired by the next install.")
@JSON_OPTION
def install(artifact, to, target, fingerprint_file, serve_at, allow_mismatch, lock_timeout, overlay,
            tls_verify, authfile, check_only, sync, as_json):
    """Preflight, verify and safely, atomically install ARTIFACT into DIR; idempotent.
    ARTIFACT may be a registry reference, docker://HOST/REPO[:TAG] (or oci://...)."""
    from cachebake.distribute import registry
    from cachebake.install import install_artifact
    from cachebake.render import render_install

    out = output(as_json)
    options = dict(target=target, fingerprint_file=fingerprint_file, allow_mismatch=allow_mismatch,
                   serve_at=serve_at, lock_timeout=lock_timeout, overlay=overlay,
                   check_only=check_only, sync=sync)
    if registry.is_reference(artifact):
        report = registry.install_reference(
            artifact, to, options=registry.RegistryOptions(tls_verify, authfile), **options)
    else:
        report = install_artifact(artifact, to, **options)
    for line in report.mismatches:
        out.warn(f"{line} (installed anyway: --allow-mismatch)")
    for line in report.warnings:
        out.warn(line)
    out.emit(report, render=render_install)


@main.command()
@click.argument("artifact", type=click.Path())
@click.argument("reference")
@click.option("--target", type=GPU_TARGET, help="Push only this GPU target's bake (needed when REFERENCE has a tag "
              "and the artifact holds several).")
@click.option("--tls-verify/--no-tls-verify", default=None,
              help="Require HTTPS (default: yes, except loopback registries).")
@click.option("--authfile", type=click.Path(dir_okay=False),
              help="Registry credentials (docker config.json format; default: skopeo's search).")
@JSON_OPTION
def push(artifact, reference, target, tls_verify, authfile, as_json):
    """Push ARTIFACT's bakes to a registry: REFERENCE is docker://HOST/REPO[:TAG] (no tag: one
    tag per GPU target, e.g. :sm_90)."""
    from cachebake.distribute.registry import RegistryOptions, push_artifact

    report = push_artifact(artifact, reference, target=target,
                           options=RegistryOptions(tls_verify, authfile))
    output(as_json).emit(report)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--artifact", required=True,
              help="The bake: docker://HOST/REPO[:TAG|@DIGEST] as `cachebake push` printed it "
                   "(init: also a path inside the installer image).")
@click.option("--serving-image", required=True, help="The vLLM serving image.")
@click.option("--pattern", type=click.Choice(["init", "image-volume"]), default="init", show_default=True)
@click.option("--target", type=GPU_TARGET, required=True, help="GPU target of the bake, e.g. sm_90.")
@click.option("--installer-image", help="init: the installer image (docker/installer.Dockerfile).")
@click.option("--install-in-serving-image", is_flag=True,
              help="init: run the install in the serving image (needs cachebake there).")
@click.option("--model", help="Serve this recipe with `vllm serve` and the recipe's flags.")
@click.option("--name", default="vllm", show_default=True, help="Deployment/Pod and container name.")
@click.option("--root", type=ABSOLUTE_PATH, default=None, help="Where the server reads the cache (default /var/cache/cachebake).")
@click.option("--gpus", type=click.IntRange(min=0), default=1, show_default=True, help="nvidia.com/gpu limit of the server.")
@click.option("--kind", type=click.Choice(["deployment", "pod"]), default="deployment", show_default=True)
@click.option("--pull-secret", help="dockerconfigjson Secret: image pulls and the installer's registry login.")
@click.option("--tls-verify/--no-tls-verify", default=None,
              help="init: the installer's registry TLS (default: yes, except loopback registries).")
@click.option("--vllm-role/--no-vllm-role", default=True, show_default=True,
              help="image-volume: the bake has a vllm role, copied to a writable emptyDir at ROOT/vllm "
                   "(the image's roles are not visible here; `cachebake inspect` lists them).")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@JSON_OPTION
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def k8s(artifact, serving_image, pattern, target, installer_image, install_in_serving_image, model,
        name, root, gpus, kind, pull_secret, tls_verify, vllm_role, fmt, as_json, cmd):
    """Kubernetes manifests that give a vLLM server its bake: an init container filling an
    emptyDir, or (Kubernetes >= 1.35) the bake image mounted as a read-only image volume."""
    from cachebake.distribute.k8s import ManifestReport, PodPlan, manifest, render, server_command
    from cachebake.roles import DEFAULT_ROOT

    plan = PodPlan(artifact=artifact, serving_image=serving_image, pattern=pattern, target=target,
                   installer_image=installer_image, install_in_serving_image=install_in_serving_image,
                   name=name, root=str(root or DEFAULT_ROOT), command=server_command(model, cmd),
                   gpus=gpus, kind=kind, pull_secret=pull_secret, tls_verify=tls_verify,
                   vllm_role=vllm_role)
    doc, notes = manifest(plan)
    output(as_json).emit(ManifestReport(render(doc, notes, fmt), doc, notes))
    for note in notes:
        click.echo(f"cachebake: note: {note}", err=True)


@main.command()
@click.option("--target", type=GPU_TARGET, help="GPU target, e.g. sm_90 (default: the visible GPU).")
@click.option("--out", type=click.Path(dir_okay=False),
              help="Also write the fingerprint document (as --json prints it) to this file.")
@click.option("--gpu-from-torch", is_flag=True,
              help="When nvidia-smi and NVML find no GPU, ask torch (through Triton's driver); "
                   "imports torch, seconds.")
@JSON_OPTION
def fingerprint(target, out, gpu_from_torch, as_json):
    """Show this environment's fingerprint; write it (--out) in the serving image at build time
    and give the file to `cachebake install --fingerprint` (an init container is not the server)."""
    from cachebake.artifact.fingerprint import current_fingerprint
    from cachebake.render import render_fingerprint
    from cachebake.reports import FingerprintReport

    report = FingerprintReport(current_fingerprint(target, allow_torch=gpu_from_torch))
    if out is not None:
        report.out = os.path.abspath(out)
        _write_document(report.out, envelope("fingerprint", True, report.to_dict()))
    output(as_json).emit(report, render=render_fingerprint)


def _write_document(path: str, doc: dict) -> None:
    """Write a JSON document whole or not at all, naming ``path`` (never a temp name) on error."""
    import json
    import tempfile

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    except OSError as e:
        raise from_os_error(e, path, "cannot write") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)  # read by the serving image's user, whatever the umask
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise from_os_error(e, path, "cannot write") from None
    except BaseException:
        os.unlink(tmp)
        raise


@main.command("misses")
@click.argument("logs", nargs=-1, required=True, metavar="LOG|DIR...")
@JSON_OPTION
def misses_cmd(logs, as_json):
    """Merge serve-time miss logs (install --overlay) from many replicas: misses per kernel and
    specialization, replicas, first and last seen, count."""
    from cachebake.runtime.misses import merge

    output(as_json).emit(merge(list(logs)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
