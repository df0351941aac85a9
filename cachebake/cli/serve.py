"""``cachebake`` serve-args: the ``vllm serve`` command and environment that match a bake."""

from __future__ import annotations

import os

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import ABSOLUTE_PATH, GPU_TARGET


@main.command("serve-args")
@click.argument("artifact", type=click.Path())
@click.option("--target", type=GPU_TARGET, help="GPU target whose bake to read (default: the only one).")
@click.option("--root", type=ABSOLUTE_PATH,
              help="Where the artifact is installed (install --to DIR); default: the bake root.")
@click.option("--overlay", type=ABSOLUTE_PATH, default=None,
              help="Writable dir for kernels the bake lacks (as for install --overlay).")
@JSON_OPTION
def serve_args_cmd(artifact, target, root, overlay, as_json):
    """Print the `vllm serve` command that matches a bake.

    The command and the environment that match ARTIFACT's bake (a --driver vllm bake)."""
    from cachebake.cli.render import render_serve_command
    from cachebake.serve.command import read_manifest, serve_command

    manifest = read_manifest(artifact, target)
    cmd = serve_command(manifest, root=root, document=f"{artifact}: bake manifest")
    if overlay is not None:
        from cachebake.roles import serving_overlay_env

        baked = cmd.env.get("TRITON_CACHE_DIR")  # <root>/triton
        cmd.env.update(serving_overlay_env(overlay, os.path.dirname(baked) if baked else None,
                                           manifest.get("roles") or ["triton"]))
    output(as_json).emit(cmd, render=render_serve_command)
