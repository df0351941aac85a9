#!/usr/bin/env bash
# The class-coverage check on a GPU, in one device call:
#
#   bash bench/engine_check/gpu_reachable.sh SRC OPS OUT
#
# SRC: the checkout; OPS: vLLM 0.33's Mamba2 ops extract (bench/vllm_ops/make_vllm_ops.py);
# OUT: where results.jsonl and the logs go.  Wheels the device lacks (zstandard) are installed
# from SRC/.whl/ as bench/gpu_engine_proof.sh does.
#
# Two bakes of Nemotron-H 8B with `cachebake build --driver kernels`, each installed at another
# path (the bake dir moved away first), then bench/engine_check/reachable_keys.py --gpu launches
# every reachable engine step of the bake's own plan -- the warm-up decodes at EVERY batch
# 1..cap (whatever the GPU's free KV blocks make it), decode-only and mixed batches of every
# size, every 16-byte residue class, prefills across chunk/block boundaries -- against the
# installed cache and counts real compiles through Triton's listener:
#   a. the recipe's serve args (max_num_seqs 256, the stored plan);
#   b. vLLM's default max_num_seqs on an H200 (1024: FULL graphs to 512, warm-up batches to
#      1024), from bench/engine_check/plans/nemotron-h-8b-max-num-seqs-default.json.
# Expected: 0 compiles and 0 failures in both (exit 0); any compile is listed by step.
set -uo pipefail
SRC=$(realpath "$1"); OPS=$(realpath "$2"); OUT=$(realpath "$3")
LOGS=/tmp/gpu-reachable-logs
mkdir -p "$OUT" "$LOGS"; rm -rf "$LOGS"/*
if ls "$SRC"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$SRC"/.whl/*.whl || exit 1
  SITE=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$OPS:$SRC${SITE:+:$SITE}" TRITON_CACHE_AUTOTUNING=1
cd /tmp  # not the checkout: cachebake comes from PYTHONPATH only
CB=(python3 -m cachebake.cli)
PLAN="$SRC/bench/engine_check/plans/nemotron-h-8b-max-num-seqs-default.json"
RES="$OUT/results.jsonl"; : >"$RES"
{ nvidia-smi -L; python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'; } 2>&1 | tee "$LOGS/env.log"
rc=0
for case in recipe default-seqs; do
  extra=()
  if [ "$case" = default-seqs ]; then extra=(--serve-args '{"max_num_seqs": null}' --plan "$PLAN"); fi
  rm -rf "/tmp/bake-$case" "/tmp/bake-$case.away" "/tmp/art-$case" "/srv/cb-$case"
  echo "== $case: bake" | tee -a "$LOGS/steps.log"
  "${CB[@]}" build --model nemotron-h:8b --driver kernels "${extra[@]}" --root "/tmp/bake-$case" \
    --out "/tmp/art-$case" --work-dir "$LOGS/build-$case" --json >"$LOGS/build-$case.json" 2>"$LOGS/build-$case.err" || { echo "build failed" | tee -a "$LOGS/steps.log"; rc=1; continue; }
  mv "/tmp/bake-$case" "/tmp/bake-$case.away"
  "${CB[@]}" install "/tmp/art-$case" --to "/srv/cb-$case" --json >"$LOGS/install-$case.json" 2>"$LOGS/install-$case.err" || { rc=1; continue; }
  TCD=$(python3 -c "import json; print(json.load(open('$LOGS/install-$case.json'))['env']['TRITON_CACHE_DIR'])")
  echo "== $case: reachable steps against $TCD" | tee -a "$LOGS/steps.log"
  check=(--model nemotron-h:8b --gpu)
  if [ "$case" = default-seqs ]; then check+=(--plan "$PLAN"); fi
  TRITON_CACHE_DIR="$TCD" python3 "$SRC/bench/engine_check/reachable_keys.py" "${check[@]}" \
    --out "$LOGS/check-$case.jsonl" >"$LOGS/check-$case.out" 2>"$LOGS/check-$case.err"
  crc=$?; [ $crc -eq 0 ] || rc=$crc
  sed "s/^{/{\"case\": \"$case\", \"rc\": $crc, /" "$LOGS/check-$case.jsonl" >>"$RES"
  tail -c 600 "$LOGS/check-$case.out"
done
tar -C /tmp -czf "$OUT/logs.tgz" gpu-reachable-logs
exit $rc
