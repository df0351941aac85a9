"""``cachebake`` recipes and plan: the bundled model recipes, and the engine plan vLLM computes for one."""

from __future__ import annotations

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import GPU_MEMORY


@main.command("recipes")
@JSON_OPTION
def recipes_cmd(as_json):
    """List the bundled model recipes.

    Variants, architecture, Mamba shapes, default serve args."""
    from cachebake.cli.render import render_recipes
    from cachebake.cli.reports import RecipesReport
    from cachebake.recipes import list_recipes

    output(as_json).emit(RecipesReport(list_recipes()), render=render_recipes)


@main.command("plan")
@click.option("--model", default="nemotron-h", show_default=True,
              help="Recipe (name[:variant]), model directory or config.json.")
@click.option("--serve-args", "serve_args", default=None,
              help="The exact vLLM serving arguments: JSON or `vllm serve` flags (default: the recipe's).")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size (default: the serve args').")
@click.option("--gpu-memory", "gpu_memory", type=GPU_MEMORY, default=None,
              help="GPU memory in GiB or a class (h200, h100; default h200).")
@click.option("--stored", is_flag=True, help="Only the stored plan (never compute; no vllm needed).")
@click.option("--json", "as_json", is_flag=True, help="Print the report (with the whole plan) as JSON.")
def plan_cmd(model, serve_args, tp, gpu_memory, stored, as_json):
    """Show the engine plan vLLM computes for a model.

    What vLLM's engine will hand its Mamba2 kernels: block and page sizes, state views,
    block table, CUDA-graph sizes, warm-up batch (computed with vllm, CPU is enough)."""
    from cachebake.vllm.kernels.plan.report import make_plan_report

    output(as_json).emit(make_plan_report(model, tp, serve_args, gpu_memory, stored_only=stored))
