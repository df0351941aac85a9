#!/usr/bin/env python3
"""Prove the kernels driver's sweep launches every kernel key the engine can reach.

For each engine plan, two step lists go through vLLM's Mamba2 ops' host code with the plan's
layouts (cachebake's EngineMixer, whose calls tests/test_vllm_kernels_plan_vllm.py checks against vLLM's own
MambaMixer2 and metadata builder):

* the engine's reachable steps, enumerated outright (``engine_classes.reachable_steps``: every
  warm-up batch any GPU memory size makes, decode-only and mixed batches of every size, every
  joint 16-byte residue of decode rows and tokens, prefills across chunk/block boundaries);
* the driver's sweep (``engine_classes.plan_steps``, launch configs resolved from vLLM's per-GPU
  tables as on the GPU).

Offline (default, no GPU): on CPU tensors, every launch stopped at Triton's binder
(offline_keys.KeyRecorder: Triton's own ``create_function_from_signature`` and specialize_impl,
nothing compiled; autotuned kernels keyed for every candidate config); the reachable keys must
be a subset of the sweep's.  Prints one JSON line per plan and a summary; exit 0 when no key is
missing, 1 otherwise.

    PYTHONPATH=EXTRACT:$PWD TORCH_PYTHON bench/engine_check/reachable_keys.py --model nemotron-h:8b
    ... --model nemotron-h:8b --all-variants        # every stored TP/prefix/spec plan
    ... --model nemotron-h:8b --plan PLAN.json      # a plan file (`cachebake plan --json`)
    ... --model nemotron-h:8b --plan PLAN.json --bake-stored   # PLAN's engine, the recipe's bake

``--gpu``: run the reachable steps for real on the current CUDA device instead, against
TRITON_CACHE_DIR (e.g. an installed bake), counting real compiles through Triton's compilation
listener; exit 8 when anything compiled or failed.  That is the engine-layout check on the GPU,
for every warm-up batch and decode batch size, not one sample.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def plans(model: str, plan_file: str | None, all_variants: bool, gpu: str | None):
    """[(name, plan)] to prove."""
    from cachebake.vllm.kernels.driver import load_plan, resolve_model
    from cachebake.vllm.kernels.plan.store import load_store

    if all_variants:
        recipe, _ = resolve_model(model)
        variants = load_store(recipe.name)["variants"][recipe.variant]
        return [(f"{recipe.ref}/{key}", entry["plan"]) for key, entry in sorted(variants.items())
                if "plan" in entry]
    serve_args = None
    if plan_file:  # the bake this proves is one made with the plan's own serve args
        from cachebake.vllm.kernels.plan import read_plan

        serve_args = read_plan(plan_file)["serve_args"]
    recipe, plan, source = load_plan(model, serve_args=serve_args, plan=plan_file, gpu=gpu)
    return [(f"{recipe.ref} ({source})", plan)]


def offline(name: str, plan: dict, bake_plan: dict | None = None) -> dict:
    """Reachable keys of ``plan`` against the sweep of ``bake_plan`` (default: the same plan;
    another one asks whether a bake made for other serve args covers this engine)."""
    from offline_keys import KeyRecorder
    from vllm.model_executor.layers.mamba.ops import triton_helpers

    from cachebake.vllm.kernels.engine_classes import decode_classes, plan_steps, reachable_steps
    from cachebake.vllm.kernels.mamba2_ops import EngineMixer

    t0 = time.perf_counter()
    rec = KeyRecorder()
    mixer = EngineMixer(plan, device="cpu", random_inputs=False)
    reach_steps = 0
    # vLLM's launch_autotuned remembers picked configs per process: each pass starts without
    # them (a server, and the driver's round, are fresh processes), so every autotuned kernel
    # is keyed for all its candidate configs.
    triton_helpers._autotuned_configs.clear()
    for step in reachable_steps(plan):
        rec.label = step.label
        mixer.run(step)
        reach_steps += 1
    reachable = {}
    for label, keys in rec.keys.items():
        for k in keys:
            reachable.setdefault(k, label)
    rec.keys.clear()
    rec.calls = 0
    triton_helpers._autotuned_configs.clear()
    if bake_plan is not None:
        mixer = EngineMixer(bake_plan, device="cpu", random_inputs=False)
    sweep = plan_steps(bake_plan or plan, config_of=mixer.ssu_launch_config)
    for step in sweep:
        rec.label = step.label
        mixer.run(step)
    driver = rec.all()
    missing = {k: v for k, v in reachable.items() if k not in driver}
    per_kernel: dict[str, dict] = collections.defaultdict(lambda: {"reachable": 0, "sweep": 0, "missing": 0})
    for k in reachable:
        per_kernel[k[0]]["reachable"] += 1
    for k in driver:
        per_kernel[k[0]]["sweep"] += 1
    for k in missing:
        per_kernel[k[0]]["missing"] += 1
    classes = decode_classes(bake_plan or plan, mixer.ssu_launch_config)
    return {
        "plan": name, "vllm_version": plan.get("vllm_version"),
        "max_num_seqs": plan["scheduler"]["max_num_seqs"],
        "bake_max_num_seqs": (bake_plan or plan)["scheduler"]["max_num_seqs"],
        "warmup_batch_planned": plan["warmup"]["num_reqs"],
        "reachable_steps": reach_steps, "reachable_keys": len(reachable),
        "sweep_steps": len(sweep), "sweep_launches": rec.calls, "sweep_keys": len(driver),
        "missing": len(missing), "sweep_only": len(driver - set(reachable)),
        "per_kernel": dict(sorted(per_kernel.items())),
        "decode_classes": {c.tag(): n for c, n in sorted(classes.items())},
        "class_steps": [s.label for s in sweep if s.label.startswith("serve/decode-class/")],
        "missing_examples": sorted({f"{k[0]} at {v}" for k, v in missing.items()})[:10],
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def on_gpu(name: str, plan: dict) -> dict:
    import torch
    import triton

    from cachebake.vllm.kernels.engine_classes import reachable_steps
    from cachebake.vllm.kernels.mamba2_ops import EngineMixer

    t0 = time.perf_counter()
    compiles, hits = collections.Counter(), collections.Counter()
    by_step: dict[str, list[str]] = collections.defaultdict(list)
    current = {"label": "-"}

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        kernel = metadata.get("name", "?") if isinstance(metadata, dict) else "?"
        if cache_hit:
            hits[kernel] += 1
        else:
            compiles[kernel] += 1
            by_step[current["label"]].append(kernel)

    triton.knobs.compilation.listener = listener
    mixer = EngineMixer(plan)
    failures, steps = [], 0
    for step in reachable_steps(plan):
        current["label"] = step.label
        try:
            mixer.run(step)
            torch.cuda.synchronize()
        except Exception as e:  # a compile on a read-only cache raises here
            failures.append({"step": step.label, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        steps += 1
    return {"plan": name, "device": torch.cuda.get_device_name(), "steps": steps,
            "compiles": sum(compiles.values()), "cache_hits": sum(hits.values()),
            "compiles_by_kernel": dict(sorted(compiles.items())),
            "compiles_by_step": {k: v for k, v in list(by_step.items())[:40]},
            "failures": len(failures), "failure_examples": failures[:5],
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="recipe (repeatable)")
    ap.add_argument("--plan", default=None, help="an engine plan file instead of the stored plan")
    ap.add_argument("--all-variants", action="store_true", help="every stored plan of the variant")
    ap.add_argument("--bake-stored", action="store_true",
                    help="sweep the recipe's stored plan (its default serve args) instead: does "
                         "that bake cover an engine running --plan?")
    ap.add_argument("--gpu-memory", default=None, help="GPU memory class of the stored plan")
    ap.add_argument("--gpu", action="store_true", help="launch the reachable steps on CUDA and count compiles")
    ap.add_argument("--out", default=None, help="write the JSON lines here too")
    args = ap.parse_args(argv)
    import vllm

    if not getattr(vllm, "OPS_ONLY", False):
        raise SystemExit("put the ops extract first on PYTHONPATH (bench/vllm_ops/make_vllm_ops.py)")
    if not args.gpu:
        from offline_keys import pretend_h200

        pretend_h200()
    lines = []
    for model in args.model:
        bake = plans(model, None, False, args.gpu_memory)[0][1] if args.bake_stored else None
        for name, plan in plans(model, args.plan, args.all_variants, args.gpu_memory):
            result = on_gpu(name, plan) if args.gpu else offline(name, plan, bake)
            lines.append(json.dumps(result, sort_keys=True))
            print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    results = [json.loads(x) for x in lines]
    if args.gpu:
        bad = sum(r["compiles"] + r["failures"] for r in results)
        return 8 if bad else 0
    return 1 if any(r["missing"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
