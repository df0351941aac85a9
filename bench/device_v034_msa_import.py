"""On the lent H200 only: vLLM 0.34's kernel warm-up imports the MiniMax-M3 MSA warm-up on every
CUDA start (model_executor/warmup/kernel_warmup.py:366-372), which imports nvidia-cutlass-dsl and
quack (models/minimax_m3/nvidia/ops/index_decode_score.py:16).  The vllm/vllm-openai image has
both; the carried install (.vllm34/PLAN.md) does not, and round 1 of the bake died on that import
(bench/results/gpu-2026-12-03-v034/1-bake-cutlass-import.tgz).  This wraps that one import in
`try/except ImportError` in the carried copy, where cutlass is absent: a MiniMax-M3-only warm-up;
kernel_warmup.py is not a file torch.compile traces, so no compile key changes.  Idempotent.

    python3 bench/device_v034_msa_import.py SITE      (SITE: where vllm 0.34 is installed)
"""

import importlib.util
import sys
from pathlib import Path

OLD = """        from vllm.model_executor.warmup.minimax_m3_msa_warmup import (
            minimax_m3_msa_warmup,
        )

        minimax_m3_msa_warmup(worker)
"""
NEW = """        try:  # cachebake's carried vLLM lacks cutlass-dsl/quack (bench/device_v034_msa_import.py)
            from vllm.model_executor.warmup.minimax_m3_msa_warmup import (
                minimax_m3_msa_warmup,
            )
        except ImportError:
            minimax_m3_msa_warmup = None
        if minimax_m3_msa_warmup is not None:
            minimax_m3_msa_warmup(worker)
"""


def main(site: str) -> int:
    path = Path(site) / "vllm" / "model_executor" / "warmup" / "kernel_warmup.py"
    text = path.read_text()
    if NEW in text:
        print(f"{path}: already patched")
        return 0
    sys.path.insert(0, site)
    if all(importlib.util.find_spec(m) is not None for m in ("cutlass", "quack")):
        print("cutlass and quack are installed: nothing to patch")
        return 0
    if text.count(OLD) != 1:
        print(f"{path}: the MSA import is not where vLLM 0.34.0 has it; not patched", file=sys.stderr)
        return 1
    tmp = path.with_suffix(".py.cb-tmp")
    tmp.write_text(text.replace(OLD, NEW))
    tmp.replace(path)  # a new inode: hard-linked copies of the site keep their own
    print(f"{path}: MSA warm-up import made optional (cutlass absent)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
