"""What vLLM's Mamba2 metadata builder hands the mixer for one engine step, as plain data.

This mirrors, argument for argument, vLLM 0.33's Model Runner V2 input preparation and
``Mamba2AttentionMetadataBuilder.build`` (``vllm/v1/attention/backends/mamba_attn.py``,
``mamba2_attn.py``, ``vllm/model_executor/layers/mamba/checkpoint.py``): how decodes and
prefills are split, which buffer each index tensor is a view of and at which offset (the
prefill's state indices are ``table[num_decodes:, 0]``, a decode-only batch reads the
builder's persistent ``(max_bs, 1 + k)`` buffer), the SSD chunk layout, the causal-conv
program list and the prefix-cache checkpoints.  tests/test_recipes_vllm.py builds the same
steps with vLLM's own builder and compares every field, value, shape, stride and offset.

Pure: no torch.  ``IntView`` says how to materialize an int32 tensor exactly where vLLM's is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cachebake.vllm.kernels.engine_steps import Row, Step

CONV_BLOCK_M = 8  # compute_causal_conv1d_metadata covers BLOCK_M == 8 only


@dataclass(frozen=True)
class IntView:
    """An integer tensor the kernels get: a view of a buffer of ``buffer`` elements at
    ``offset`` elements with ``shape``/``stride``, holding ``values`` (row-major)."""

    values: tuple[int, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0
    buffer: int = 0  # elements; 0: exactly the view's extent
    dtype: str = "int32"

    @classmethod
    def fresh(cls, values, dtype: str = "int32") -> IntView:
        values = tuple(int(v) for v in values)
        return cls(values, (len(values),), (1,), 0, len(values), dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"values": list(self.values), "shape": list(self.shape), "stride": list(self.stride),
                "offset": self.offset, "buffer": self.buffer, "dtype": self.dtype}


@dataclass(frozen=True)
class Checkpoint:
    offsets: IntView  # int32, one per prefill row (0: none)
    state_indices: IntView  # the block each row's checkpoint goes to (NULL when none)
    chunk_idx: IntView  # int64, the SSD chunk ending on each checkpoint


@dataclass(frozen=True)
class MambaMetadata:
    num_reqs: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    query_start_loc: IntView  # the runner's persistent buffer, [: num_reqs + 1]
    state_indices_d: IntView | None
    query_start_loc_d: IntView | None  # speculative decoding only
    num_accepted_tokens: IntView | None  # speculative decoding only
    state_indices_p: IntView | None
    query_start_loc_p: IntView | None
    has_initial_states_p: tuple[bool, ...] | None
    prep_initial_states: bool
    cu_chunk_seqlens: IntView | None
    seq_idx: IntView | None
    last_chunk_indices: IntView | None
    conv_programs: tuple[tuple[int, ...], tuple[int, ...], int] | None  # (mlist, offsets, buffer)
    checkpoint: Checkpoint | None

    @property
    def num_actual_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens


def _block_ids(plan: dict[str, Any], rows: tuple[Row, ...], first_block: int) -> list[list[int]]:
    """Block-table rows with distinct valid block ids (values never enter a kernel key; they
    only have to address existing state slots).  Row i's blocks cover its tokens."""
    bt, kv = plan["block_table"], plan["kv_cache"]
    width, blk = bt["width"], kv["mamba_block_size"]
    out, nxt = [], first_block
    for r in rows:
        if plan["cache"]["mamba_cache_mode"] == "align":
            used = max(1, math.ceil(max(r.seq_len, 1) / blk)) + plan["cache"]["num_speculative_blocks"]
        else:
            used = width
        used = min(used, width)
        out.append(list(range(nxt, nxt + used)) + [0] * (width - used))
        nxt += used
    return out


