"""The ``cachebake`` command line: a thin click group; each command calls one function and prints.

Every refusal is a ``CachebakeError``; ``main`` prints its one-line message and exits with its
code (cachebake.errors.ExitCode), so scripts can branch on the number.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cachebake.errors import BadInput, CachebakeError


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CachebakeError as e:
            click.echo(f"cachebake: {e}", err=True)
            sys.exit(int(e.code))


@click.group(cls=_Group)
def main() -> None:
    """Bake Triton JIT and autotune caches for vLLM at image-build time."""


@main.command("recipes")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def recipes_cmd(as_json: bool) -> None:
    """List the bundled model recipes: variants, architecture, Mamba shapes, serve args."""
    from cachebake.drivers.vllm_args import serve_args_to_flags
    from cachebake.recipes import list_recipes

    rows = []
    for r in list_recipes():
        rows.append({
            "recipe": r.ref, "model_id": r.model_id, "architecture": r.architecture,
            "mamba": r.mamba_shapes(), "serve_args": r.serve_args,
            "source_url": r.source_url, "unverified_notes": len(r.notes),
        })
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="cachebake recipes (name:variant)")
    for col in ("recipe", "model", "architecture", "mamba heads x dim / groups / state / conv / chunk",
                "serve args"):
        table.add_column(col)
    for row, r in zip(rows, list_recipes()):
        m = row["mamba"]
        shapes = (f"{m.get('heads')}x{m.get('head_dim')} / {m.get('groups')} / {m.get('d_state')} / "
                  f"{m.get('conv')} / {m.get('chunk')} ({m.get('mamba_layers')} layers)")
        table.add_row(row["recipe"], row["model_id"] or "", row["architecture"], shapes,
                      " ".join(serve_args_to_flags(r.serve_args)))
    Console(width=200).print(table)


def _read_manifest(artifact: str) -> dict:
    """The manifest dict of an artifact directory (its cachebake.json), or of a manifest file."""
    p = Path(artifact)
    candidates = [p / "cachebake.json"] if p.is_dir() else [p]
    for c in candidates:
        if c.is_file():
            try:
                data = json.loads(c.read_text())
            except (OSError, ValueError) as e:
                raise BadInput(f"{c}: not a readable manifest: {e}") from e
            if isinstance(data, dict):
                return data
    # TODO(lead): read through cachebake.artifact.oci.open_artifact(path).select(target).manifest
    # once the artifact reader is on main (OCI layouts without a cachebake.json, .tar.zst layers).
    try:
        from cachebake.artifact.oci import open_artifact  # type: ignore[import-not-found]
    except ImportError:
        raise BadInput(f"{artifact}: no cachebake.json there") from None
    return open_artifact(artifact).select().manifest


@main.command("serve-args")
@click.argument("artifact")
@click.option("--root", default=None, help="Where the artifact is installed (install --to DIR); "
              "default: the paths the bake used.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of shell lines.")
def serve_args_cmd(artifact: str, root: str | None, as_json: bool) -> None:
    """Print the `vllm serve` command and environment that match ARTIFACT's bake."""
    from cachebake.drivers.vllm_args import serve_command

    cmd = serve_command(_read_manifest(artifact), root=root)
    click.echo(json.dumps(cmd.to_dict(), indent=2) if as_json else cmd.shell())


if __name__ == "__main__":
    main()
