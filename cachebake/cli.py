"""The ``cachebake`` command line: parse, call one function, render.  No logic lives here.

Every refusal is a CachebakeError: one line on stderr, the exit code README documents.
"""

from __future__ import annotations

import json
import sys

import click

from cachebake.errors import CachebakeError, ExitCode


class CachebakeGroup(click.Group):
    """Turns CachebakeError into its one-line message and exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CachebakeError as e:
            click.echo(f"cachebake: error: {e}", err=True)
            ctx.exit(int(e.code))
        except OSError as e:
            # An OS refusal we did not foresee (disk full, permissions on a path we did not
            # check): still one line, never a traceback.
            where = f": {e.filename}" if e.filename else ""
            click.echo(f"cachebake: error: {e.strerror or e}{where}", err=True)
            ctx.exit(int(ExitCode.FAILURE))


@click.group(cls=CachebakeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cachebake")
def main():
    """Bake Triton kernels and autotune results for a vLLM deployment at image-build time."""


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))


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
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def install(artifact, to, target, fingerprint_file, serve_at, allow_mismatch, lock_timeout, as_json):
    """Preflight, verify and safely, atomically install ARTIFACT into DIR; idempotent."""
    from cachebake.install import install_artifact

    report = install_artifact(artifact, to, target=target, fingerprint_file=fingerprint_file,
                              allow_mismatch=allow_mismatch, serve_at=serve_at,
                              lock_timeout=lock_timeout)
    for line in report.mismatches:
        click.echo(f"cachebake: warning: {line} (installed anyway: --allow-mismatch)", err=True)
    if as_json:
        _emit_json(report.to_dict())
        return
    if report.status == "already installed":
        click.echo(f"already installed: {report.layer_digest[:19]} ({report.target}) in {report.to}")
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
