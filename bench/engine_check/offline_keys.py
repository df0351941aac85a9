#!/usr/bin/env python3
"""Without a GPU: which Triton kernel specializations a trace and the kernels driver launch.

Runs vLLM's Mamba2 ops' host code on CPU tensors (the ops-only extract, so the CUDA code
paths, with the platform answering as an H200 would) and stops every launch at Triton's
binder: the specialization (argument types, 16-byte/==1 value classes, constexpr values) and
the launch options are exactly what Triton keys the compile on; for autotuned kernels every
candidate config's launch is keyed, as the benchmark would compile them.  Then compares:
every key the recorded engine trace needs should be one the driver's sweep produces.

    PYTHONPATH=EXTRACT:$PWD TORCH_PYTHON bench/engine_check/offline_keys.py --trace T.json.gz --model M

(the interpreter needs torch and Triton: e.g. the vllm venv with the extract first on the
path).  A pre-flight for the GPU proof, never a substitute: nothing is compiled here.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class KeyRecorder:
    """Replaces JITFunction.run / Autotuner.run with binders that record instead of launch."""

    def __init__(self, arch: int = 90):
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction, create_function_from_signature

        self.backend = make_backend(GPUTarget("cuda", arch, 32))
        self.keys: dict[str, set] = defaultdict(set)  # label -> {(kernel, key)}
        self.calls = 0  # binder calls: kernel launches, every autotune candidate counted
        self.label = "-"
        binders: dict[int, object] = {}
        rec = self

        def run(fn, *args, grid, warmup, **kwargs):
            kwargs["debug"] = kwargs.get("debug", fn.debug) or triton.knobs.runtime.debug
            kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
            binder = binders.get(id(fn))
            if binder is None:
                binder = binders[id(fn)] = create_function_from_signature(fn.signature, fn.params, rec.backend)
            _, specialization, options = binder(*args, **kwargs)
            rec.calls += 1
            rec.keys[rec.label].add((fn.__name__, repr(specialization), repr(sorted(options.items()))
                                     if isinstance(options, dict) else repr(options)))
            return None

        def tune(tuner, *args, **kwargs):
            for config in tuner.configs:
                full = {**kwargs, **config.all_kwargs()}
                tuner.fn.run(*args, **full)
            tuner.best_config = tuner.configs[0]  # vLLM's launch_autotuned reads it
            return None

        JITFunction.run = run
        Autotuner.run = tune

    def all(self) -> set:
        return set().union(*self.keys.values()) if self.keys else set()


def pretend_h200() -> None:
    """The extract's platform answers as the GPU the plans are for."""
    from vllm.platforms import DeviceCapability
    from vllm.platforms import current_platform as p

    p.get_device_capability = lambda device_id=0: DeviceCapability(9, 0)
    p.get_device_name = lambda device_id=0: "NVIDIA H200"
    p.is_arch_support_pdl = lambda: True


def trace_keys(rec: KeyRecorder, path: str) -> None:
    import torch
    from replay import Materializer, load_ops

    trace = json.load(gzip.open(path, "rt"))
    ops, mat = load_ops(), Materializer(torch, torch.device("cpu"), fill=False)
    extra = {"enable_stochastic_rounding": trace["ops"]["enable_stochastic_rounding"],
             "cache_philox_rounds": trace["ops"]["stochastic_rounding_philox_rounds"]}
    for step in trace["steps"]:
        rec.label = f"trace:{step['label']}"
        for call in step["calls"]:
            kwargs = {k: mat.value(v) for k, v in call["args"].items()}
            if call["op"] == "selective_state_update":
                kwargs.update(extra)
            ops[call["op"]](**kwargs)


def driver_keys(rec: KeyRecorder, model: str, plan_file: str | None = None) -> int:
    """The kernels driver's sweep for ``model`` (its stored plan, or ``plan_file``), every launch
    recorded; returns the number of steps."""
    from cachebake.vllm.kernels.engine_classes import plan_steps
    from cachebake.vllm.kernels.driver import load_plan
    from cachebake.vllm.kernels.mamba2_ops import EngineMixer

    _, plan, _ = load_plan(model, plan=plan_file)
    mixer = EngineMixer(plan, device="cpu", random_inputs=False)
    steps = plan_steps(plan, config_of=mixer.ssu_launch_config)
    for step in steps:
        rec.label = f"driver:{step.label}"
        mixer.run(step)
    return len(steps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args(argv)
    import vllm

    if not getattr(vllm, "OPS_ONLY", False):
        raise SystemExit("put the ops extract first on PYTHONPATH (CUDA code paths of the ops)")
    pretend_h200()
    rec = KeyRecorder()
    trace_keys(rec, args.trace)
    needed = {k: label for label, keys in rec.keys.items() for k in keys}
    rec.keys.clear()
    # vLLM's launch_autotuned remembers picked configs per process; a fresh process (the
    # driver's round) starts without them.
    from vllm.model_executor.layers.mamba.ops import triton_helpers

    triton_helpers._autotuned_configs.clear()
    driver_keys(rec, args.model)
    baked = rec.all()
    missing = {k: v for k, v in needed.items() if k not in baked}
    by_kernel = defaultdict(int)
    for k in missing:
        by_kernel[k[0]] += 1
    print(json.dumps({"trace": Path(args.trace).name, "model": args.model,
                      "trace_keys": len(needed), "driver_keys": len(baked),
                      "missing": len(missing), "missing_by_kernel": dict(by_kernel),
                      "missing_examples": sorted({v for v in missing.values()})[:10],
                      "missing_keys": [list(k) for k in sorted(missing)[:3]],
                      "driver_only": len(baked - set(needed))}))
    return 0 if not missing else 1


if __name__ == "__main__":
    sys.exit(main())
