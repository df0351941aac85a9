"""The `kernels` driver: sweep vLLM's own Mamba2 Triton ops at a model's real shapes.

Why: a vLLM server compiles a Mamba2 kernel variant the first time a request meets a new
specialization (a prefill length's alignment, HAS_INITSTATES after chunked prefill or a
prefix hit, a decode batch size past CUDA-graph capture, a conv input pointer's alignment).
vLLM's own warmups leave many of these to the first users.  This driver calls the ops the way
``MambaMixer2.conv_ssm_forward`` (vllm 0.33) calls them, at the shapes a model's config.json
gives, through every such case, so that a bake holds them all.

``plan_sweep`` is pure (no torch, no vllm) and testable on CPU; ``run_sweep`` needs a CUDA GPU
(the op calls live in ``mamba2_ops``) and ``vllm.model_executor.layers.mamba.ops`` importable (a full vllm install, or the ops-only
extract that bench/vllm_ops/make_vllm_ops.py builds).  Each case sets ``CACHEBAKE_STEP`` to
its label before it runs, so the compile monitor can say which step compiled what.

Not covered here (vLLM engine only): the prefix-caching checkpoint kernels (ssd_checkpoint),
ReplaySSM / speculative-decode variants, Inductor's kernels for the gated norm when
n_groups > 1, and the exact paged strides of vLLM's KV-cache views (states here are plain
contiguous tensors, so conv kernels whose state strides are constexpr may differ from an
engine's).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from cachebake.capture.env import STEP_ENV  # the monitor labels events with it
from cachebake.errors import BadInput


# config.json spellings of each field across Mamba2-family models (NemotronH, Mamba2, Bamba /
# Granite-4 / FalconH1), first match wins.
_KEYS = {
    "num_heads": ("mamba_num_heads", "mamba_n_heads", "num_heads"),
    "head_dim": ("mamba_head_dim", "mamba_d_head", "head_dim"),
    "n_groups": ("n_groups", "mamba_n_groups"),
    "d_state": ("ssm_state_size", "mamba_d_state", "state_size"),
    "conv_kernel": ("conv_kernel", "mamba_d_conv"),
    "chunk_size": ("mamba_chunk_size", "chunk_size"),
    "activation": ("mamba_hidden_act", "hidden_act"),
    "use_conv_bias": ("use_conv_bias", "mamba_conv_bias"),
    "rms_norm_eps": ("layer_norm_epsilon", "rms_norm_eps"),
    "dtype": ("torch_dtype", "dtype"),
}
_DEFAULTS = {"chunk_size": 2048, "activation": "silu", "use_conv_bias": True,
             "rms_norm_eps": 1e-5, "dtype": "bfloat16"}


def _cfg_get(cfg: dict, field: str):
    for key in _KEYS[field]:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    if field in _DEFAULTS:
        return _DEFAULTS[field]
    raise BadInput(f"model config has none of {', '.join(_KEYS[field])}")


@dataclass(frozen=True)
class ModelShapes:
    """A Mamba2 mixer's shapes as the whole model has them, plus the TP size to split for.

    The ``rank_*`` properties are what one TP rank's kernels see (vLLM shards heads, and
    groups when TP divides them; a single group is replicated)."""

    name: str
    num_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    conv_kernel: int
    chunk_size: int
    activation: str = "silu"
    use_conv_bias: bool = True
    rms_norm_eps: float = 1e-5
    act_dtype: str = "bfloat16"
    conv_state_dtype: str = "bfloat16"
    ssm_state_dtype: str = "float32"
    tp: int = 1

    @classmethod
    def from_config(cls, cfg: dict, tp: int = 1, name: str | None = None) -> ModelShapes:
        dtype = str(_cfg_get(cfg, "dtype")).removeprefix("torch.")
        ssm_dtype = str(cfg.get("mamba_ssm_cache_dtype") or "auto")
        if ssm_dtype == "auto":  # vLLM: the model dtype, except NemotronH's float32 default
            ssm_dtype = "float32" if cfg.get("model_type") == "nemotron_h" else dtype
        shapes = cls(
            name=name or cfg.get("model_type", "model"),
            num_heads=int(_cfg_get(cfg, "num_heads")),
            head_dim=int(_cfg_get(cfg, "head_dim")),
            n_groups=int(_cfg_get(cfg, "n_groups")),
            d_state=int(_cfg_get(cfg, "d_state")),
            conv_kernel=int(_cfg_get(cfg, "conv_kernel")),
            chunk_size=int(_cfg_get(cfg, "chunk_size")),
            activation=str(_cfg_get(cfg, "activation")),
            use_conv_bias=bool(_cfg_get(cfg, "use_conv_bias")),
            rms_norm_eps=float(_cfg_get(cfg, "rms_norm_eps")),
            act_dtype=dtype,
            conv_state_dtype=dtype,
            ssm_state_dtype=ssm_dtype,
        )
        return shapes.with_tp(tp)

    def with_tp(self, tp: int) -> ModelShapes:
        """These shapes split for `tp` ranks; refuses what vLLM's MambaMixer2 refuses."""
        if tp < 1:
            raise BadInput(f"tp must be >= 1, got {tp}")
        if self.num_heads % tp:
            raise BadInput(f"{self.name}: {self.num_heads} Mamba heads do not divide by tp={tp}")
        if self.n_groups % tp and self.n_groups != 1:
            raise BadInput(f"{self.name}: {self.n_groups} groups do not divide by tp={tp} "
                           "(vLLM replicates groups only when there is one)")
        if self.num_heads % self.n_groups:
            raise BadInput(f"{self.name}: {self.num_heads} heads do not divide into "
                           f"{self.n_groups} groups")
        if self.chunk_size <= 0 or self.chunk_size & (self.chunk_size - 1):
            raise BadInput(f"{self.name}: chunk_size {self.chunk_size} is not a power of 2")
        return replace(self, tp=tp)

    # What one rank sees.
    @property
    def rank_heads(self) -> int:
        return self.num_heads // self.tp

    @property
    def rank_groups(self) -> int:
        return 1 if self.n_groups % self.tp else self.n_groups // self.tp

    @property
    def rank_intermediate(self) -> int:
        return self.rank_heads * self.head_dim

    @property
    def rank_conv_dim(self) -> int:
        return self.rank_intermediate + 2 * self.rank_groups * self.d_state

    @property
    def rank_proj_dim(self) -> int:
        """Width of in_proj's output on one rank: gate z, then x|B|C, then dt."""
        return self.rank_intermediate + self.rank_conv_dim + self.rank_heads

    @property
    def uses_triton_gated_norm(self) -> bool:
        """Mixer2RMSNormGated.forward_cuda calls rms_norm_gated only for one group;
        otherwise it runs torch ops (forward_native)."""
        return self.n_groups == 1 and self.tp == 1


