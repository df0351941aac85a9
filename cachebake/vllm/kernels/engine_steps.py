"""The engine steps a vLLM server runs through its Mamba2 layers, from an engine plan.

A step is one forward pass as the Mamba2 metadata builder sees it: the batch's request rows
(decodes first, as vLLM's input batch orders them) with each row's tokens already in its
state and tokens scheduled now.  ``startup_steps`` and ``serving_steps`` list, in engine order:

start-up (what ``vllm serve`` runs before it accepts a request, Model Runner V2):
  * the profile run: ``MambaMixer2._warmup_ssd_kernels``, four SSD scans on plain
    contiguous tensors (initial states on/off x final states on/off);
  * compile-size dummy runs (only when a compile range holds no capture size);
  * ``warmup_kernels``: one prefill of ``num_reqs`` prompts, then decodes of all, two and
    one of them (and their speculative variants);
  * CUDA-graph capture: every PIECEWISE size (dummy batches spread over at most
    ``max_num_seqs`` requests: sizes above it are partly or wholly prefills) and every FULL
    uniform-decode size.  The memory-profiling capture before it repeats a subset of these
    on a smaller KV cache; it only matters when that cache has a single block.

serving (what users' traffic adds; every step is one the scheduler can form, its rows in
Model Runner V2's batch order, ``batch_order``):
  * first prefills of one prompt around the SSD chunk boundaries and of several prompts;
  * prompts longer than ``max_num_batched_tokens``: the first chunk, then continuations
    that start from the saved state (``HAS_INITSTATES``), on and off a chunk boundary;
  * mixed steps, decodes before a prefill (of 100 tokens, resumed, or a one-token prompt),
    for every joint 16-byte alignment class of the pointers that move with the decode rows
    (the prefill's state indices are ``table[num_decodes:, 0]``) and decode tokens (its rows
    of in_proj's and the SSD output);
  * with prefix caching ("align" mode): prefills that take a mid-prefill checkpoint, and
    prefix-cache hits that resume from a cached block;
  * with speculative decoding: decode rows of ``1 + k`` tokens (and rows the drafter gave
    nothing), mixed and in non-uniform decode batches.

Batch sizes are not sampled here: which decode-row counts the engine can launch with (every
warm-up batch the KV cache can make, every decode-only and mixed batch) and one step per
specialization class they fall into are ``engine_classes``'s, whose ``plan_steps`` is the
sweep.  Pure: no torch, no vllm.  ``mamba_metadata.build_metadata`` turns a step into the
tensors' values and layouts vLLM's builder makes; ``mamba2_ops`` runs it on the GPU.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Row:
    """One request in a step: ``computed`` tokens already in its state, ``scheduled`` now;
    ``prefilling`` as vLLM's input batch says (its prompt is not done)."""

    computed: int
    scheduled: int
    prefilling: bool

    @property
    def seq_len(self) -> int:
        return self.computed + self.scheduled


@dataclass(frozen=True)
class Step:
    label: str
    phase: str  # "startup" or "serve"
    kind: str = "forward"  # "forward" (through the metadata builder) or "ssd_warmup"
    rows: tuple[Row, ...] = ()
    capture: bool = False  # a FULL-graph capture: build_for_cudagraph_capture
    profiling: bool = False  # the memory-profiling capture's KV cache (see module doc)
    ssd_variant: tuple[bool, bool] | None = None  # (initial states, final states)
    notes: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_tokens(self) -> int:
        return sum(r.scheduled for r in self.rows)


def batch_order(rows, decode_query_len: int) -> tuple[Row, ...]:
    """Model Runner V2's batch order (sort_batch_req_ids in vllm/v1/worker/gpu/model_runner.py):
    rows with speculative drafts first, then rows of exactly ``decode_query_len`` tokens, then
    by token count; ties keep the scheduler's order.  A decoding row of n > 1 tokens carries
    n - 1 drafts."""
    def key(r: Row):
        drafts = r.scheduled - 1 if not r.prefilling and r.scheduled > 1 else 0
        return (not drafts, r.scheduled != decode_query_len, r.scheduled)

    return tuple(sorted(rows, key=key))


def _dummy_rows(num_reqs: int, num_tokens: int) -> tuple[Row, ...]:
    """InputBatch.make_dummy: tokens spread evenly, the remainder on the last rows; no
    prior state and nothing marked prefilling (vllm/v1/worker/gpu/input_batch.py)."""
    base, extra = divmod(num_tokens, num_reqs)
    return tuple(Row(0, base + (i >= num_reqs - extra), False) for i in range(num_reqs))


def _lens_label(lens) -> str:
    parts = []
    for n, run in itertools.groupby(lens):
        k = len(list(run))
        parts.append(f"{n}x{k}" if k > 2 else "+".join([str(n)] * k))
    return "+".join(parts)


