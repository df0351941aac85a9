"""The ``cachebake`` command line: parse, call one function, render.  No logic lives here.

Every refusal is a CachebakeError: one line on stderr, the exit code README documents
(``CachebakeGroup.main`` is the one handler; see cachebake.errors for the rules).
"""

from __future__ import annotations

import json
import os
import sys

import click

from cachebake.errors import CachebakeError, ExitCode, Interrupted, from_os_error
from cachebake.output import Output, envelope


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
        except click.ClickException as e:  # bad options: click's own message, exit 2
            e.show()
            if out.as_json:
                out.print_json(envelope(command, False, {"error": {
                    "code": e.exit_code, "kind": "usage", "message": e.format_message()}}))
            code = e.exit_code
        except click.Abort:  # click turns KeyboardInterrupt (and EOF at a prompt) into Abort
            out.error(Interrupted())
            code = int(ExitCode.INTERRUPTED)
        except KeyboardInterrupt:
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
            log = _write_crash_log(e)
            out.error(CachebakeError(f"internal error: {type(e).__name__}: {e}"
                                     + (f" (traceback in {log})" if log else "")))
            code = int(ExitCode.FAILURE)
        code = code if isinstance(code, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


def _write_crash_log(exc: BaseException) -> str | None:
    """Write ``exc``'s traceback to a fresh file; its path, or None if nothing could be written."""
    import tempfile
    import traceback

    try:
        fd, path = tempfile.mkstemp(prefix="cachebake-crash-", suffix=".log",
                                    dir=os.environ.get("CACHEBAKE_LOG_DIR") or None)
        with os.fdopen(fd, "w") as f:
            f.write(f"cachebake {' '.join(sys.argv[1:])}\n")
            f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return path
    except OSError:
        return None


@click.group(cls=CachebakeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cachebake")
def main():
    """Bake Triton kernels and autotune results for a vLLM deployment at image-build time."""


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))


def output(as_json: bool = False) -> Output:
    """The boundary's Output for this invocation (one per command run, so an error after a
    report was emitted does not print a second JSON document)."""
    ctx = click.get_current_context(silent=True)
    out = ctx.find_object(Output) if ctx is not None else None
    if out is None:
        out = Output(ctx.info_name if ctx is not None else "", as_json)
    out.as_json = out.as_json or as_json
    return out


@main.command()
@click.argument("roots", nargs=-1, required=True, metavar="[ROLE=]CACHE_DIR...")
@click.option("--out", "out", required=True, type=click.Path(file_okay=True, dir_okay=True),
              help="Artifact directory (an OCI image layout); an existing artifact gains this target.")
