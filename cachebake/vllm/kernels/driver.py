"""The ``kernels`` driver: replay what vLLM's engine launches through its Mamba2 kernels.

A server compiles a Mamba2 kernel variant the first time a launch meets a new
specialization (a state view's strides, an index pointer's 16-byte alignment, an integer's
value class, HAS_INITSTATES, a launch config picked from a per-GPU table...).  This driver
runs one TP rank's Mamba2 layer through every engine step that can reach one: the start-up
phase (profile-run SSD warm-up, ``warmup_kernels``, CUDA-graph capture) and the serving steps
users cause (first prefills, chunked-prefill continuations, mixed decode + prefill steps at
every pointer-alignment class, prefix-cache checkpoints and hits, speculative decoding), plus
one step for every decode class -- the path, int class and selective-state-update launch
config of a decode-row count -- that any warm-up batch (it depends on the GPU's free KV
blocks) or decode batch size can reach (``engine_classes``) -- with the engine's own layouts,
from an *engine plan* (``cachebake.vllm.kernels.plan``) that vLLM computed for the model, serve args and GPU.

Where the plan comes from (``load_plan``): a file given explicitly; else the stored plan of
the recipe variant whose serve args are exactly these (``cachebake/vllm/kernels/plans/``); else
computed here when the ``vllm`` package imports.  A GPU builder without vLLM therefore bakes
any stored combination as is, and anything else from a plan file made elsewhere with
``cachebake plan --json``.

Each step sets ``CACHEBAKE_STEP`` to its label before it runs, so every compile the monitor
records names the engine step that needs it; the round's record (``kernels-bake.json`` beside
the monitor log: plan, steps) becomes part of the bake section of the manifest.

``engine_classes.plan_steps``/``build_metadata`` are pure (tests run them on CPU); the GPU part
is ``mamba2_ops.EngineMixer``, which also resolves the launch configs from vLLM's tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachebake import jsonio
from cachebake.capture.env import MONITOR_LOG_ENV, STEP_ENV
from cachebake.vllm.kernels.engine_classes import plan_steps
from cachebake.vllm.kernels.engine_steps import Step
from cachebake.errors import BadInput, Unsupported

RECORD_NAME = "kernels-bake.json"


def resolve_model(model: str, tp: int | None = None, serve_args=None):
    """(recipe, final serve args) as every driver resolves them (``vllm_args.resolve``)."""
    from cachebake.vllm.serveargs import resolve

    recipe, args, _ = resolve(model, tp, serve_args=serve_args)
    return recipe, args


def load_plan(model: str, tp: int | None = None, serve_args=None, plan: str | None = None,
              gpu: str | None = None) -> tuple[Any, dict[str, Any], str]:
    """(recipe, engine plan, where the plan came from)."""
    from cachebake.vllm.kernels.plan import read_plan

    recipe, args = resolve_model(model, tp, serve_args)
    if plan:
        found, source = read_plan(plan), f"file {plan}"
        check_plan_matches(recipe, found)
        check_plan_serve_args(args, found, plan)
    else:
        from cachebake.vllm.kernels.plan.store import plan_file, stored_plan

        found = stored_plan(recipe, args, gpu)
        source = f"stored {plan_file(recipe.name).name}" if found else ""
        if found is None:
            try:
                import vllm  # noqa: F401
            except ImportError:
                raise Unsupported(
                    f"no stored engine plan for {recipe.ref} with these serve args "
                    f"({json.dumps(args, sort_keys=True)}), and vllm is not installed here to "
                    "compute one: run `cachebake plan --model ... --serve-args ... --json > plan.json` "
                    "where vllm is installed and bake with that plan") from None
            from cachebake.vllm.kernels.plan import gpu_target
            from cachebake.vllm.kernels.plan.compute import compute_plan

            found = compute_plan(recipe.hf_config, args, gpu_target(gpu), recipe=recipe.ref)
            source = "computed with vllm"
        check_plan_matches(recipe, found)
    return recipe, found, source


def check_plan_serve_args(args: dict[str, Any], plan: dict[str, Any], where: str) -> None:
    """Refuse a plan file computed for other serve args than the bake's: the bake would cover
    that plan's batches (max_num_seqs, capture sizes, the warm-up batch...) while the artifact
    tells the server to start with these args.  Unset and absent are the same (vLLM's default)."""
    from cachebake.vllm.kernels.plan.store import normalized_args

    version = plan.get("vllm_version")
    want, got = normalized_args(args, version), normalized_args(plan.get("serve_args") or {}, version)
    if want != got:
        diff = ", ".join(f"{k} {got.get(k)!r} (plan) vs {want.get(k)!r} (bake)"
                         for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k))
        raise BadInput(f"{where}: the engine plan was computed for other serve args: {diff}; "
                       "bake with the serve args the plan names, or compute a plan for these")


