"""Engine plans and the kernels driver against the real vLLM 0.33 (CPU is enough).

* every stored plan (cachebake/vllm/kernels/plans/) equals what vLLM computes now, for every
  recipe variant at TP 1/2/4/8, with and without speculative decoding and prefix caching;
  every stored refusal is still refused;
* the kernels driver's op calls equal, argument for argument (dtype, shape, strides, 16-byte
  alignment, integer values), the calls vLLM's own MambaMixer2 makes when vLLM's own metadata
  builder is fed the same engine steps (bench/engine_check/reference.py records them).

Run with the vllm venv:  PYTHONPATH=$PWD /work/venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_kernels_plan_vllm.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
vllm = pytest.importorskip("vllm", reason="the real vllm package is not installed")
torch = pytest.importorskip("torch")

from cachebake.errors import CachebakeError  # noqa: E402
from cachebake.vllm.kernels.plan.store import combinations, compute_variant, load_store  # noqa: E402
from cachebake.recipes import list_recipes, load_recipe  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "engine_check"))
from reference import ReferenceLayer, compare_calls, encode  # noqa: E402

pytestmark = pytest.mark.vllm
FAMILIES = sorted({r.name for r in list_recipes()})


@pytest.mark.parametrize("family", FAMILIES)
def test_stored_plans_equal_vllms_computation(family):
    store = load_store(family)
    assert store is not None, f"no stored plans for {family}: python -m cachebake.vllm.kernels.plan.store {family}"
    for recipe in (r for r in list_recipes() if r.name == family):
        stored = store["variants"][recipe.variant]
        assert sorted(stored) == sorted(name for name, _ in combinations(recipe))
        fresh = compute_variant(recipe)
        for name, entry in fresh.items():
            if "plan" in entry:
                assert stored[name].get("plan") == entry["plan"], f"{recipe.ref} {name} is stale"
            else:
                assert stored[name].get("refused") == entry["refused"], f"{recipe.ref} {name}"
        assert any("plan" in e for e in stored.values())


def test_refusals_are_vllms():
    """A refused combination is vLLM's refusal, one line, with a documented exit code."""
    from cachebake.vllm.kernels.plan import gpu_target
    from cachebake.vllm.kernels.plan.compute import compute_plan

    r = load_recipe("zamba2")
    with pytest.raises(CachebakeError, match="tensor parallel world size does not divide") as e:
        compute_plan(r.hf_config, dict(r.serve_args, tensor_parallel_size=4), gpu_target("h200"))
    assert int(e.value.code) == 3 and "\n" not in str(e.value)


# -- the driver's calls against vLLM's ---------------------------------------------------------

DRIVER_CASES = [  # (recipe, stored plan): align and none modes, TP, spec, replicated groups
    ("nemotron-h:8b", "tp=1,prefix=default,spec=off"),
    ("nemotron-h:8b", "tp=1,prefix=flipped,spec=off"),
    ("nemotron-h:8b", "tp=4,prefix=default,spec=ngram"),
    ("granite-4.0-h:tiny", "tp=2,prefix=default,spec=off"),
    ("falcon-h1:7b", "tp=4,prefix=flipped,spec=ngram"),
    ("mamba2:codestral-7b", "tp=1,prefix=default,spec=off"),
    ("zamba2:7b", "tp=1,prefix=default,spec=off"),
]


def _ref_blocks(step, plan):
    """Block-table rows for the reference: ids below its 32 blocks (values never compared)."""
    width = plan["block_table"]["width"]
    if step.capture or step.label.startswith("startup/capture/piecewise") or \
            step.label.startswith("startup/compile-warmup"):
        return [[0] * width for _ in step.rows]  # dummy batches: zeroed persistent tables
    return [[1 + (i * width + j) % 31 for j in range(width)] for i in range(len(step.rows))]


class _DriverRecording:
    """The kernels driver's EngineMixer on CPU with its ops replaced by the same recorders."""

    def __init__(self, plan):
        from reference import RECORDED_OPS, Recorder

        from cachebake.vllm.kernels.mamba2_ops import EngineMixer

        self.calls: list[dict] = []
        self.mixer = EngineMixer(plan, device="cpu", random_inputs=False)
        rec = {name: Recorder(name, self.calls, result) for name, result in RECORDED_OPS.items()}
        ops = plan["ops"]

        def ssu(*args, enable_stochastic_rounding, cache_philox_rounds, **kw):
            # TritonSSUBackend adds these from MambaConfig; the dispatch signature lacks them.
            assert enable_stochastic_rounding == ops["enable_stochastic_rounding"]
            assert cache_philox_rounds == ops["stochastic_rounding_philox_rounds"]
            return rec["selective_state_update"](*args, **kw)

        m = self.mixer
        m.conv_fn, m.conv_update = rec["causal_conv1d_fn"], rec["causal_conv1d_update"]
        m.scan, m.ssu = rec["mamba_chunk_scan_combined_varlen"], ssu
        m._store_checkpoint = rec["store_prefill_checkpoint"]

    def run(self, step) -> list[dict]:
        self.calls.clear()
        self.mixer.run(step)
        return list(self.calls)