def startup_steps(plan: dict[str, Any]) -> list[Step]:
    cg, warm = plan["cudagraph"], plan["warmup"]
    max_reqs = plan["scheduler"]["max_num_seqs"]
    steps = [Step(f"startup/profile-run/ssd-warmup/init={int(i)}/final={int(f)}", "startup",
                  kind="ssd_warmup", ssd_variant=(i, f))
             for i, f in itertools.product((False, True), repeat=2)]

    if cg["captures"]["FULL"] or cg["captures"]["PIECEWISE"]:
        if cg.get("profiling_num_blocks") == 1:
            # The profiling KV cache has one block: num_cache_lines == 1 is a specialization.
            steps += _capture_steps(plan, profiling=True)

    for size in warm.get("compile_sizes", []):
        reqs = min(size, max_reqs)
        steps.append(Step(f"startup/compile-warmup/tokens={size}", "startup",
                          rows=_dummy_rows(reqs, size)))

    steps += warmup_kernels_steps(plan, warm["num_reqs"])
    steps += _capture_steps(plan, profiling=False)
    return steps


def warmup_kernels_steps(plan: dict[str, Any], n: int) -> list[Step]:
    """warmup_kernels (vllm/v1/worker/gpu/warmup.py) with a batch of ``n`` requests, before
    capture (nothing replays yet): one prefill of ``n`` prompts, then decodes of all, two and
    one of them.  ``n`` is what the KV block count allows (the plan's estimate; the real one
    depends on the GPU's free memory, see ``engine_classes.warmup_batch_cap``)."""
    spec, plen = plan["spec"], plan["warmup"]["prompt_len"]
    q = spec["decode_query_len"]
    steps = [Step(f"startup/warmup-kernels/prefill/{n}x{plen}", "startup",
                  rows=tuple(Row(0, plen, True) for _ in range(n)))]
    k = spec["num_speculative_tokens"]
    decode_shapes: list[tuple[int, ...]] = [tuple([q if k else 1] * n)]
    if n >= 2:
        decode_shapes.append((q, 1) if k else (1, 1))
        if k:
            decode_shapes.append((1, 1))
    if n > 1 or k:
        decode_shapes.append((q,) if k else (1,))
        if k:
            decode_shapes.append((1,))
    computed = plen
    seen = set()
    for shape in decode_shapes:
        if shape in seen:
            continue
        seen.add(shape)
        steps.append(Step(f"startup/warmup-kernels/decode/{_lens_label(shape)}", "startup",
                          rows=batch_order([Row(computed, t, False) for t in shape], q)))
        computed += q
    return steps


def _capture_steps(plan: dict[str, Any], profiling: bool) -> list[Step]:
    """CudaGraphManager.capture: PIECEWISE descriptors, then FULL ones (the profiling pass
    captures only the first, largest, FULL ones)."""
    cg, max_reqs = plan["cudagraph"], plan["scheduler"]["max_num_seqs"]
    tag = "profiling-capture" if profiling else "capture"
    steps = []
    for d in cg["captures"]["PIECEWISE"]:
        t = d["num_tokens"]
        steps.append(Step(f"startup/{tag}/piecewise/tokens={t}", "startup",
                          rows=_dummy_rows(min(t, max_reqs), t), profiling=profiling))
    full = cg["captures"]["FULL"]
    if profiling:
        full = full[: cg.get("profiling_full_captures", 2)]
    for d in full:
        reqs, t = d["num_reqs"], d["num_tokens"]
        steps.append(Step(f"startup/{tag}/full/reqs={reqs}/tokens={t}", "startup",
                          rows=_dummy_rows(reqs, t), capture=True, profiling=profiling))
    return steps


def alignment_periods(plan: dict[str, Any]) -> tuple[int, int]:
    """(rows, tokens): after how many decode rows, and how many decode tokens, the pointers
    that move with them are back in the same 16-byte alignment class.  Rows move the
    prefill's state indices (``table[num_decodes:, 0]``, int32, one table row per request);
    tokens move the prefill's rows of in_proj's output (conv input, dt) and of the SSD output."""
    mx, bt = plan["mixer"], plan["block_table"]
    itemsize = 2 if plan["model"]["dtype"] in ("bfloat16", "float16") else 4
    table_cols = bt["state_columns"] if plan["cache"]["mamba_cache_mode"] == "align" else bt["width"]
    period = lambda nbytes: 16 // math.gcd(16, nbytes)  # noqa: E731
    rows = period(4 * table_cols)
    tokens = math.lcm(period(mx["in_proj_width"] * itemsize), period(mx["intermediate"] * itemsize))
    return rows, tokens


def decode_shapes(plan: dict[str, Any]) -> list[tuple[int, ...]]:
    """Decode parts of mixed steps (tokens per decode row) that together meet every joint
    alignment class of (decode rows, decode tokens) the engine can form: a decode row
    carries 1 token, or 1 + j with j <= k speculative drafts."""
    rows_p, tok_p = alignment_periods(plan)
    q = plan["spec"]["decode_query_len"]
    out = []
    for nd in range(1, math.lcm(rows_p, tok_p) + 1):
        seen: set[int] = set()
        for ndt in range(nd, nd * q + 1):
            if ndt % tok_p in seen:
                continue
            seen.add(ndt % tok_p)
            base, extra = divmod(ndt, nd)  # spread over the rows, every row 1..q tokens
            out.append(tuple(base + (i < extra) for i in range(nd)))
    return out