def check_plan_matches(recipe, plan: dict[str, Any]) -> None:
    """Refuse a plan made for another model: its per-rank mixer must be this config's, split
    the way vLLM splits it (heads by TP; groups by TP, a single group replicated)."""
    from cachebake.recipes.model_keys import mamba_hparams

    hp = mamba_hparams(recipe.hf_config)
    mx, tp = plan["mixer"], plan["model"]["tensor_parallel_size"]
    groups = hp["n_groups"]
    rank_groups = groups // tp if groups % tp == 0 else (groups + tp - groups % tp) // tp
    want = {"num_heads": hp["num_heads"] // tp, "head_dim": hp["head_dim"], "d_state": hp["d_state"],
            "conv_kernel": hp["conv_kernel"], "chunk_size": hp["chunk_size"],
            "activation": hp["activation"], "n_groups": rank_groups,
            "intermediate": hp["intermediate"] // tp}
    got = {k: mx.get(k) for k in want}
    if got != want:
        diff = ", ".join(f"{k} {got[k]} (plan) vs {want[k]} (model)" for k in want if got[k] != want[k])
        raise BadInput(f"the engine plan is not for {recipe.ref}: {diff}")


def bake_record(recipe, plan: dict[str, Any], source: str, steps: list[Step]) -> dict[str, Any]:
    """What the manifest's bake section gets from this driver: the plan it replayed (a GPU
    builder bakes again from it) and the engine steps by label, in order."""
    return {"model": recipe.identity(), "plan": plan, "plan_source": source,
            "engine_steps": [s.label for s in steps]}


def run_sweep(model: str = "nemotron-h", tp: int | None = None, *, serve_args=None,
              plan: str | None = None, gpu: str | None = None,
              on_step: Callable[[Step], None] | None = None, verbose: bool = True) -> None:
    """One round on the current CUDA device: every engine step of the plan, each labeled."""
    import torch

    from cachebake.vllm.kernels.mamba2_ops import EngineMixer

    recipe, found, source = load_plan(model, tp, serve_args, plan, gpu)
    mixer = EngineMixer(found)
    steps = plan_steps(found, config_of=mixer.ssu_launch_config)
    ran: list[Step] = []
    timings: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    try:
        for step in steps:
            os.environ[STEP_ENV] = step.label
            if on_step is not None:
                on_step(step)
            t = time.perf_counter()
            mixer.run(step)
            torch.cuda.synchronize()
            timings.append((time.perf_counter() - t, step.label))
            ran.append(step)
    finally:
        os.environ.pop(STEP_ENV, None)
    _write_record(bake_record(recipe, found, source, ran))
    if verbose:
        total = time.perf_counter() - t0
        slow = ", ".join(f"{label} {sec:.2f}s" for sec, label in sorted(timings, reverse=True)[:5])
        print(f"kernels driver {recipe.ref} tp={found['model']['tensor_parallel_size']} "
              f"({source}): {len(ran)} engine steps in {total:.2f}s; slowest: {slow}",
              file=sys.stderr)


def _write_record(record: dict[str, Any]) -> None:
    monitor_log = os.environ.get(MONITOR_LOG_ENV)
    if not monitor_log:
        return
    path = Path(monitor_log).parent / RECORD_NAME
    jsonio.write_atomic(path, jsonio.dumps(record, indent=1, sort_keys=True).encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cachebake.vllm.kernels.driver",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nemotron-h", help="recipe, model directory or config.json")
    ap.add_argument("--tp", type=int, default=None)
    ap.add_argument("--serve-args", default=None, help="JSON or vllm serve flags (default: the recipe's)")
    ap.add_argument("--plan", default=None, help="an engine plan JSON (cachebake plan --json)")
    ap.add_argument("--gpu-memory", default=None, help="GPU memory class or GiB, for stored plans")
    ap.add_argument("--list", action="store_true", help="print the engine steps and exit (no GPU)")
    args = ap.parse_args(argv)
    from cachebake.errors import CachebakeError, print_error

    try:
        if args.list:
            _, found, source = load_plan(args.model, args.tp, args.serve_args, args.plan, args.gpu_memory)
            print(f"# plan: {source}")
            print("# decode classes by path and int class; a round also splits them by vLLM's "
                  "per-GPU selective-state-update launch configs")
            for step in plan_steps(found):
                print(step.label)
            return 0
        run_sweep(args.model, args.tp, serve_args=args.serve_args, plan=args.plan, gpu=args.gpu_memory)
    except CachebakeError as e:
        print_error(e)
        return int(e.code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
