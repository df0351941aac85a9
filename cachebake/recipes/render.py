"""``cachebake recipes`` as a table: one row per recipe variant."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from cachebake.drivers.vllm_args import serve_args_to_flags


def render_recipes(recipes) -> None:
    table = Table(title="cachebake recipes (--model NAME[:VARIANT])")
    for col in ("recipe", "model", "architecture",
                "Mamba heads x dim / groups / state / conv / chunk", "default serve args"):
        table.add_column(col)
    for r in recipes:
        m = r.mamba_shapes()
        shapes = (f"{m.get('heads', '?')}x{m.get('head_dim', '?')} / {m.get('groups', '?')} / "
                  f"{m.get('d_state', '?')} / {m.get('conv', '?')} / {m.get('chunk', '?')} "
                  f"({m.get('mamba_layers', '?')} Mamba layers)")
        name = r.ref + (" *" if any("UNVERIFIED" in n for n in r.notes) else "")
        table.add_row(name, r.model_id or "", r.architecture, shapes,
                      " ".join(serve_args_to_flags(r.serve_args)))
    console = Console(width=max(Console().width, 180))  # the serve-args column is wide
    console.print(table)
    console.print("* some hyperparameters unverified: see the recipe's notes "
                  "(cachebake recipes --json)")
