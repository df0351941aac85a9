"""Stored engine plans: one JSON file per recipe family in ``cachebake/vllm/kernels/plans/``.

Each recipe variant stores the plans of its default serve args at TP 1, 2, 4 and 8 (where
vLLM accepts the model at that size), with vLLM's default prefix caching and its opposite,
without and with speculative decoding (``SPEC_NGRAM``) -- and the sizes vLLM refuses, with
its reason, so that "not stored" never silently means "not tried".  A GPU builder without
vLLM bakes from these; ``python -m cachebake.vllm.kernels.plan.store`` (with vllm installed) rewrites
them, and ``pytest -m vllm`` proves each equals what vLLM computes now.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator

from cachebake import jsonio
from cachebake.vllm.kernels.plan import DEFAULT_GPU, SPEC_NGRAM, check_plan, gpu_target

PLAN_DIR = Path(__file__).resolve().parent.parent / "plans"
TP_SIZES = (1, 2, 4, 8)
STORE_FORMAT = 1


def plan_file(family: str) -> Path:
    return PLAN_DIR / f"{family}.json"


def combinations(recipe) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, serve args) of every stored combination of a recipe variant."""
    base = {k: v for k, v in recipe.serve_args.items()
            if k not in ("tensor_parallel_size", "enable_prefix_caching", "speculative_config")}
    for tp in TP_SIZES:
        for prefix in ("default", "flipped"):
            for spec in (False, True):
                args = {"tensor_parallel_size": tp, **base}
                if prefix == "flipped":
                    args["enable_prefix_caching"] = None  # filled in once the default is known
                if spec:
                    args["speculative_config"] = dict(SPEC_NGRAM)
                yield f"tp={tp},prefix={prefix},spec={'ngram' if spec else 'off'}", args


def normalized_args(args: dict[str, Any], vllm_version: str | None = None) -> dict[str, Any]:
    """Serve args as a plan is matched by: unset (None) is vLLM's default, the same as absent,
    and so is a value equal to the fixed default of the vLLM that computed the plan
    (``vllm_version``; versions.serve_arg_defaults)."""
    from cachebake.vllm.versions import serve_arg_defaults

    defaults = serve_arg_defaults(vllm_version) if vllm_version else {}
    return {k: v for k, v in args.items()
            if v is not None and not (k in defaults and v == defaults[k])}


def load_store(family: str) -> dict[str, Any] | None:
    path = plan_file(family)
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def stored_plan(recipe, serve_args: dict[str, Any], gpu: str | None = None) -> dict[str, Any] | None:
    """The stored plan of this recipe variant whose serve args are exactly ``serve_args``
    (and whose target is ``gpu``'s), or None."""
    if recipe.variant is None:
        return None
    store = load_store(recipe.name)
    if not store:
        return None
    target = gpu_target(gpu)
    for entry in store.get("variants", {}).get(recipe.variant, {}).values():
        plan = entry.get("plan")
        if not plan:
            continue
        version = plan.get("vllm_version")
        if (normalized_args(plan["serve_args"], version) == normalized_args(serve_args, version)
                and _same_target(plan["target"], target)):
            return check_plan(plan, str(plan_file(recipe.name)))
    return None


def _same_target(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("gpu_name", "memory_gib", "capability", "attention_backend")
    return all(a.get(k) == b.get(k) for k in keys)


def compute_variant(recipe, gpu: str = DEFAULT_GPU) -> dict[str, dict[str, Any]]:
    """Every stored combination of one variant: {name: {"plan": ...} or {"refused": why}}."""
    from cachebake.errors import CachebakeError
    from cachebake.vllm.kernels.plan.compute import compute_plan

    target = gpu_target(gpu)
    out: dict[str, dict[str, Any]] = {}
    default_prefix: dict[int, bool] = {}
    for name, args in combinations(recipe):
        tp = args["tensor_parallel_size"]
        if "enable_prefix_caching" in args:
            if tp not in default_prefix:  # its default plan was refused: so is this one
                out[name] = out[name.replace("prefix=flipped", "prefix=default")]
                continue
            args["enable_prefix_caching"] = not default_prefix[tp]
        try:
            plan = compute_plan(recipe.hf_config, args, target, recipe=recipe.ref)
        except CachebakeError as e:
            out[name] = {"refused": str(e)}
            continue
        if "enable_prefix_caching" not in args and "speculative_config" not in args:
            default_prefix[tp] = plan["cache"]["prefix_caching"]
        out[name] = {"plan": plan}
    return out


def write_store(family: str, variants: dict[str, dict[str, Any]]) -> Path:
    path = plan_file(family)
    doc = {"format": STORE_FORMAT, "family": family,
           "how": "python -m cachebake.vllm.kernels.plan.store (needs vllm; see cachebake/vllm/kernels/plan/compute.py)",
           "variants": variants}
    jsonio.write_atomic(path, (jsonio.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    return path


def main(argv: list[str] | None = None) -> int:
    from cachebake.recipes import list_recipes

    ap = argparse.ArgumentParser(prog="python -m cachebake.vllm.kernels.plan.store", description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", help="recipe families to recompute (default: all)")
    args = ap.parse_args(argv)
    by_family: dict[str, list] = {}
    for r in list_recipes():
        if not args.families or r.name in args.families:
            by_family.setdefault(r.name, []).append(r)
    for family, recipes in by_family.items():
        variants = {r.variant: compute_variant(r) for r in recipes}
        path = write_store(family, variants)
        n = sum("plan" in e for v in variants.values() for e in v.values())
        print(f"{path}: {n} plans", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