@dataclass(frozen=True)
class SweepCase:
    """One mixer step.  kind: "prefill" (conv + SSD scan over varlen sequences), "decode"
    (conv update + selective state update), "mixed" (decodes then prefills in one step, as
    vLLM orders them), "conv" (causal_conv1d_fn alone with its input at an element offset)."""

    label: str
    kind: str
    seq_lens: tuple[int, ...] = ()  # new tokens of each prefill sequence
    computed: tuple[int, ...] = ()  # tokens already in each sequence's state (> 0: initial state)
    final_states: bool = True  # the scan writes final states into the cache (False: returns them)
    decode_batch: int = 0
    conv_offset: int = 0  # elements the conv input is shifted from an aligned base

    @property
    def has_initial_states(self) -> bool:
        return any(c > 0 for c in self.computed)

    @property
    def num_tokens(self) -> int:
        return self.decode_batch + sum(self.seq_lens)


def _lens_label(lens: tuple[int, ...]) -> str:
    """'300+57', with runs of one length written '128x64'."""
    parts = []
    for n, run in itertools.groupby(lens):
        k = len(list(run))
        parts.append(f"{n}x{k}" if k > 2 else "+".join([str(n)] * k))
    return "+".join(parts)


def _prefill(lens: tuple[int, ...], computed: tuple[int, ...] | None = None,
             final: bool = True, kind: str = "prefill", decode: int = 0) -> SweepCase:
    computed = computed or (0,) * len(lens)
    label = f"{kind}/lens={_lens_label(lens)}"
    if any(computed):
        label += f"/computed={_lens_label(computed)}"
    if not final:
        label += "/final=returned"
    if decode:
        label = f"{kind}/decode={decode}/" + label.split("/", 1)[1]
    return SweepCase(label, kind, tuple(lens), tuple(computed), final, decode_batch=decode)


