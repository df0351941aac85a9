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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
