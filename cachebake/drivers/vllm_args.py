"""How the vllm driver turns ``--model``/``--tp``/``--serve-args`` into a recipe, the final
serve args and the model directory (``resolve``).

The serve-args dialect itself (parse, validate, flags) and the server's command live in
``cachebake.serving``; the names below are re-exported for the driver modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cachebake.serving import (  # noqa: F401  (re-exported for the driver modules)
    BAKE_ONLY,
    parse_serve_args,
    serve_args_to_flags,
    serve_command,
    validate_serve_args,
)


def default_model_dir(recipe) -> str:
    """Where a bake puts a recipe's model when no path is given: pass the server's path instead."""
    slug = recipe.name.replace("/", "-")
    return f"/models/{slug}-{recipe.variant}" if recipe.variant else f"/models/{slug}"


def resolve(model: str, tp: int | None = None, *, serve_args: dict[str, Any] | str | None = None,
            model_dir: str | None = None) -> tuple[Any, dict[str, Any], str]:
    """A bake's recipe, final serve args and model dir, without touching the disk.

    Serve args: the recipe's defaults updated by ``serve_args`` (dict, JSON or flags); ``tp``
    overrides tensor_parallel_size when given.  Model dir: ``model_dir``, else a local model's
    own directory (baked where it is served from), else ``default_model_dir``."""
    from cachebake.recipes import load_recipe

    recipe = load_recipe(model)
    extra = parse_serve_args(serve_args) if isinstance(serve_args, str) else dict(serve_args or {})
    args = {**recipe.serve_args, **extra}
    if tp is not None:
        args["tensor_parallel_size"] = int(tp)
    validate_serve_args(args)
    if model_dir is None and recipe.local_path:
        local = Path(recipe.local_path)
        model_dir = str(local.parent if local.is_file() else local)
    elif model_dir is None:
        model_dir = default_model_dir(recipe)
    return recipe, args, str(model_dir)
