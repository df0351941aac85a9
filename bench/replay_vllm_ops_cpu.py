#!/usr/bin/env python3
"""vLLM's own Mamba2 Triton kernels, recorded and replayed on a CPU machine: replayed keys vs
the JIT's keys for sm_90, sm_100 and sm_120.

Needs a Python with triton 3.6 and torch (vLLM's ops import it; a CPU build is enough: the
kernels are never launched) and the ops extract from bench/vllm_ops/make_vllm_ops.py.  The JIT
runs with tests/kit/jit_launch.py's stand-in driver (no GPU); vLLM's Python wrappers run for real
on CPU tensors and launch through Triton's JIT, which specializes, keys and compiles.

    python bench/replay_vllm_ops_cpu.py OPS_DIR WORK_DIR
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def launches() -> None:
    """One process: vLLM's causal_conv1d_update and rms_norm_gated through their wrappers."""
    import torch
    import triton

    from cachebake.capture import monitor

    if os.environ.get("RECORD_LOG"):
        monitor.activate(os.environ["RECORD_LOG"])
    seen = []
    previous = triton.knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        seen.append(f"{metadata['hash']}:{int(cache_hit)}")
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    triton.knobs.compilation.listener = listener
    import jit_launch
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
    from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated

    jit_launch.use_target(int(os.environ["ARCH"]))
    dim, width, batch, bf16 = 256, 4, 3, torch.bfloat16
    causal_conv1d_update(torch.randn(batch, dim, dtype=bf16), torch.zeros(8, dim, width - 1, dtype=bf16),
                         torch.randn(dim, width, dtype=bf16), torch.randn(dim, dtype=bf16), "silu",
                         conv_state_indices=torch.arange(1, batch + 1, dtype=torch.int32).unsqueeze(-1))
    y = torch.randn(16, 512, dtype=bf16)
    rms_norm_gated(y, torch.ones(512, dtype=bf16), bias=None, z=torch.randn_like(y), eps=1e-5,
                   norm_before_gate=False)
    print(" ".join(seen))


def run(ops: str, arch: int, cache: Path, **env) -> list[tuple[str, bool]]:
    path = os.pathsep.join([ops, str(REPO), str(REPO / "tests" / "kit")])
    out = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": path, "ARCH": str(arch), "TRITON_CACHE_DIR": str(cache),
                              **{k: str(v) for k, v in env.items()}})
    return [(h, hit == "1") for h, hit in (x.split(":") for x in out.stdout.split()[-2:])]


def main(ops: str, work: Path) -> None:
    sys.path[:0] = [ops, str(REPO), str(REPO / "tests" / "kit")]
    from cachebake.capture.recorder import load_record_log
    from cachebake.replay.engine import compile_record

    run(ops, 90, work / "recorded", RECORD_LOG=work / "events.jsonl")
    record = load_record_log(work / "events.record.jsonl")
    print("| target | entries | replayed == JIT keys | JIT against the replayed cache: misses | problems |")
    print("| --- | --- | --- | --- | --- |")
    for arch in (90, 100, 120):
        res = compile_record(record, f"sm_{arch}", work / f"replayed-{arch}", jobs=2)
        jit = {h for h, _ in run(ops, arch, work / f"jit-{arch}")}
        again = run(ops, arch, work / f"replayed-{arch}")
        print(f"| sm_{arch} | {len(res.replayed)} | {({s.hash for s in res.replayed} == jit)} | "
              f"{sum(not hit for _, hit in again)} | {len(res.problems)} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        launches()
    else:
        main(os.path.abspath(sys.argv[1]), Path(sys.argv[2]).absolute())
