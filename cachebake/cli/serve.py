"""``cachebake`` serve-args: the ``vllm serve`` command and environment that match a bake."""

from __future__ import annotations

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import ABSOLUTE_PATH, GPU_TARGET


@main.command("serve-args")
@click.argument("artifact", type=click.Path())
@click.option("--target", type=GPU_TARGET, help="GPU target whose bake to read (default: the only one).")
@click.option("--root", type=ABSOLUTE_PATH,
              help="Where the artifact is installed (install --to DIR); default: the default serving "
                   "root /var/cache/cachebake, for a bake packed for it (another: exit 3).")
@click.option("--overlay", type=ABSOLUTE_PATH, default=None,
              help="Writable dir for kernels the bake lacks (as for install --overlay).")
@click.option("--env-file", "env_file", type=click.Path(dir_okay=False), default=None,
              help="Also write the environment as `export` lines to this file, for the server's "
                   "shell to source (`. FILE`) before `vllm serve`.")
@JSON_OPTION
def serve_args_cmd(artifact, target, root, overlay, env_file, as_json):
    """Print the `vllm serve` command that matches a bake.

    The command and the environment that match ARTIFACT's bake (a --driver vllm bake)."""
    from cachebake.cli.render import render_serve_command
    from cachebake.serve.command import read_facts, serve_command

    cmd = serve_command(read_facts(artifact, target), root=root, overlay=overlay)
    if env_file is not None:
        write_env_file(env_file, cmd.env)
    output(as_json).emit(cmd, render=render_serve_command)


def write_env_file(path: str, env: dict[str, str]) -> None:
    """``export NAME=value`` lines, values shell-quoted; names checked (they come from a
    manifest): a name that is no shell variable name is refused, nothing written.  Written
    beside itself and renamed into place, so a server never sources half a file."""
    import shlex

    from cachebake import jsonio
    from cachebake.errors import BadInput
    from cachebake.serve.command import ENV_NAME

    bad = [k for k in env if not ENV_NAME.fullmatch(k)]
    if bad:
        raise BadInput(f"the bake's environment has names that are no variable names: {bad[:3]}")
    text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    jsonio.write_atomic(path, text.encode())  # whole or not at all, a random temp name
