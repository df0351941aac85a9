"""One TP rank's Mamba2 mixer on the GPU, calling vLLM's own ops exactly as the engine does.

Everything a kernel key sees comes from the engine plan: the states are views carved out of
one raw paged buffer with the plan's strides and byte offsets (as ``create_kv_cache_views``
and ``MambaBase.bind_kv_cache`` carve them), every index tensor is materialized where
``mamba_metadata`` says vLLM's sits (the same buffer size class, offset, stride and dtype),
and the op calls follow ``MambaMixer2._warmup_ssd_kernels`` and ``conv_ssm_forward`` of
vLLM 0.33 argument for argument (causal_conv1d_fn / _update, mamba_chunk_scan_combined_varlen,
the Triton selective_state_update backend, store_prefill_checkpoint, rms_norm_gated where
the plan says the engine calls it).

Needs torch, a CUDA device and ``vllm.model_executor.layers.mamba.ops`` (a full vllm, or the
ops-only extract from bench/vllm_ops/make_vllm_ops.py), imported when a mixer is built.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cachebake.vllm.kernels.engine_steps import Step
from cachebake.vllm.kernels.mamba_metadata import IntView, MambaMetadata, build_metadata

# State blocks the driver allocates: block ids only have to address existing slots (they
# never enter a kernel key), so steps reuse a small pool; num_cache_lines stays > 1.
STATE_POOL = 32


class EngineMixer:
    """The kernels of one Mamba2 layer, fed as the engine feeds them."""

    def __init__(self, plan: dict[str, Any], device: str = "cuda", random_inputs: bool = True):
        import torch
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import (
            causal_conv1d_fn, causal_conv1d_update)
        from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated
        from vllm.model_executor.layers.mamba.ops.mamba_ssm import (
            selective_state_update, try_get_optimal_ssm_config)
        from vllm.model_executor.layers.mamba.ops.ssd_combined import (
            mamba_chunk_scan_combined_varlen)

        self.torch, self.plan = torch, plan
        self.conv_fn, self.conv_update, self.norm = causal_conv1d_fn, causal_conv1d_update, rms_norm_gated
        self.scan, self.ssu, self.ssu_config = (mamba_chunk_scan_combined_varlen, selective_state_update,
                                                try_get_optimal_ssm_config)
        self._store_checkpoint = None
        self.dev = torch.device(device)
        mx, ops = plan["mixer"], plan["ops"]
        dt = lambda name: getattr(torch, name)  # noqa: E731
        self.act = dt(plan["model"]["dtype"])
        h = mx["num_heads"]
        self.conv_weights = torch.randn(mx["conv_dim"], mx["conv_kernel"], device=self.dev,
                                        dtype=dt(mx["conv_weight_dtype"]))
        self.conv_bias = (torch.randn(mx["conv_dim"], device=self.dev, dtype=dt(mx["conv_weight_dtype"]))
                          if mx["use_conv_bias"] else None)
        self.A = -torch.rand(h, device=self.dev, dtype=dt(mx["A_dtype"]))
        self.D = torch.ones(h, device=self.dev, dtype=dt(mx["D_dtype"]))
        self.dt_bias = torch.ones(h, device=self.dev, dtype=dt(mx["dt_bias_dtype"]))
        self.norm_weight = torch.ones(mx["intermediate"], device=self.dev, dtype=self.act)
        self.is_blackwell = bool(ops["is_blackwell"])
        self.states: dict[int, tuple[Any, Any]] = {}
        # Activations' values never enter a kernel key; random ones keep the math finite.
        self.activations = torch.randn if random_inputs else torch.empty

    # -- the paged KV buffer ------------------------------------------------------------------

    def state_views(self, num_blocks: int):
        """(conv state as the kernels get it, SSM state): views of a raw int8 buffer of
        ``num_blocks`` blocks, with the plan's strides and byte offsets."""
        if num_blocks in self.states:
            return self.states[num_blocks]
        torch, kv = self.torch, self.plan["kv_cache"]
        stride_bytes = kv["block_stride_bytes"]
        raw = torch.zeros(num_blocks * stride_bytes, dtype=torch.int8, device=self.dev)
        views = {}
        for v in kv["views"]:
            dtype = getattr(torch, v["dtype"])
            item = torch.empty(0, dtype=dtype).element_size()
            typed = raw.view(dtype)
            assert v["offset_bytes"] % item == 0 and stride_bytes % item == 0
            views[v["name"]] = typed.as_strided((num_blocks, *v["shape"]), v["stride"],
                                                v["offset_bytes"] // item)
        conv = views["conv"]
        # MambaMixer2.conv_ssm_forward: the kernels want (..., dim, width - 1); the "SD"
        # layout stores (width - 1, dim) and is handed over transposed.
        if kv["conv_state_layout"] != "DS":
            conv = conv.transpose(-1, -2)
        self.states[num_blocks] = (conv, views["ssm"])
        return self.states[num_blocks]

    def _ints(self, view: IntView | None):
        if view is None:
            return None
        torch = self.torch
        dtype = getattr(torch, view.dtype)
        extent = view.offset + 1 + sum((n - 1) * s for n, s in zip(view.shape, view.stride))
        buf = torch.zeros(max(view.buffer, extent), dtype=dtype, device=self.dev)
        out = buf.as_strided(view.shape, view.stride, view.offset)
        if view.values:
            out.copy_(torch.tensor(view.values, dtype=dtype).view(view.shape))
        return out

    # -- steps -------------------------------------------------------------------------------

    def ssu_launch_config(self, decode_rows: int) -> tuple[int, int]:
        """selective_state_update's (BLOCK_SIZE_M, num_warps) for ``decode_rows`` rows on this
        GPU: vLLM's per-GPU table entry closest to rows * heads (a tl.constexpr and a launch
        option of the kernel, so part of its key; ``engine_classes`` splits classes by it)."""
        mx = self.plan["mixer"]
        return tuple(self.ssu_config(mx["head_dim"], mx["d_state"], decode_rows, mx["num_heads"],
                                     self.plan["cache"]["ssm_state_dtype"], self.is_blackwell))

    def run(self, step: Step) -> None:
        if step.kind == "ssd_warmup":
            self._ssd_warmup(*step.ssd_variant)
            return
        meta = build_metadata(self.plan, step)
        profiling_blocks = self.plan["cudagraph"].get("profiling_num_blocks")
        blocks = 1 if step.profiling and profiling_blocks == 1 else STATE_POOL
        self._forward(meta, _remap_blocks(meta, blocks))

    def _ssd_warmup(self, initial: bool, final: bool) -> None:
        """MambaMixer2._warmup_ssd_kernels: one chunk of one sequence, plain contiguous
        tensors, the SSM state dtype the engine uses."""
        torch, mx = self.torch, self.plan["mixer"]
        dev, act = self.dev, self.act
        h, p, g, n = mx["num_heads"], mx["head_dim"], mx["n_groups"], mx["d_state"]
        chunk = mx["chunk_size"]
        state_dtype = getattr(torch, self.plan["cache"]["ssm_state_dtype"])
        x = torch.randn(chunk, h, p, device=dev, dtype=act)
        dt = torch.randn(chunk, h, device=dev, dtype=act)
        B = torch.randn(chunk, g, n, device=dev, dtype=act)
        C = torch.randn(chunk, g, n, device=dev, dtype=act)
        i32 = dict(device=dev, dtype=torch.int32)
        out = torch.empty(chunk, h, p, device=dev, dtype=act)
        final_states = torch.empty(1, h, p, n, device=dev, dtype=state_dtype)
        init = torch.randn(1, h, p, n, device=dev, dtype=state_dtype) if initial else None
        self.scan(x=x, dt=dt, A=self.A, B=B, C=C, chunk_size=chunk,
                  cu_seqlens=torch.tensor([0, chunk], **i32),
                  cu_chunk_seqlens=torch.tensor([0, chunk], **i32),
                  last_chunk_indices=torch.tensor([0], **i32), seq_idx=torch.zeros(1, **i32),
                  out=out, D=self.D, z=None, dt_bias=self.dt_bias, initial_states=init,
                  dt_softplus=True, dt_limit=(0.0, float("inf")), state_dtype=state_dtype,
                  final_states_out=final_states if final else None,
                  final_state_indices=torch.zeros(1, **i32) if final else None)

    def _forward(self, m: MambaMetadata, num_blocks: int) -> None:
        """MambaMixer2.forward's projection buffers, then conv_ssm_forward."""
        torch, mx = self.torch, self.plan["mixer"]
        tokens = m.num_actual_tokens
        projected = self.activations(tokens, mx["in_proj_width"], device=self.dev, dtype=self.act)
        output = torch.empty(tokens, mx["num_heads"] * mx["head_dim"], device=self.dev, dtype=self.act)
        self._conv_ssm_forward(projected, output, m, num_blocks)
        if mx["gated_norm_triton"]:
            gate = projected[..., : mx["intermediate"]]
            self.norm(output, self.norm_weight, bias=None, z=gate, eps=mx["rms_norm_eps"],
                      norm_before_gate=False)

    def _conv_ssm_forward(self, projected, output, m: MambaMetadata, num_blocks: int) -> None:
        torch, mx = self.torch, self.plan["mixer"]
        inter, conv_dim, heads, p = mx["intermediate"], mx["conv_dim"], mx["num_heads"], mx["head_dim"]
        g, n = mx["n_groups"], mx["d_state"]
        conv_state, ssm_state = self.state_views(num_blocks)
        xbc, dt = torch.split(projected[..., inter:], [conv_dim, heads], dim=-1)
        nd, npf = m.num_decode_tokens, m.num_prefill_tokens
        xbc_d, xbc_p = torch.split(xbc[: m.num_actual_tokens], [nd, npf], dim=0)
        dt_d, dt_p = torch.split(dt[: m.num_actual_tokens], [nd, npf], dim=0)
        out_d, out_p = torch.split(output[: m.num_actual_tokens], [nd, npf], dim=0)
        split = lambda t: torch.split(t, [inter, g * n, g * n], dim=-1)  # noqa: E731

        if m.num_prefills:
            qsl_p = self._ints(m.query_start_loc_p)
            has_init = torch.tensor(m.has_initial_states_p, dtype=torch.bool, device=self.dev)
            idx_p = self._ints(m.state_indices_p)
            x = xbc_p.transpose(0, 1)
            hbc = self.conv_fn(x, self.conv_weights, self.conv_bias, activation=mx["activation"],
                               conv_states=conv_state, has_initial_state=has_init,
                               cache_indices=idx_p, metadata=self._conv_metadata(m),
                               query_start_loc=qsl_p).transpose(0, 1)[:npf]
            h_p, B_p, C_p = split(hbc)
            initial = None
            if m.prep_initial_states:
                initial = torch.where(has_init[:, None, None, None], ssm_state[idx_p], 0)
            ckpt = m.checkpoint
            last = self._ints(m.last_chunk_indices)
            states = self.scan(
                h_p.view(npf, heads, p), dt_p, self.A, B_p.view(npf, g, -1), C_p.view(npf, g, -1),
                chunk_size=mx["chunk_size"], D=self.D, z=None, dt_bias=self.dt_bias,
                seq_idx=self._ints(m.seq_idx), cu_seqlens=qsl_p,
                cu_chunk_seqlens=self._ints(m.cu_chunk_seqlens), last_chunk_indices=last,
                initial_states=initial, return_intermediate_states=ckpt is not None,
                dt_softplus=True, dt_limit=(0.0, float("inf")), out=out_p.view(npf, -1, p),
                state_dtype=ssm_state.dtype,
                final_states_out=None if ckpt is not None else ssm_state,
                final_state_indices=None if ckpt is not None else idx_p)
            if ckpt is not None:
                meta = SimpleNamespace(checkpoint_offsets=self._ints(ckpt.offsets),
                                       state_indices=self._ints(ckpt.state_indices))
                self._checkpoint_op()(meta, self._ints(ckpt.chunk_idx), x, conv_state, states,
                                      ssm_state, qsl_p, state_len=mx["conv_kernel"] - 1)
                ssm_state[idx_p] = states[last]

        if m.num_decodes:
            idx_d = self._ints(m.state_indices_d)
            accepted = self._ints(m.num_accepted_tokens)
            qsl_d = self._ints(m.query_start_loc_d)
            hbc_d = self.conv_update(xbc_d, conv_state, self.conv_weights, self.conv_bias,
                                     mx["activation"], conv_state_indices=idx_d,
                                     num_accepted_tokens=accepted, query_start_loc=qsl_d,
                                     max_query_len=idx_d.size(-1))
            h_d, B_d, C_d = split(hbc_d)
            A_d = self.A[:, None, ...][:, :, None].expand(-1, p, n).to(dtype=torch.float32)
            ops = self.plan["ops"]
            self.ssu(ssm_state, h_d.view(-1, heads, p), dt_d[:, :, None].expand(-1, -1, p), A_d,
                     B_d.view(-1, g, B_d.shape[1] // g), C_d.view(-1, g, C_d.shape[1] // g),
                     D=self.D[:, None, ...].expand(-1, p), z=None,
                     dt_bias=self.dt_bias[:, None, ...].expand(-1, p), dt_softplus=True,
                     state_batch_indices=idx_d, dst_state_batch_indices=idx_d,
                     out=out_d.view(nd, -1, p), num_accepted_tokens=accepted, cu_seqlens=qsl_d,
                     is_blackwell=self.is_blackwell,
                     enable_stochastic_rounding=ops.get("enable_stochastic_rounding", False),
                     cache_philox_rounds=ops.get("stochastic_rounding_philox_rounds", 0))

    def _conv_metadata(self, m: MambaMetadata):
        """compute_causal_conv1d_metadata's objects, as causal_conv1d_fn reads them."""
        torch = self.torch
        mlist, offsets, size = m.conv_programs
        pad = self.plan["ops"]["pad_slot_id"]
        batch_ptr = torch.full((size,), pad, dtype=torch.int32, device=self.dev)
        chunk_ptr = torch.full((size,), pad, dtype=torch.int32, device=self.dev)
        if mlist:
            batch_ptr[: len(mlist)].copy_(torch.tensor(mlist, dtype=torch.int32))
            chunk_ptr[: len(offsets)].copy_(torch.tensor(offsets, dtype=torch.int32))
        entry = {"tot": len(mlist), "mlist": torch.tensor(mlist, dtype=torch.int64),
                 "mlist_len": len(mlist), "offsetlist": torch.tensor(offsets, dtype=torch.int32),
                 "batch_ptr": batch_ptr, "token_chunk_offset_ptr": chunk_ptr}
        return SimpleNamespace(nums_dict={8: entry}, batch_ptr=batch_ptr, token_chunk_offset_ptr=chunk_ptr)

    def _checkpoint_op(self):
        if self._store_checkpoint is None:
            from vllm.model_executor.layers.mamba.ops.ssd_checkpoint import store_prefill_checkpoint

            self._store_checkpoint = store_prefill_checkpoint
        return self._store_checkpoint


def _remap_blocks(m: MambaMetadata, pool: int) -> int:
    """Block ids already lie in [0, pool) when ``build_metadata`` got ``first_block`` = 1 and
    steps are small; larger ids are folded into the pool in place.  Returns the pool size."""
    def fold(view):
        if view is None:
            return None
        return view.__class__(tuple(v % pool if v >= pool else v for v in view.values), view.shape,
                              view.stride, view.offset, view.buffer, view.dtype)

    for name in ("state_indices_d", "state_indices_p"):
        object.__setattr__(m, name, fold(getattr(m, name)))
    if m.checkpoint is not None:
        object.__setattr__(m.checkpoint, "state_indices", fold(m.checkpoint.state_indices))
    return pool

