"""One TP rank's Mamba2 mixer on the GPU, calling vLLM's own Triton ops as vLLM calls them.

Why a separate module: ``cachebake.drivers.kernels`` plans on any machine; this part needs
torch, a CUDA device and ``vllm.model_executor.layers.mamba.ops`` (a full vllm install or the
ops-only extract from bench/vllm_ops/make_vllm_ops.py), imported only when a sweep runs.
The calls, argument for argument, follow ``MambaMixer2.conv_ssm_forward`` in vllm 0.33
(prefill: causal_conv1d_fn then mamba_chunk_scan_combined_varlen; decode:
causal_conv1d_update then the Triton selective_state_update backend; rms_norm_gated where
Mixer2RMSNormGated.forward_cuda uses it).
"""

from __future__ import annotations

import itertools

from cachebake.drivers.kernels import ModelShapes, SweepCase, chunk_metadata


class Mamba2Mixer:
    """One TP rank's Mamba2 mixer state and weights on the GPU, and the op calls of
    MambaMixer2.conv_ssm_forward (vllm 0.33) for a step of decodes then prefills."""

    def __init__(self, shapes: ModelShapes, num_slots: int, device: str = "cuda"):
        import torch
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import (
            causal_conv1d_fn,
            causal_conv1d_update,
        )
        from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated
        from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update
        from vllm.model_executor.layers.mamba.ops.ssd_combined import (
            mamba_chunk_scan_combined_varlen,
        )
        from vllm.platforms import current_platform

        self.torch, self.s = torch, shapes
        self.conv_fn, self.conv_update = causal_conv1d_fn, causal_conv1d_update
        self.scan, self.ssu, self.norm = mamba_chunk_scan_combined_varlen, selective_state_update, rms_norm_gated
        self.is_blackwell = current_platform.is_device_capability_family(100)
        dev = self.dev = torch.device(device)
        act = self.act = getattr(torch, shapes.act_dtype)
        s = shapes
        h, p, n = s.rank_heads, s.head_dim, s.d_state
        # Parameters: A is float32 by construction, D and dt_bias take the model dtype.
        self.conv_weights = torch.randn(s.rank_conv_dim, s.conv_kernel, device=dev, dtype=act)
        self.conv_bias = (torch.randn(s.rank_conv_dim, device=dev, dtype=act)
                          if s.use_conv_bias else None)
        self.A = -torch.rand(h, device=dev, dtype=torch.float32)
        self.D = torch.ones(h, device=dev, dtype=act)
        self.dt_bias = torch.ones(h, device=dev, dtype=act)
        self.norm_weight = torch.ones(s.rank_intermediate, device=dev, dtype=act)
        # State caches, slot 0 the null block.  Conv state in vLLM's default "SD" layout
        # (slot, state_len, dim), handed to the kernels transposed to (slot, dim, state_len).
        self.conv_state = torch.zeros(num_slots, s.conv_kernel - 1, s.rank_conv_dim, device=dev,
                                      dtype=getattr(torch, s.conv_state_dtype)).transpose(-1, -2)
        self.ssm_state = torch.zeros(num_slots, h, p, n, device=dev,
                                     dtype=getattr(torch, s.ssm_state_dtype))

    def step(self, case: SweepCase) -> None:
        torch, s = self.torch, self.s
        d, total = case.decode_batch, case.num_tokens
        # in_proj's output for the step, optionally shifted off alignment.
        flat = torch.randn(case.conv_offset + total * s.rank_proj_dim, device=self.dev, dtype=self.act)
        projected = flat[case.conv_offset:].view(total, s.rank_proj_dim)
        gate = projected[:, : s.rank_intermediate]
        xbc, dt = torch.split(projected[:, s.rank_intermediate:], [s.rank_conv_dim, s.rank_heads], dim=-1)
        out = torch.empty(total, s.rank_intermediate, device=self.dev, dtype=self.act)
        if d:
            self._decode(xbc[:d], dt[:d], out[:d], d)
        if case.seq_lens:
            self._prefill(case, xbc[d:], dt[d:], out[d:], first_slot=d + 1)
        if s.uses_triton_gated_norm and case.kind != "conv":
            self.norm(out, self.norm_weight, bias=None, z=gate, eps=s.rms_norm_eps,
                      norm_before_gate=False)

    def _split(self, xbc):
        s = self.s
        return self.torch.split(xbc, [s.rank_intermediate, s.rank_groups * s.d_state,
                                      s.rank_groups * s.d_state], dim=-1)

    def _prefill(self, case: SweepCase, xbc, dt, out, first_slot: int) -> None:
        torch, s = self.torch, self.s
        lens, tokens = case.seq_lens, sum(case.seq_lens)
        i32 = dict(device=self.dev, dtype=torch.int32)
        query_start_loc = torch.tensor([0, *itertools.accumulate(lens)], **i32)
        slots = torch.arange(first_slot, first_slot + len(lens), **i32)
        has_initial = torch.tensor([c > 0 for c in case.computed], device=self.dev, dtype=torch.bool)
        conv_out = self.conv_fn(
            xbc.transpose(0, 1), self.conv_weights, self.conv_bias, activation=s.activation,
            conv_states=self.conv_state, has_initial_state=has_initial, cache_indices=slots,
            metadata=None, query_start_loc=query_start_loc,
        ).transpose(0, 1)[:tokens]
        if case.kind == "conv":
            return
        x, B, C = self._split(conv_out)
        initial_states = None
        if case.has_initial_states:
            initial_states = torch.where(has_initial[:, None, None, None], self.ssm_state[slots], 0)
        cu, seq_idx, last = chunk_metadata(s.chunk_size, case.computed, lens)
        self.scan(
            x.view(tokens, s.rank_heads, s.head_dim), dt, self.A,
            B.view(tokens, s.rank_groups, -1), C.view(tokens, s.rank_groups, -1),
            chunk_size=s.chunk_size, D=self.D, z=None, dt_bias=self.dt_bias,
            seq_idx=torch.tensor(seq_idx, **i32), cu_seqlens=query_start_loc,
            cu_chunk_seqlens=torch.tensor(cu, **i32), last_chunk_indices=torch.tensor(last, **i32),
            initial_states=initial_states, return_intermediate_states=not case.final_states,
            dt_softplus=True, dt_limit=(0.0, float("inf")),
            out=out.view(tokens, -1, s.head_dim), state_dtype=self.ssm_state.dtype,
            final_states_out=self.ssm_state if case.final_states else None,
            final_state_indices=slots if case.final_states else None,
        )

    def _decode(self, xbc, dt, out, batch: int) -> None:
        torch, s = self.torch, self.s
        slots = torch.arange(1, batch + 1, device=self.dev, dtype=torch.int32).unsqueeze(-1)
        xbc = self.conv_update(xbc, self.conv_state, self.conv_weights, self.conv_bias,
                               s.activation, conv_state_indices=slots, num_accepted_tokens=None,
                               query_start_loc=None, max_query_len=slots.size(-1))
        x, B, C = self._split(xbc)
        p, n, g = s.head_dim, s.d_state, s.rank_groups
        A = self.A[:, None, ...][:, :, None].expand(-1, p, n).to(dtype=torch.float32)
        # The Triton SSU backend (ssu_dispatch.TritonSSUBackend, vLLM's default) with
        # MambaConfig's defaults: no stochastic rounding.
        self.ssu(
            self.ssm_state, x.view(-1, s.rank_heads, p), dt[:, :, None].expand(-1, -1, p), A,
            B.view(-1, g, B.shape[1] // g), C.view(-1, g, C.shape[1] // g),
            D=self.D[:, None, ...].expand(-1, p), z=None,
            dt_bias=self.dt_bias[:, None, ...].expand(-1, p), dt_softplus=True,
            state_batch_indices=slots, dst_state_batch_indices=slots,
            out=out.view(batch, -1, p), num_accepted_tokens=None, cu_seqlens=None,
            is_blackwell=self.is_blackwell, enable_stochastic_rounding=False, cache_philox_rounds=0,
        )