@click.option("--target", help="GPU target, e.g. sm_90 (default: the visible GPU).")
@click.option("--layer-root", help="Absolute path the server mounts the cache at (default /var/cache/cachebake).")
@click.option("--prune-ir", is_flag=True, help="Drop .ttir/.ttgir/.llir/.ptx: ~3x smaller, kernels still hit.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def pack(roots, out, target, layer_root, prune_ir, as_json):
    """Pack cache directories (triton=, vllm=, flashinfer=, inductor=) into an artifact."""
    from cachebake.artifact.pack import pack_artifact, parse_root

    report = pack_artifact([parse_root(r) for r in roots], out, target=target, layer_root=layer_root,
                           prune_ir=prune_ir)
    if as_json:
        _emit_json(report.to_dict())
        return
    from cachebake.render import render_pack

    render_pack(report)


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--target", help="Show only this GPU target's bake.")
@click.option("--json", "as_json", is_flag=True, help="Print the full manifests as JSON.")
def inspect(artifact, target, as_json):
    """Show an artifact's fingerprint, kernel inventory, sizes and digests."""
    from cachebake.inspect import inspect_artifact

    report = inspect_artifact(artifact, target)
    if as_json:
        _emit_json(report.to_dict())
        return
    from cachebake.render import render_inspect

    render_inspect(report)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--model", help="Recipe name or model directory (for --driver kernels|vllm).")
@click.option("--driver", type=click.Choice(["vllm", "kernels", "command"]),
              help="What runs one warmup round (default: the command after --).")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size (default: the recipe's).")
@click.option("--serve-args", "serve_args", default=None,
              help="The exact vLLM serving arguments: JSON or `vllm serve` flags (default: the recipe's).")
@click.option("--model-dir", "model_dir", type=click.Path(), default=None,
              help="vllm driver: where the model config goes; use the path the server will use.")
@click.option("--out", required=True, type=click.Path(), help="Artifact directory to write.")
@click.option("--root", default=None, type=click.Path(),
              help="Cache root to bake in; serve from the same path (default /var/cache/cachebake).")
@click.option("--target", help="GPU target, e.g. sm_90 (default: the visible GPU).")
@click.option("--until-stable/--no-until-stable", default=True, show_default=True,
              help="Fail (exit 10) if a round still compiles after --max-rounds.")
@click.option("--max-rounds", type=int, default=4, show_default=True)
@click.option("--work-dir", type=click.Path(), help="Where round logs and events go (default: a temp dir).")
@click.option("--allow-env", is_flag=True,
              help="Cache-invalidating variables are set on purpose: record them without warning.")
@click.option("--layer-root", help="Absolute path the server mounts the cache at (pack's default if unset).")
@click.option("--prune-ir", is_flag=True, help="Drop .ttir/.ttgir/.llir/.ptx from the layer.")
@click.option("--json", "as_json", is_flag=True, help="Print the build report as JSON.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def build(model, driver, tp, serve_args, model_dir, out, root, target, until_stable, max_rounds, work_dir, allow_env,
          layer_root, prune_ir, as_json, cmd):
    """Run a warmup under the compile monitor until a round compiles nothing, then pack."""
    from cachebake.build import build as run_build
    from cachebake.drivers.command import make_driver
    from cachebake.progress import RoundProgress
    from cachebake.roles import DEFAULT_ROOT

    drv = make_driver(driver, cmd, model=model, tp=tp, serve_args=serve_args, model_dir=model_dir)
    report, packed = run_build(drv, out=out, root=root or DEFAULT_ROOT, target=target,
                               max_rounds=max_rounds, until_stable=until_stable,
                               allow_invalidating=allow_env, work_dir=work_dir,
                               progress=RoundProgress(verb="bake"), layer_root=layer_root,
                               prune_ir=prune_ir)
    if as_json:
        _emit_json({"bake": report.to_dict(), "pack": packed.to_dict()})
        return
    t = report.total
    state = "stable" if report.stable else "NOT stable"
    click.echo(f"baked {out}: {len(report.rounds)} rounds ({state}), {t.compiles} compiles "
               f"({t.compile_seconds:.1f} s) and {t.autotunes} autotunes "
               f"({t.autotune_seconds:.1f} s) moved to build time, {len(t.kernels)} kernels")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--cache", required=True, type=click.Path(),
              help="An installed cache root (the --to DIR of install).")
@click.option("--model", help="Recipe name or model directory (for --driver kernels|vllm).")
@click.option("--driver", type=click.Choice(["vllm", "kernels", "command"]))
@click.option("--tp", type=int, default=None, help="Tensor-parallel size (default: the recipe's).")
@click.option("--serve-args", "serve_args", default=None, help="As for build: the bake's serving arguments.")
@click.option("--model-dir", "model_dir", type=click.Path(), default=None, help="As for build.")
@click.option("--work-dir", type=click.Path(), help="Where the round log and events go.")
@click.option("--json", "as_json", is_flag=True, help="Print the verify report as JSON.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def verify(cache, model, driver, tp, serve_args, model_dir, work_dir, as_json, cmd):
    """Run one warmup round against an installed cache; exit 8 on any compile or benchmark."""
    from cachebake.drivers.command import make_driver
    from cachebake.progress import RoundProgress
    from cachebake.verify import verify as run_verify

    drv = make_driver(driver, cmd, model=model, tp=tp, serve_args=serve_args, model_dir=model_dir)
    report = run_verify(drv, cache, work_dir=work_dir, progress=RoundProgress(verb="verify"))
    if as_json:
        output(as_json).emit(report)
    else:
        for line in report.lines():
            click.echo(line)
        if report.ok:
            s = report.round.summary
            click.echo(f"verified {report.cache}: 0 compiles, {s.cache_hits} cache hits")
    report.check()


@main.command("recipes")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def recipes_cmd(as_json):
    """List the model recipes: variants, architecture, Mamba shapes, default serve args."""
    from cachebake.recipes import list_recipes

    recipes = list_recipes()
    if as_json:
        _emit_json([{"recipe": r.ref, "model_id": r.model_id, "architecture": r.architecture,
                     "mamba": r.mamba_shapes(), "serve_args": r.serve_args,
                     "source_url": r.source_url, "notes": r.notes} for r in recipes])
        return
    from cachebake.recipes.render import render_recipes

    render_recipes(recipes)


@main.command("serve-args")
@click.argument("artifact", type=click.Path())
@click.option("--target", help="GPU target whose bake to read (default: the only/first one).")
@click.option("--root", help="Where the artifact is installed (install --to DIR); default: the bake root.")
@click.option("--json", "as_json", is_flag=True, help="Print the command and environment as JSON.")
def serve_args_cmd(artifact, target, root, as_json):
    """Print the `vllm serve` command and environment that match ARTIFACT's bake."""
    from cachebake.drivers.vllm_args import read_manifest, serve_command

    cmd = serve_command(read_manifest(artifact, target), root=root)
    if as_json:
        _emit_json(cmd.to_dict())
    else:
        click.echo(cmd.shell())


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--to", "to", required=True, type=click.Path(file_okay=False),
              help="Directory to install into (created if missing; usually a volume).")
@click.option("--target", help="GPU target, e.g. sm_90 (default: the serving GPU's).")
@click.option("--fingerprint", "fingerprint_file", type=click.Path(dir_okay=False),
              help="The serving environment's fingerprint (`cachebake fingerprint --out`), "
                   "checked instead of this process's.")
@click.option("--serve-at", help="Path the server sees DIR at, if the volume is mounted elsewhere there.")
@click.option("--allow-mismatch", is_flag=True, help="Install despite preflight differences (warns).")
@click.option("--lock-timeout", default=600.0, show_default=True, type=float,
              help="Seconds to wait for another install into DIR before giving up (exit 11).")
@click.option("--check-only", is_flag=True,
              help="Run every check (the whole layer too) and report what an install would do; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def install(artifact, to, target, fingerprint_file, serve_at, allow_mismatch, lock_timeout, check_only,
            as_json):
    """Preflight, verify and safely, atomically install ARTIFACT into DIR; idempotent."""
    from cachebake.install import install_artifact

    report = install_artifact(artifact, to, target=target, fingerprint_file=fingerprint_file,
                              allow_mismatch=allow_mismatch, serve_at=serve_at,
                              lock_timeout=lock_timeout, check_only=check_only)
    for line in report.mismatches:
        click.echo(f"cachebake: warning: {line} (installed anyway: --allow-mismatch)", err=True)
    if as_json:
        _emit_json(report.to_dict())
        return
    if report.status == "already installed" or report.status.startswith("would"):
        click.echo(f"{report.status}: {report.layer_digest[:19]} ({report.target}) in {report.to}"
                   + "".join(f"\n  damaged: {d}" for d in report.damage))
    else:
        click.echo(f"{report.status}: {report.layer_digest[:19]} ({report.target}) in {report.to}: "
                   f"{report.files} files, {report.file_bytes / 1e6:.1f} MB, "
                   f"{report.groups_relocated} group files relocated, {report.seconds:.2f} s")
    for k, v in report.env.items():
        click.echo(f"{k}={v}")


@main.command()
@click.option("--target", help="GPU target, e.g. sm_90 (default: the visible GPU).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
def fingerprint(target, out):
    """Print this environment's fingerprint; run it in the serving image at build time and
    give the file to `cachebake install --fingerprint` (an init container is not the server)."""
    from cachebake.artifact.fingerprint import current_fingerprint

    text = json.dumps(current_fingerprint(target).to_dict(), indent=2, sort_keys=True) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        with open(out, "w") as f:
            f.write(text)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
