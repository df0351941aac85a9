"""Specialization classes of the engine's Mamba2 launches, and the sweep: one step per class.

Triton 3.6 compiles a kernel once per key, and the key holds every argument's
*specialization*, made by the binder ``create_function_from_signature`` (triton/runtime/jit.py)
with the C++ ``specialize_impl`` (triton python/src/specialize.cc, ``handle_long_type`` and
``handle_tensor``; the Python rule is ``BaseBackend.get_int_specialization`` /
``get_tensor_specialization`` in triton/backends/compiler.py):

* an int equal to 1 is the constant 1; any other int is typed by its range (i32 when it fits
  in int32, else i64, else u64) and marked ``D`` (``tt.divisibility = 16``) when it is a
  multiple of 16.  A parameter in ``do_not_specialize`` keeps only its type (no ``== 1``, no
  ``D``); one in ``do_not_specialize_on_alignment`` keeps ``== 1`` but never gets ``D``;
* a tensor is its pointer type (the dtype) plus ``D`` when ``data_ptr() % 16 == 0``;
* None is the constant None, a ``tl.constexpr`` its value, and the launch options
  (num_warps, num_stages) are part of the key.

vLLM 0.33's Mamba2 ops (vllm/model_executor/layers/mamba/ops/) let a step's composition --
how many decode rows, how many decode tokens before the prefill rows, whether a prefill
resumes a state -- reach those arguments in these places only (every other argument is a
model dimension, a stride of a plan view or a constant):

* ``_causal_conv1d_update_kernel``: ``batch`` = the decode rows the call gets (a FULL graph's
  padded batch at capture): its int class; the state-index tensor it reads (the builder's
  persistent ``(max_bs, 1 + k)`` buffer for a decode-only batch a FULL graph can hold, the
  state table otherwise); ``num_cache_lines`` is ``do_not_specialize_on_alignment`` (only a
  one-block profiling cache makes it 1);
* ``_selective_scan_update_kernel``: ``N`` is ``do_not_specialize``, but ``BLOCK_SIZE_M`` and
  num_warps come from ``try_get_optimal_ssm_config``: the entry of vLLM's per-GPU table
  (configs/selective_state_update/) closest to ``N * nheads``, so N's *launch config*;
  the state-index tensor as above;
* ``_causal_conv1d_fwd_kernel`` and the SSD kernels (prefill rows): the prefill's state
  indices ``table[num_decodes:, 0]`` (4 * decode rows * table columns bytes in), its rows of
  in_proj's output and of the SSD output (decode tokens * row bytes in): 16-byte classes that
  ``engine_steps.alignment_periods``/``decode_shapes`` enumerate; initial states; final states
  or a prefix-cache checkpoint (``_store_prefill_checkpoint_kernel``).  Their int dimensions are
  ``tl.constexpr``/``tl.int64`` model sizes; token counts reach them only as tensor values.

So the batch dimension of every step reduces to a *decode class*: (the path the decode rows
take, the int class of their count, their selective-state-update launch config).  The engine
picks decode-row counts that no fixed list can name -- ``warmup_kernels`` decodes as many
requests as the KV blocks allow, which depends on the GPU's free memory; traffic forms
decode-only and mixed batches of any size up to ``max_num_seqs`` -- so ``decode_batches``
lists every count each path can get, for any GPU memory size, and ``plan_steps`` adds one
representative step per class that the plan's start-up and serving steps leave out.  The
launch config is vLLM's per-GPU table's: where the ops import (the GPU builder, the offline
check), ``config_of`` resolves it; without them classes go by the int class alone.

``reachable_steps`` enumerates the engine's steps outright (every warm-up batch, every decode
row count in every path, every joint 16-byte residue of decode rows and tokens, prefills
around chunk and block boundaries): bench/engine_check/reachable_keys.py runs both through
vLLM's ops stopped at Triton's binder and proves the reachable keys are a subset of the
sweep's.  Pure: no torch, no vllm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from cachebake.vllm.kernels.engine_steps import (Row, Step, batch_order, serving_steps, startup_steps,
                                            warmup_kernels_steps)
from cachebake.vllm.kernels.mamba_metadata import build_metadata
from cachebake.errors import BadInput

# Where a step's decode rows read their state indices (mamba_metadata.build_metadata):
PERSISTENT = "persistent"  # the builder's (max_bs, 1 + k) buffer: decode-only, FULL-able size
TABLE = "table"  # the state table: mixed steps, decode-only batches no FULL graph holds

ConfigOf = Callable[[int], Hashable]


def int_class(value: int, specialize: bool = True, align: bool = True) -> str:
    """Triton 3.6's specialization of an int argument (specialize.cc ``handle_long_type``):
    ``"1"``, or the type (``i32``/``i64``/``u64``) with ``D`` for a multiple of 16."""
    value = int(value)
    if specialize and value == 1:
        return "1"
    if -(1 << 31) <= value < (1 << 31):
        kind = "i32"
    elif -(1 << 63) <= value < (1 << 63):
        kind = "i64"
    elif 0 <= value < (1 << 64):
        kind = "u64"
    else:
        raise BadInput(f"{value}: no Triton integer type holds it")
    return kind + ("D" if specialize and align and value % 16 == 0 else "")


@dataclass(frozen=True, order=True)
class DecodeClass:
    """What the decode kernels' keys see of a step's decode rows."""

    path: str  # PERSISTENT or TABLE
    rows: str  # int_class of the decode-row count the kernels get
    launch_config: Any = None  # selective_state_update's (BLOCK_SIZE_M, num_warps), if resolved

    def tag(self) -> str:
        cfg = "" if self.launch_config is None else "/ssu=" + "x".join(map(str, self.launch_config))
        return f"{self.path}/{self.rows}{cfg}"


def has_full_graphs(plan: dict[str, Any]) -> bool:
    return "FULL" in plan["cudagraph"]["mode"]


def warmup_batch_cap(plan: dict[str, Any]) -> int:
    """The largest ``warmup_kernels`` batch on any GPU: vLLM takes
    ``min(max_num_seqs, max_num_batched_tokens // max(prompt_len, decode_query_len),
    max(1, (num_blocks - 1) // max_blocks_per_req))`` (vllm/v1/worker/gpu/warmup.py); the last
    term is the KV block count, i.e. the GPU's free memory, so every batch from 1 to the first
    two is possible."""
    sched, warm = plan["scheduler"], plan["warmup"]
    per_req = max(warm["prompt_len"], plan["spec"]["decode_query_len"])
    return max(1, min(sched["max_num_seqs"], sched["max_num_batched_tokens"] // per_req))


def decode_batches(plan: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every decode-row count the decode kernels can be launched with, per path, on any GPU
    memory size: the warm-up decodes (1..``warmup_batch_cap``, then 2 and 1), the FULL
    captures' padded batches, PIECEWISE captures whose dummy rows are all one-token decodes,
    mixed steps (1..max_num_seqs - 1 decode rows beside at least one prefill row), and
    decode-only batches that run eagerly: above the largest FULL graph, at any size without
    FULL graphs, and with speculative decoding any batch where some request got fewer drafts
    (not the uniform shape a FULL graph holds)."""
    sched, cg, spec = plan["scheduler"], plan["cudagraph"], plan["spec"]
    max_reqs, budget = sched["max_num_seqs"], sched["max_num_batched_tokens"]
    full, max_bs = has_full_graphs(plan), cg["decode_cudagraph_max_bs"]
    out: dict[str, set[int]] = {PERSISTENT: set(), TABLE: set()}

    def decode_only(n: int) -> None:
        out[PERSISTENT if full and n <= max_bs else TABLE].add(n)

    for n in range(1, warmup_batch_cap(plan) + 1):
        decode_only(n)
    for d in cg["captures"]["FULL"]:
        out[PERSISTENT].add(d["num_reqs"])
    for d in cg["captures"]["PIECEWISE"]:
        if d["num_tokens"] <= max_reqs:  # make_dummy: one token a row, nothing prefilling
            decode_only(d["num_tokens"])
    out[TABLE].update(range(1, min(max_reqs - 1, budget - 1) + 1))
    for n in range(1, min(max_reqs, budget) + 1):
        if not full or n > max_bs:
            out[TABLE].add(n)
        elif spec["num_speculative_tokens"]:
            out[PERSISTENT].add(n)
    return {path: tuple(sorted(ns)) for path, ns in out.items()}


def step_decode_class(plan: dict[str, Any], step: Step,
                      config_of: ConfigOf | None = None) -> DecodeClass | None:
    """The decode class of a step (None: no decode rows), from the metadata vLLM builds."""
    if step.kind != "forward":
        return None
    m = build_metadata(plan, step)
    if not m.num_decodes:
        return None
    path = PERSISTENT if (m.num_prefills == 0 and has_full_graphs(plan)
                          and m.num_decodes <= plan["cudagraph"]["decode_cudagraph_max_bs"]) else TABLE
    rows = m.state_indices_d.shape[0]  # the padded batch at a FULL capture
    return DecodeClass(path, int_class(rows), config_of(rows) if config_of else None)


def decode_classes(plan: dict[str, Any], config_of: ConfigOf | None = None) -> dict[DecodeClass, int]:
    """Every decode class the engine can reach, with its smallest decode-row count."""
    out: dict[DecodeClass, int] = {}
    for path, counts in decode_batches(plan).items():
        for n in counts:
            out.setdefault(DecodeClass(path, int_class(n), config_of(n) if config_of else None), n)
    return out


def class_step(plan: dict[str, Any], cls: DecodeClass, n: int) -> Step:
    """A step whose decode rows fall into ``cls`` with ``n`` rows: a decode-only batch for the
    persistent path (as a warm-up decode, a FULL capture or a spec-decoding batch reads it), a
    mixed step (``n`` decodes and a 17-token prefill) for the state table while one fits in
    the budget and ``max_num_seqs``, a decode-only batch past that."""
    sched, q = plan["scheduler"], plan["spec"]["decode_query_len"]
    budget, max_reqs = sched["max_num_batched_tokens"], sched["max_num_seqs"]
    prompt = plan["warmup"]["prompt_len"]
    note = {"decode_class": cls.tag()}
    if cls.path == TABLE and n <= min(max_reqs - 1, budget - 1):
        per_row = q if n * q < budget else 1
        rows = [Row(1000 + i, per_row, False) for i in range(n)]
        rows.append(Row(0, min(17, budget - n * per_row), True))
        return Step(f"serve/decode-class/mixed/decodes={n}", "serve", rows=batch_order(rows, q),
                    notes=note)
    per_row = q if n * q <= budget else 1
    rows = [Row(prompt, per_row, False) for _ in range(n)]
    name = "decode" if cls.path == PERSISTENT else "eager-decode"
    return Step(f"serve/decode-class/{name}/bs={n}", "serve", rows=batch_order(rows, q), notes=note)


def plan_steps(plan: dict[str, Any], config_of: ConfigOf | None = None) -> list[Step]:
    """The kernels driver's sweep: the plan's start-up and serving steps, then one step for
    each decode class they leave out.  ``config_of`` (decode rows -> the selective-state-update
    launch config, ``mamba2_ops.EngineMixer.ssu_launch_config``) splits classes by launch
    config; without it they go by path and int class.  Labels are unique."""
    steps = startup_steps(plan) + serving_steps(plan)
    # A step on the one-block profiling cache has num_cache_lines == 1: another key.
    covered = {step_decode_class(plan, s, config_of) for s in steps if not s.profiling}
    for cls, n in sorted(decode_classes(plan, config_of).items(), key=lambda kv: kv[1]):
        if cls not in covered:
            step = class_step(plan, cls, n)
            if step_decode_class(plan, step, config_of) != cls:
                raise BadInput(f"no engine step reaches decode class {cls.tag()} with {n} rows")
            steps.append(step)
            covered.add(cls)
    labels = [s.label for s in steps]
    if len(labels) != len(set(labels)):
        dup = sorted({x for x in labels if labels.count(x) > 1})
        raise BadInput(f"engine steps repeat labels: {dup[:3]}")
    return steps


# -- the engine's step space, enumerated outright (for the coverage proof) ------------------

def reachable_steps(plan: dict[str, Any]) -> Iterator[Step]:
    """The engine's steps, as many shapes as the class model claims to cover, without using
    it: start-up at every warm-up batch 1..``warmup_batch_cap``; decode-only batches of every
    size up to ``max_num_seqs`` (uniform; with speculative decoding also one-token rows and
    mixed draft counts); mixed steps at every decode-row count with each kind of prefill, and
    at every joint residue mod 16 of decode rows and decode tokens (a pointer's 16-byte class
    moves with them: Triton's rule is mod 16) for up to 32 rows; prefill-only steps across
    chunk and block boundaries, resumed states, several prompts and the token budget's edge.
    Labels start with ``reach/`` and may repeat a sweep label's tail."""
    sched, mx, spec, cache = plan["scheduler"], plan["mixer"], plan["spec"], plan["cache"]
    budget, max_reqs, max_len = (sched["max_num_batched_tokens"], sched["max_num_seqs"],
                                 sched["max_model_len"])
    c, q, k = mx["chunk_size"], spec["decode_query_len"], spec["num_speculative_tokens"]
    align, blk = cache["mamba_cache_mode"] == "align", plan["kv_cache"]["mamba_block_size"]

    def step(label: str, rows: list[Row]) -> Step | None:
        if not rows or len(rows) > max_reqs or sum(r.scheduled for r in rows) > budget:
            return None
        if any(r.seq_len > max_len or r.scheduled < 1 for r in rows):
            return None
        return Step("reach/" + label, "serve", rows=batch_order(rows, q))

    for s in startup_steps(plan):
        if not s.label.startswith("startup/warmup-kernels/"):
            yield dataclasses.replace(s, label="reach/" + s.label)
    for n in range(1, warmup_batch_cap(plan) + 1):
        for s in warmup_kernels_steps(plan, n):
            yield dataclasses.replace(s, label=f"reach/n={n}/{s.label}")

    def spread(nd: int, ndt: int) -> list[Row]:
        base, extra = divmod(ndt, nd)  # every decode row 1..q tokens
        return [Row(1000 + i, base + (i < extra), False) for i in range(nd)]

    for n in range(1, max_reqs + 1):
        shapes = {n * q, n} if k else {n}
        if k:
            shapes.add((n * (q + 1)) // 2)
        for ndt in sorted(shapes):
            s = step(f"decode/bs={n}/tokens={ndt}", spread(n, ndt))
            if s:
                yield s

    long = min(budget, max_len - 1, 2 * blk + 2 * c + 5)
    prefills = {"fresh=1": [Row(0, 1, True)], "fresh=100": [Row(0, 100, True)],
                f"continue=100@{c + 37}": [Row(c + 37, 100, True)],
                "two=57+30@c": [Row(0, 57, True), Row(c, 30, True)]}
    if align:
        prefills[f"checkpoint={long}"] = [Row(0, long, True)]
        prefills[f"hit=100@{blk}"] = [Row(blk, 100, True)]
    for nd in range(1, max_reqs):
        tokens = {nd}
        if k:
            tokens.add(nd * q)
            if nd <= 32:
                tokens.update(t for t in range(nd, nd * q + 1) if t < nd + 16)
        for ndt in sorted(tokens):
            for name, rows in prefills.items():
                s = step(f"mixed/decodes={nd}/tokens={ndt}/{name}", spread(nd, ndt) + rows)
                if s:
                    yield s

    lengths = set(range(1, 2 * c + 18)) | set(range(max(1, budget - 16), budget + 1))
    lengths |= {j * c + d for j in range(1, budget // c + 1) for d in (-1, 0, 1)}
    for n in sorted(lengths):
        s = step(f"prefill/len={n}", [Row(0, n, True)])
        if s:
            yield s
    for done in sorted({1, 37, c - 1, c, c + 1, blk, 2 * blk, max_len - 200}):
        for n in (1, 2, 17, 100, c - 1, c, c + 1, 2 * c + 1, 2 * blk + 5):
            s = step(f"prefill/computed={done}/len={n}", [Row(done, n, True)])
            if s:
                yield s
    for n in range(2, min(max_reqs, 64) + 1):
        rows = [Row((i % 3) * 37, 1 + i % 9, True) for i in range(n)]
        s = step(f"prefills/{n}", rows)
        if s:
            yield s