def plan_sweep(shapes: ModelShapes, tp: int | None = None, max_num_seqs: int = 256,
               max_num_batched_tokens: int = 8192) -> list[SweepCase]:
    """Every case one round runs, in order.  tp None: shapes.tp.  Pure: no torch, no GPU."""
    shapes = shapes.with_tp(shapes.tp if tp is None else tp)
    if max_num_seqs < 1 or max_num_batched_tokens < 1:
        raise BadInput("max_num_seqs and max_num_batched_tokens must be >= 1")
    c, budget = shapes.chunk_size, max_num_batched_tokens
    cases: list[SweepCase] = []

    # Single prefills below, at and above one and two chunk boundaries, odd and 16-aligned.
    lengths = {1, 17, 100, c // 2, c - 1, c, c + 1, 2 * c - 1, 2 * c, 2 * c + 1, 4096, budget}
    for n in sorted(x for x in lengths if 1 <= x <= budget):
        cases.append(_prefill((n,)))

    # Multi-sequence varlen batches (the scheduler packs several prompts in one step).
    batches = [(300, 57), (c - 1, c + 1), (c, c, c), (1, c, 2 * c + 1), (5, 3, 7, 1)]
    per_seq = max(1, budget // min(max_num_seqs, 64))
    batches.append((per_seq,) * min(max_num_seqs, 64, budget // per_seq))
    for lens in batches:
        if sum(lens) <= budget and len(lens) <= max_num_seqs:
            cases.append(_prefill(lens))

    # HAS_INITSTATES x final-state variants (vLLM's _warmup_ssd_kernels covers the same four
    # at one shape): chunked-prefill continuations and prefix hits, chunk-aligned and not,
    # alone and mixed with fresh sequences; the scan either writes final states into the
    # cache or returns them (vLLM's prefix-caching checkpoint path).
    for final in (True, False):
        if not final:
            cases.append(_prefill((c,), final=False))
            cases.append(_prefill((300, 57), final=False))
        cases.append(_prefill((100,), (c,), final=final))
        cases.append(_prefill((c + 1,), (37,), final=final))
        cases.append(_prefill((300, 57), (0, 200), final=final))
        cases.append(_prefill((c, 2 * c), (2 * c, c), final=final))

    # The conv prefill with its input pointer at every alignment an element can have (bf16:
    # 8 per 16 bytes), which changes Triton's divisibility specialization of x_ptr.
    for offset in range(8):
        cases.append(SweepCase(f"conv/offset={offset}/lens=100", "conv", (100,), (0,),
                               conv_offset=offset))

    # Decode: every batch size the scheduler can form, so every N specialization (1, 16k,
    # other) and every row of the per-GPU selective_state_update config table is met.
    for bs in range(1, max_num_seqs + 1):
        cases.append(SweepCase(f"decode/bs={bs}", "decode", decode_batch=bs))

    # Mixed steps: decodes first, prefills after them in the same buffers.
    for d, lens, computed in ((1, (100,), (0,)), (3, (c + 1,), (c,)), (16, (300, 57), (0, 200))):
        if d + len(lens) <= max_num_seqs and d + sum(lens) <= budget:
            cases.append(_prefill(lens, computed, kind="mixed", decode=d))
    return cases


def chunk_metadata(chunk_size: int, computed: tuple[int, ...], lens: tuple[int, ...]
                   ) -> tuple[list[int], list[int], list[int]]:
    """(cu_chunk_seqlens, seq_idx, last_chunk_indices) as vLLM's Mamba2 metadata builder
    makes them: chunks hold one sequence and end on multiples of chunk_size of the
    sequence's absolute positions (mamba_attn.py _compute_chunk_metadata, no checkpoints)."""
    cu, seq_idx, last = [], [], []
    pos = 0
    for i, (done, new) in enumerate(zip(computed, lens)):
        if done % chunk_size:
            take = min(math.ceil(done / chunk_size) * chunk_size - done, new)
            seq_idx.append(i)
            cu.append(pos)
            pos += take
            new -= take
        for _ in range(math.ceil(new / chunk_size)):
            take = min(chunk_size, new)
            seq_idx.append(i)
            cu.append(pos)
            pos += take
            new -= take
        last.append(len(cu) - 1)
    cu.append(pos)
    return cu, seq_idx, last


def load_shapes(model: str, tp: int = 1) -> ModelShapes:
    """A recipe (``nemotron-h``, ``granite-4.0-h:tiny``), a model directory or a config.json:
    cachebake.recipes resolves all three, so the kernels and vllm drivers read one model."""
    from cachebake.recipes import load_recipe

    recipe = load_recipe(model)
    cfg = recipe.hf_config
    if "text_config" in cfg and not any(k in cfg for k in _KEYS["num_heads"]):
        cfg = cfg["text_config"]  # multimodal wrappers keep the language model's config inside
    return ModelShapes.from_config(cfg, tp, name=recipe.name)


def sweep_limits(model: str, tp: int | None = None, serve_args=None) -> tuple[int, int, int]:
    """(tp, max_num_seqs, max_num_batched_tokens): the recipe's serving defaults, overridden
    by ``serve_args`` (dict, JSON or ``vllm serve`` flags) and ``tp``."""
    from cachebake.drivers.vllm_args import parse_serve_args
    from cachebake.recipes import load_recipe

    args = dict(load_recipe(model).serve_args)
    if serve_args:
        args.update(parse_serve_args(serve_args) if isinstance(serve_args, str) else serve_args)
    tp = tp if tp is not None else int(args.get("tensor_parallel_size", 1))
    return tp, int(args.get("max_num_seqs", 256)), int(args.get("max_num_batched_tokens", 8192))


def run_sweep(model: str = "nemotron-h", tp: int | None = None, *, serve_args=None,
              max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
              on_case: Callable[[SweepCase], None] | None = None, verbose: bool = True) -> None:
    """Run one round of the sweep on the current CUDA device, each case labeled.  Limits come
    from the recipe's serve args unless given."""
    import torch

    tp, seqs, tokens = sweep_limits(model, tp, serve_args)
    max_num_seqs = max_num_seqs or seqs
    max_num_batched_tokens = max_num_batched_tokens or tokens
    shapes = load_shapes(model, tp)
    cases = plan_sweep(shapes, tp, max_num_seqs, max_num_batched_tokens)
    from cachebake.drivers.mamba2_ops import Mamba2Mixer

    mixer = Mamba2Mixer(shapes, num_slots=max_num_seqs + 1)
    timings: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    for case in cases:
        os.environ[STEP_ENV] = case.label
        if on_case is not None:
            on_case(case)
        t = time.perf_counter()
        mixer.step(case)
        torch.cuda.synchronize()
        timings.append((time.perf_counter() - t, case.label))
    os.environ.pop(STEP_ENV, None)
    if verbose:
        total = time.perf_counter() - t0
        slow = ", ".join(f"{label} {sec:.2f}s" for sec, label in sorted(timings, reverse=True)[:5])
        print(f"kernels sweep {shapes.name} tp={tp}: {len(cases)} cases in {total:.2f}s "
              f"(first {timings[0][0]:.2f}s; slowest: {slow})", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m cachebake.drivers.kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nemotron-h", help="known name or path to config.json")
    ap.add_argument("--tp", type=int, default=None)
    ap.add_argument("--serve-args", default=None, help="JSON or vllm serve flags (default: the recipe's)")
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--plan", action="store_true", help="print the cases and exit (no GPU)")
    args = ap.parse_args(argv)
    if args.plan:
        tp, seqs, tokens = sweep_limits(args.model, args.tp, args.serve_args)
        for case in plan_sweep(load_shapes(args.model, tp), tp, args.max_num_seqs or seqs,
                               args.max_num_batched_tokens or tokens):
            print(case.label)
        return
    run_sweep(args.model, args.tp, serve_args=args.serve_args, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens)


if __name__ == "__main__":
    main()