@pytest.mark.parametrize("ref_name,key", DRIVER_CASES, ids=[f"{r}/{k}" for r, k in DRIVER_CASES])
def test_driver_calls_equal_vllms(ref_name, key):
    from cachebake.vllm.kernels.engine_classes import plan_steps

    recipe = load_recipe(ref_name)
    plan = load_store(recipe.name)["variants"][recipe.variant][key]["plan"]
    driver = _DriverRecording(plan)
    checked = 0
    with ReferenceLayer(plan, recipe.hf_config) as ref:
        warm = ref.ssd_warmup()
        ours = []
        for step in plan_steps(plan):
            if step.kind == "ssd_warmup":
                ours += driver.run(step)
        assert compare_calls(warm, ours) == [], "profile-run SSD warm-up differs"
        for step in plan_steps(plan):
            if step.kind != "forward":
                continue
            rows = [(r.computed, r.scheduled, r.prefilling) for r in step.rows]
            _, theirs = ref.forward(rows, _ref_blocks(step, plan), capture=step.capture,
                                    profiling=step.profiling)
            diffs = compare_calls(theirs, driver.run(step))
            assert diffs == [], f"{step.label}: " + "; ".join(diffs[:4])
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("key", ["tp=1,prefix=default,spec=off", "tp=1,prefix=default,spec=ngram"])
def test_reachable_steps_calls_equal_vllms(key):
    """The coverage proof's reachable steps (engine_classes.reachable_steps, whose keys
    bench/engine_check/reachable_keys.py checks against the sweep's) are steps vLLM's own
    builder and mixer turn into the same calls: a spread sample of ~150, the largest decode-only
    and mixed batches and the largest warm-up batch included."""
    from cachebake.vllm.kernels.engine_classes import reachable_steps

    recipe = load_recipe("nemotron-h:8b")
    plan = load_store(recipe.name)["variants"][recipe.variant][key]["plan"]
    steps = [s for s in reachable_steps(plan)
             if s.kind == "forward" and not s.label.startswith(("reach/startup/", "reach/n=1/"))]
    last = {prefix: s for s in steps for prefix in ("reach/decode/", "reach/mixed/", "reach/n=")
            if s.label.startswith(prefix)}
    sample = steps[:: max(1, len(steps) // 150)] + list(last.values())
    driver = _DriverRecording(plan)
    with ReferenceLayer(plan, recipe.hf_config) as ref:
        for step in sample:
            rows = [(r.computed, r.scheduled, r.prefilling) for r in step.rows]
            _, theirs = ref.forward(rows, _ref_blocks(step, plan))
            diffs = compare_calls(theirs, driver.run(step))
            assert diffs == [], f"{step.label}: " + "; ".join(diffs[:4])
    assert len(sample) > 100


def test_batch_defaults_are_the_targets():
    """Serve args that leave max_num_seqs / max_num_batched_tokens to vLLM get the target GPU's
    defaults (EngineArgs.get_batch_defaults by its name and memory), not the CPU tier of the
    machine computing the plan; the platform is the CPU one again afterwards."""
    from vllm.platforms import current_platform

    from cachebake.vllm.kernels.plan import gpu_target
    from cachebake.vllm.kernels.plan.compute import compute_plan

    r = load_recipe("nemotron-h:8b")
    args = {k: v for k, v in r.serve_args.items() if k not in ("max_num_seqs", "max_num_batched_tokens")}
    sched = lambda p: (p["scheduler"]["max_num_seqs"], p["scheduler"]["max_num_batched_tokens"])  # noqa: E731
    h200 = compute_plan(r.hf_config, args, gpu_target("h200"))
    assert sched(h200) == (1024, 8192) and h200["cudagraph"]["decode_cudagraph_max_bs"] == 512
    assert sched(compute_plan(r.hf_config, args, gpu_target("40"))) == (256, 2048)
    assert current_platform.is_cpu()


def test_the_checks_default_seqs_plan_is_vllms():
    """bench/engine_check/plans/ holds what `cachebake plan --serve-args '{"max_num_seqs": null}'`
    computes for Nemotron-H 8B on an H200 (vLLM's own default, 1024 sequences)."""
    import json

    from cachebake.vllm.kernels.plan import gpu_target
    from cachebake.vllm.kernels.plan.compute import compute_plan

    path = Path(__file__).resolve().parent.parent / "bench/engine_check/plans/nemotron-h-8b-max-num-seqs-default.json"
    stored = json.loads(path.read_text())["plan"]
    r = load_recipe("nemotron-h:8b")
    args = {**r.serve_args, "max_num_seqs": None}
    assert compute_plan(r.hf_config, args, gpu_target("h200"), recipe=r.ref) == stored


def test_encoder_describes_layouts():
    base = torch.zeros(10, 8, dtype=torch.int32)
    view = base[3:, 1]
    d = encode(view)
    assert (d["shape"], d["stride"], d["offset"], d["align16"]) == ([7], [8], 25, (25 * 4) % 16)
    assert d["values"] == [0] * 7