def serving_steps(plan: dict[str, Any]) -> list[Step]:
    sched, mx, spec, cache = plan["scheduler"], plan["mixer"], plan["spec"], plan["cache"]
    c, budget, max_reqs = mx["chunk_size"], sched["max_num_batched_tokens"], sched["max_num_seqs"]
    max_len = sched["max_model_len"]
    k, q = spec["num_speculative_tokens"], spec["decode_query_len"]
    align = cache["mamba_cache_mode"] == "align"
    blk = plan["kv_cache"]["mamba_block_size"]
    steps: list[Step] = []

    def add(label: str, rows: list[Row], **kw) -> None:
        if not rows or sum(r.scheduled for r in rows) > budget or len(rows) > max_reqs:
            return
        if any(r.seq_len > max_len for r in rows):
            return
        steps.append(Step(label, "serve", rows=batch_order(rows, q), **kw))

    # One prompt, first chunk: lengths below, at and above one and two SSD chunks.
    for n in sorted({1, 17, 100, c - 1, c, c + 1, 2 * c + 1, 4 * c + 3, budget}):
        if n >= 1:
            add(f"serve/prefill/len={n}", [Row(0, n, True)])
    # Several prompts in one step (the scheduler packs new requests together).
    for lens in ((300, 57), (c - 1, c + 1), (5, 3, 7, 1)):
        add(f"serve/prefill/lens={_lens_label(lens)}", [Row(0, n, True) for n in lens])

    # Prompts longer than the token budget: the continuation starts from the saved state,
    # on a chunk boundary (a full first chunk) and off it (decodes took part of a budget).
    if max_len > budget + 1:
        rest = min(budget, max_len - budget) - 1
        add(f"serve/chunked/continue/computed={budget}/len={rest}", [Row(budget, rest, True)])
    # A prompt split because decodes took part of the budget continues off a chunk boundary.
    off = min(budget, max_len) - 37
    add(f"serve/chunked/continue/computed={off}/len=36", [Row(off, 36, True)])

    # Mixed steps: decodes, then one prefill, for every joint alignment class of the pointers
    # that move with the decode rows and tokens, with the prefill fresh and continuing.
    decoding = lambda shape: [Row(1000 + i, t, False) for i, t in enumerate(shape)]  # noqa: E731
    # A one-token prompt is its own class for causal_conv1d_fn: its output is
    # torch.empty_like of a (dim, 1) slice of in_proj's output, which keeps that slice's
    # token stride (the in_proj width) where longer prefills get the conv width.
    shapes = decode_shapes(plan)
    for shape in shapes:
        tag = f"decodes={len(shape)}" + (f"x{sum(shape)}tok" if k else "")
        add(f"serve/mixed/{tag}/prefill=100", decoding(shape) + [Row(0, 100, True)])
        add(f"serve/mixed/{tag}/prefill=1", decoding(shape) + [Row(0, 1, True)])
        add(f"serve/mixed/{tag}/continue=100@{c + 37}", decoding(shape) + [Row(c + 37, 100, True)])

    if align:
        # A prefill spanning more than two Mamba blocks checkpoints the block-boundary state
        # mid-prefill (store_prefill_checkpoint); a prefix-cache hit resumes at a block.
        long = min(budget, max_len - 1, 2 * blk + 2 * c + 5)
        add(f"serve/prefix/checkpoint/len={long}", [Row(0, long, True)])
        for shape in shapes:
            tag = f"decodes={len(shape)}" + (f"x{sum(shape)}tok" if k else "")
            add(f"serve/prefix/checkpoint/{tag}/len={long}", decoding(shape) + [Row(0, long, True)])
        hit = blk
        add(f"serve/prefix/hit/computed={hit}/len=100", [Row(hit, 100, True)])
        long_hit = min(budget, max_len - hit - 1, 2 * blk + 5)
        add(f"serve/prefix/hit/computed={hit}/len={long_hit}", [Row(hit, long_hit, True)])

    if k:
        # Speculative decoding: a decode batch where some requests got no drafts is not the
        # uniform shape the FULL graphs hold; it runs eagerly.
        for n_spec, n_plain in ((1, 1), (2, 1), (1, 3)):
            rows = [Row(1000 + i, q, False) for i in range(n_spec)]
            rows += [Row(2000 + i, 1, False) for i in range(n_plain)]
            add(f"serve/spec/decode/{n_spec}x{q}+{n_plain}x1", rows)
        add(f"serve/spec/mixed/{q}+1+prefill=100",
            [Row(1000, q, False), Row(2000, 1, False), Row(0, 100, True)])
    return steps
