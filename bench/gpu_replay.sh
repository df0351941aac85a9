#!/usr/bin/env bash
# Record and replay on the H200, in stages that each fit one device call (< 10 min):
#
#   bash bench/gpu_replay.sh bake SRC OPS OUT        (device, ~4-5 min)
#     1. serial bake: cachebake build --model nemotron-h --driver kernels (it records every
#        compile into the artifact: OUT/art-serial)
#     2. parallel bake, same recipe, same machine: build --seed OUT/art-serial --jobs 16
#        (carries the recorded autotune results), and again with --retune (compiles seeded,
#        benchmarks afresh: the fair comparison with a fresh bake)
#     3. replay with no GPU visible to the process (CUDA_VISIBLE_DEVICES=): cachebake replay
#        OUT/art-serial --target sm_90 --jobs 16 -> OUT/art-replay-dev; install it at another
#        path (the bake paths moved away) and `cachebake verify` there
#   bash bench/gpu_replay.sh replay-cpu SRC OPS OUT  (a CPU machine: no GPU at all)
#     cachebake replay OUT/art-serial --target sm_90 -> OUT/art-replay-cpu.  Needs a python whose
#     triton is the device's (3.6.0, same Python minor: the key hashes the wheel) and that
#     imports torch (vLLM's ops import it): PY=/path/to/python.
#   bash bench/gpu_replay.sh verify SRC OPS OUT       (device, ~1 min)
#     install OUT/art-replay-cpu at another path and `cachebake verify` there.
#   python3 bench/replay_table.py OUT > OUT/table.md
#
# SRC: the checkout (holds cachebake/ and bench/); OPS: the vLLM ops tree from
# bench/vllm_ops/make_vllm_ops.py; OUT: results (kept small: the artifacts are ~2 MB).
# What to look for: seeded wall / serial wall (goal <= 0.3); verify rc 0 with 0 compiles,
# 0 autotune benchmarks and 0 helper builds for both replayed artifacts.
set -uo pipefail
STAGE=$1; SRC=$(realpath "$2"); OPS=$(realpath "$3"); mkdir -p "$4"; OUT=$(realpath "$4")
PY=${PY:-python3}
if ls "$SRC"/.whl/*.whl >/dev/null 2>&1; then  # wheels the device lacks (zstandard)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$SRC"/.whl/*.whl || exit 1
  SITE=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC:$OPS${SITE:+:$SITE}" TRITON_CACHE_AUTOTUNING=1
cd /tmp  # cachebake must come from PYTHONPATH only
CB=("$PY" -m cachebake.cli)
RES="$OUT/results.jsonl"; LOGS="$OUT/logs"; mkdir -p "$LOGS"

timed() {  # label cmd...: run, record exit code and wall seconds; stdout to LOGS/label.json
  local label=$1; shift; local t0; t0=$(date +%s.%N)
  "$@" >"$LOGS/$label.json" 2>"$LOGS/$label.err"; local rc=$?
  local dt; dt=$("$PY" -c "print(round($(date +%s.%N) - $t0, 2))")
  echo "{\"label\": \"$label\", \"rc\": $rc, \"wall_s\": $dt}" | tee -a "$RES"
  tail -n 3 "$LOGS/$label.err"
  return $rc
}
install_and_verify() {  # label art: install at a fresh path, verify there
  local label=$1 art=$2 to=/srv/cachebake-$1
  rm -rf "$to"
  timed "install-$label" "${CB[@]}" install "$art" --to "$to" --json
  timed "verify-$label" "${CB[@]}" verify --cache "$to" --driver kernels --model nemotron-h --json
}

case $STAGE in
bake)
  { nvidia-smi -L; nproc; "$PY" -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'; } 2>&1 | tee "$LOGS/env.log"
  rm -rf /tmp/rp-* "$OUT"/art-*; : >"$RES"
  timed serial "${CB[@]}" build --model nemotron-h --driver kernels --root /tmp/rp-serial --keep-root \
    --out "$OUT/art-serial" --work-dir /tmp/rp-w-serial --json
  timed seeded "${CB[@]}" build --model nemotron-h --driver kernels --root /tmp/rp-seeded \
    --out /tmp/rp-art-seeded --work-dir /tmp/rp-w-seeded --seed "$OUT/art-serial" --jobs 16 --json
  timed seeded-retune "${CB[@]}" build --model nemotron-h --driver kernels --root /tmp/rp-retune \
    --out /tmp/rp-art-retune --work-dir /tmp/rp-w-retune --seed "$OUT/art-serial" --jobs 16 --retune --json
  timed replay-dev env CUDA_VISIBLE_DEVICES= "${CB[@]}" replay "$OUT/art-serial" --target sm_90 \
    --out "$OUT/art-replay-dev" --jobs 16 --json
  mv /tmp/rp-serial /tmp/rp-serial.away  # nothing may read the bake's own paths from here on
  install_and_verify dev "$OUT/art-replay-dev"
  mv /tmp/rp-serial.away /tmp/rp-serial
  ;;
replay-cpu)
  timed replay-cpu "${CB[@]}" replay "$OUT/art-serial" --target sm_90 --out "$OUT/art-replay-cpu" --jobs "$(nproc)" --json
  ;;
verify)
  [ -d /tmp/rp-serial ] && mv /tmp/rp-serial /tmp/rp-serial.away
  install_and_verify cpu "$OUT/art-replay-cpu"
  ;;
*) echo "stage: bake | replay-cpu | verify" >&2; exit 2 ;;
esac