def build_metadata(plan: dict[str, Any], step: Step, first_block: int = 1) -> MambaMetadata:
    """The metadata vLLM builds for ``step`` (``first_block``: the first state block id)."""
    rows, spec, cache = step.rows, plan["spec"], plan["cache"]
    k, q = spec["num_speculative_tokens"], spec["decode_query_len"]
    null = plan["ops"]["null_block_id"]
    max_reqs = plan["scheduler"]["max_num_seqs"]
    num_reqs = len(rows)
    qsl = [0]
    for r in rows:
        qsl.append(qsl[-1] + r.scheduled)
    num_tokens = qsl[-1]
    # Model Runner V2 keeps query_start_loc in a persistent (max_num_reqs + 1) buffer.
    qsl_view = IntView(tuple(qsl), (num_reqs + 1,), (1,), 0, max_reqs + 1)

    # num_accepted_tokens reaches the builder whenever speculative decoding is on: at FULL
    # capture as diff(query_start_loc), otherwise from the model state (ones for new rows).
    spec_on = k > 0
    threshold = spec["reorder_batch_threshold"] if spec_on else 1

    # _compute_common_metadata: one-token prefills with prior state run as decodes.
    prefilling = [r.prefilling and not (r.computed > 0 and r.scheduled == 1) for r in rows]
    num_decodes, num_decode_tokens = _split(rows, prefilling, threshold)
    num_prefills = num_reqs - num_decodes
    num_prefill_tokens = num_tokens - num_decode_tokens

    # The state table: "none" mode passes the runner's block table ((max_num_reqs, width),
    # persistent); "align" gathers each row's live columns into a new (rows, n) tensor.
    table = _block_ids(plan, rows, first_block)
    width = plan["block_table"]["width"]
    if cache["mamba_cache_mode"] == "align":
        n_out = plan["block_table"]["state_columns"]
        blk = plan["kv_cache"]["mamba_block_size"]
        state_rows = []
        for r, tr in zip(rows, table):
            start = max((r.seq_len - 1) // blk, 0)
            state_rows.append([tr[min(start + j, width - 1)] for j in range(n_out)])
        t_cols, t_buf = n_out, num_reqs * n_out
    else:
        state_rows, t_cols, t_buf = table, width, max_reqs * width

    def table_view(r0: int, nrows: int, ncols: int, col0: int = 0) -> IntView:
        vals = tuple(state_rows[r0 + i][col0 + j] for i in range(nrows) for j in range(ncols))
        return IntView(vals, (nrows, ncols), (t_cols, 1), r0 * t_cols + col0, t_buf)

    state_d = qsl_d = accepted = None
    if num_decodes:
        state_d = table_view(0, num_decodes, q)
        if spec_on:
            qsl_d = IntView(tuple(qsl[: num_decodes + 1]), (num_decodes + 1,), (1,), 0, max_reqs + 1)
            # FULL capture: diff(query_start_loc); otherwise the model state's counts (1 for a
            # request that has not decoded yet).  Values never enter a kernel key.
            counts = [r.scheduled for r in rows] if step.capture else [1] * num_reqs
            accepted = IntView(tuple(counts[:num_decodes]), (num_decodes,), (1,), 0, num_reqs)
    state_p = qsl_p = has_init = None
    cu = seq_idx = last = conv = ckpt = None
    prep = False
    if num_prefills:
        p_rows = rows[num_decodes:]
        pv = table_view(num_decodes, num_prefills, 1)
        state_p = IntView(pv.values, (num_prefills,), (t_cols,), pv.offset, t_buf)
        p_qsl = [x - num_decode_tokens for x in qsl[num_decodes:]]
        qsl_p = IntView.fresh(p_qsl)
        has_init = tuple(r.computed > 0 for r in p_rows)
        prep = any(has_init)
        conv = _conv_programs(p_qsl)
        offsets = _checkpoint_offsets(plan, step, p_rows)
        cu_l, idx_l, last_l, ck_l = chunk_metadata(
            plan["mixer"]["chunk_size"], [r.computed for r in p_rows],
            [r.scheduled for r in p_rows], offsets)
        cu, seq_idx, last = IntView.fresh(cu_l), IntView.fresh(idx_l), IntView.fresh(last_l)
        if offsets is not None:
            blk = plan["kv_cache"]["mamba_block_size"]
            # compute_mamba_prefill_checkpoints: the checkpoint goes to block column
            # cdiv(seq_len, block) - 2 of the row's block table.
            cols = [math.ceil(r.seq_len / blk) - 2 if o else -1 for r, o in zip(p_rows, offsets)]
            dest = [table[num_decodes + i][c] if c >= 0 else null for i, c in enumerate(cols)]
            ckpt = Checkpoint(IntView.fresh(offsets), IntView.fresh(dest),
                              IntView.fresh([max(i, 0) for i in ck_l], dtype="int64"))

    # _update_metadata_for_cudagraph_capture: a decode-only batch small enough for a FULL
    # graph reads the builder's persistent (decode_cudagraph_max_bs, 1 + k) buffer.
    max_bs = plan["cudagraph"]["decode_cudagraph_max_bs"]
    if (num_prefills == 0 and num_decodes <= max_bs and "FULL" in plan["cudagraph"]["mode"]
            and state_d is not None):
        padded = num_reqs
        vals = list(state_d.values) + [null] * ((padded - num_decodes) * q)
        state_d = IntView(tuple(vals), (padded, q), (q, 1), 0, max_bs * q)
        if spec_on and accepted is not None:
            qsl_d = IntView(tuple(qsl[: padded + 1]), (padded + 1,), (1,), 0, max_reqs + 1)
            accepted = IntView(tuple(list(accepted.values) + [1] * (padded - num_decodes)),
                               (padded,), (1,), 0, max_bs)
    return MambaMetadata(num_reqs, num_decodes, num_decode_tokens, num_prefills,
                         num_prefill_tokens, qsl_view, state_d, qsl_d, accepted, state_p, qsl_p,
                         has_init, prep, cu, seq_idx, last, conv, ckpt)


def _split(rows, prefilling, threshold: int) -> tuple[int, int]:
    """split_decodes_and_prefills(treat_short_extends_as_decodes=False): decodes are the
    leading rows with at most ``threshold`` tokens that are not prefilling."""
    for i, r in enumerate(rows):
        if r.scheduled > threshold or prefilling[i]:
            return i, sum(x.scheduled for x in rows[:i])
    return len(rows), sum(x.scheduled for x in rows)


def _conv_programs(p_qsl: list[int]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """compute_causal_conv1d_metadata: which sequence and BLOCK_M chunk each program runs,
    in buffers of max(1024, programs) * 2 entries."""
    nums = [math.ceil((b - a) / CONV_BLOCK_M) for a, b in zip(p_qsl, p_qsl[1:])]
    mlist = tuple(i for i, n in enumerate(nums) for _ in range(n))
    offsets = tuple(j for n in nums for j in range(n))
    return mlist, offsets, max(1024, len(mlist)) * 2


def chunk_metadata(chunk_size: int, computed: list[int], new: list[int],
                   checkpoint_offsets: list[int] | None = None
                   ) -> tuple[list[int], list[int], list[int], list[int]]:
    """BaseMambaAttentionMetadataBuilder._compute_chunk_metadata: chunks hold one sequence
    and end on multiples of chunk_size of its absolute positions; a checkpoint splits its
    row so that a chunk ends on it.  Returns (cu_chunk_seqlens, seq_idx,
    last_chunk_indices, checkpoint chunk per row or -1)."""
    cu, seq_idx, last = [], [], []
    ckpt_idx = [-1] * len(new)
    pos = 0
    segments = []
    for i, (done, n) in enumerate(zip(computed, new)):
        c = checkpoint_offsets[i] if checkpoint_offsets else 0
        if c:
            segments.append((i, done, c, True))
        segments.append((i, done + c, n - c, False))
    for i, done, n, is_ckpt in segments:
        if done % chunk_size:
            take = min(math.ceil(done / chunk_size) * chunk_size - done, n)
            seq_idx.append(i)
            cu.append(pos)
            pos += take
            n -= take
        for _ in range(math.ceil(n / chunk_size)):
            take = min(chunk_size, n)
            seq_idx.append(i)
            cu.append(pos)
            pos += take
            n -= take
        if is_ckpt:
            ckpt_idx[i] = len(cu) - 1
        else:
            last.append(len(cu) - 1)
    cu.append(pos)
    return cu, seq_idx, last, ckpt_idx


def _checkpoint_position(seq_len: int, alignment: int, drop_eagle_block: bool,
                         lookahead: int) -> int:
    """get_mamba_prefill_checkpoint_position (vllm/v1/kv_cache_interface.py)."""
    proof = seq_len if drop_eagle_block else seq_len - max(1, lookahead)
    pos = proof // alignment * alignment
    if drop_eagle_block:
        pos -= alignment
    return max(pos, 0)


def _checkpoint_valid(query_start: int, query_end: int, position: int, hash_block: int,
                      mamba_block: int, alignment: int | None) -> bool:
    """is_mamba_prefill_checkpoint_valid."""
    if alignment is None:
        return False
    initial_col = (query_start - 1) // mamba_block
    ckpt_col = math.ceil(query_end / mamba_block) - 2
    return (query_start % hash_block == 0 and ckpt_col > initial_col
            and query_start + hash_block <= position and query_start < position < query_end
            and (position - query_start) % alignment == 0)


def _checkpoint_offsets(plan: dict[str, Any], step: Step, p_rows) -> list[int] | None:
    """MambaPrefillCheckpointBuilder.build's offsets into each prefill row (0: none): align
    mode, a Mamba spec that exports checkpoints, and a resolved hash block size, which the
    profiling KV cache does not have."""
    cache = plan["cache"]
    if (cache["mamba_cache_mode"] != "align" or not cache["num_prefill_checkpoint_blocks"]
            or step.profiling):
        return None
    blk = plan["kv_cache"]["mamba_block_size"]
    out = []
    for r in p_rows:
        pos = _checkpoint_position(r.seq_len, cache["cache_hit_alignment_tokens"],
                                   cache["drop_eagle_block"], cache["num_hash_lookahead_tokens"])
        ok = _checkpoint_valid(r.computed, r.seq_len, pos, cache["hash_block_size"], blk,
                               cache["prefill_checkpoint_alignment"])
        out.append(pos - r.computed if ok else 0)
    return out if any(out) else None
