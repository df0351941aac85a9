#!/usr/bin/env bash
# Cold then warm sweep of the kernels driver on a CUDA GPU, each in a fresh process, with
# real-compile counts; then the same cache moved to another path (group files untouched).
# Usage: bash bench/kernels_sweep_gpu.sh SRC_DIR OPS_DIR COUNTER OUT_DIR
#   SRC_DIR: holds the cachebake package; OPS_DIR: bench/vllm_ops/make_vllm_ops.py's output;
#   COUNTER: bench/count_compiles.py.  Logs and a tarball of the cold cache go to OUT_DIR.
set -uo pipefail
SRC=$(realpath "$1"); OPS=$(realpath "$2"); COUNT=$(realpath "$3"); OUT=$(realpath "$4")
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC:$OPS" TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR=/tmp/c1
cd /tmp  # not a repo root: a checkout's own cachebake/ must not shadow $SRC
rm -rf /tmp/c1 /tmp/c2
sweep() { python3 "$COUNT" -m cachebake.vllm.kernels.driver --model nemotron-h; }
{ nvidia-smi -L; python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'; } 2>&1 | tee "$OUT/env.log"
echo "== cold (empty $TRITON_CACHE_DIR)"; sweep 2>&1 | tee "$OUT/cold.log"
echo "== warm (fresh process, same cache)"; sweep 2>&1 | tee "$OUT/warm.log"
echo "== warm, plain python3 -m"; { time python3 -m cachebake.vllm.kernels.driver --model nemotron-h; } 2>&1 | tee "$OUT/warm_plain.log"
{ echo "== cache"; du -sh /tmp/c1; echo "files $(find /tmp/c1 -type f | wc -l) cubins $(find /tmp/c1 -name '*.cubin' | wc -l)" \
  "autotune $(find /tmp/c1 -name '*.autotune.json' | wc -l) so $(find /tmp/c1 -name '*.so' | wc -l)"; } 2>&1 | tee "$OUT/cache.log"
tar -C /tmp -czf "$OUT/c1_cache.tgz" c1
echo "== moved to /tmp/c2, /tmp/c1 gone, __grp__ child_paths not rewritten"
mv /tmp/c1 /tmp/c2
TRITON_CACHE_DIR=/tmp/c2 sweep 2>&1 | tee "$OUT/moved.log"
