"""Engine plans: what vLLM's serving engine hands its Mamba2 kernels, as plain data.

A Triton kernel is compiled per *specialization*: its constexpr arguments (the state views'
strides, the block-table width, the conv kernel width...), the dtypes of its tensors, the
16-byte alignment of every pointer and the value class of every integer (== 1, divisible
by 16, other).  vLLM derives all of them from the model config, the serve args and the GPU:
the attention block size is raised until one attention page holds a Mamba state, the Mamba
page is padded to it, and the states are views carved out of that paged buffer; prefix
caching switches the block table to one column per block; speculative decoding widens the
conv state and the decode rows; CUDA-graph capture sizes decide which batches run eagerly.

An *engine plan* is the result of that derivation, computed by vLLM itself
(``cachebake.vllm.kernels.plan.compute``, which needs the ``vllm`` package but no GPU) and stored as JSON
(per recipe variant beside the recipes, and in each bake's record), so that a GPU builder
with only torch and vLLM's Mamba2 ops bakes exactly what the engine launches.  Everything in
this module is pure data: no vllm, no torch.
"""

from __future__ import annotations

from typing import Any

from cachebake.errors import BadInput

PLAN_FORMAT = 1
PLAN_SECTIONS = ("model", "mixer", "kv_cache", "cache", "block_table", "scheduler", "cudagraph",
                 "warmup", "spec", "ops")

# The speculative-decoding setting the stored plans are computed with ("with speculative
# decoding"): n-gram drafting needs no draft model, so it fits any recipe.
SPEC_NGRAM: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": 3,
                              "prompt_lookup_max": 4, "prompt_lookup_min": 2}

# GPU memory classes: the hardware answers a plan is computed for.  The name and memory size
# pick vLLM's batch defaults (``EngineArgs.get_batch_defaults``); the compute capability picks
# kernel paths (Blackwell-only SSU configs, FA3).  Only Hopper is planned: the kernels driver
# replays FlashAttention-3's block sizes and the sm_90 op paths.
GPU_CLASSES: dict[str, dict[str, Any]] = {
    "h200": {"gpu_name": "NVIDIA H200", "memory_gib": 140.0, "capability": [9, 0]},
    "h100": {"gpu_name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.2, "capability": [9, 0]},
}
DEFAULT_GPU = "h200"
MAX_PLAN_BYTES = 4 << 20  # a plan file (`cachebake plan --json`): a few KB


def gpu_target(spec: str | float | int | None) -> dict[str, Any]:
    """A memory class name (``h200``) or a memory size in GiB (a Hopper GPU of that size)."""
    if spec is None or spec == "":
        spec = DEFAULT_GPU
    if isinstance(spec, str) and spec.lower() in GPU_CLASSES:
        return {"class": spec.lower(), **GPU_CLASSES[spec.lower()], "attention_backend": "FLASH_ATTN"}
    try:
        gib = float(spec)
    except (TypeError, ValueError):
        raise BadInput(f"--gpu-memory {spec!r}: give GiB (e.g. 80) or a class "
                       f"({', '.join(GPU_CLASSES)})") from None
    if not 1 <= gib <= 4096:
        raise BadInput(f"--gpu-memory {gib:g}: not a plausible GPU memory size in GiB")
    return {"class": None, "gpu_name": "NVIDIA Hopper GPU", "memory_gib": gib,
            "capability": [9, 0], "attention_backend": "FLASH_ATTN"}


def plan_key(tp: int, prefix_caching: bool, spec_decoding: bool) -> str:
    """How a stored plan is named inside its recipe variant."""
    return (f"tp={tp},prefix={'on' if prefix_caching else 'off'},"
            f"spec={'ngram' if spec_decoding else 'off'}")


def variant_serve_args(base: dict[str, Any], tp: int, prefix_caching: bool,
                       spec_decoding: bool) -> dict[str, Any]:
    """A recipe's serve args set to one stored-plan combination."""
    args = dict(base)
    args["tensor_parallel_size"] = tp
    args["enable_prefix_caching"] = prefix_caching
    if spec_decoding:
        args["speculative_config"] = dict(SPEC_NGRAM)
    else:
        args.pop("speculative_config", None)
    return args


def check_plan(plan: Any, where: str = "plan") -> dict[str, Any]:
    """A plan document as read from disk: the right format, the sections the driver reads."""
    if not isinstance(plan, dict):
        raise BadInput(f"{where}: not an engine plan (not a JSON object)")
    if plan.get("format") != PLAN_FORMAT:
        raise BadInput(f"{where}: engine plan format {plan.get('format')!r}, this cachebake "
                       f"reads format {PLAN_FORMAT}")
    missing = [s for s in PLAN_SECTIONS if not isinstance(plan.get(s), dict)]
    if missing:
        raise BadInput(f"{where}: engine plan lacks {', '.join(missing)}")
    return plan


def read_plan(path: str) -> dict[str, Any]:
    """A plan JSON file (``cachebake plan --json`` output or a bake record's ``plan``)."""
    import os

    from cachebake.errors import InvalidDocument
    from cachebake.jsonio import load_document

    try:  # the user named it, links included; FIFOs and devices refused, bounded and strict
        data = load_document(os.path.realpath(path), f"engine plan {path}", MAX_PLAN_BYTES,
                             missing=BadInput)
    except InvalidDocument as e:
        raise BadInput(f"{path}: not JSON: {e.reason}") from None
    if isinstance(data, dict) and "plan" in data and "format" not in data:
        data = data["plan"]  # a `cachebake plan --json` report, or a bake record
    return check_plan(data, path)
