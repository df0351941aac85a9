#!/usr/bin/env bash
# The GPU proof of the engine-faithful kernels driver, in one device call per model set:
#
#   bash bench/gpu_engine_proof.sh SRC OPS OUT MODEL [MODEL...]
#
# SRC: the checkout (cachebake + bench/); OPS: vLLM's Mamba2 ops extract
# (bench/vllm_ops/make_vllm_ops.py); OUT: where results.jsonl, table.md, table.json and
# logs.tgz go.  Wheels the device lacks (zstandard) are installed from .whl/ next to SRC.
#
# For each MODEL (a recipe, e.g. nemotron-h:8b), all models in parallel where it helps:
#   1. bake: `cachebake build --model MODEL --driver kernels` (the recipe's stored engine plan)
#      at /tmp/bake-NAME, then that bake dir is moved away (nothing may read it any more);
#   2. install the artifact at /srv/cb-NAME (another path), fresh process;
#   3. engine check: bench/engine_check/replay.py launches the recorded trace of MODEL
#      (vLLM's scheduler, metadata builder and mixer, recorded on CPU by record_trace.py: start-up
#      and 200 requests of traffic) against the installed cache -- the driver's code is not
#      involved -- then again with the installed tree read-only, as uid 65534;
#   4. `cachebake verify --driver kernels` at the installed path.
# The FIRST model also gets a cold engine check (empty cache): how much the engine would
# compile without the bake, i.e. that the check can fail.
set -uo pipefail
SRC=$(realpath "$1"); OPS=$(realpath "$2"); OUT=$(realpath "$3"); shift 3
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || { echo "usage: $0 SRC OPS OUT MODEL [MODEL...]" >&2; exit 2; }
LOGS=/tmp/engine-proof-logs
mkdir -p "$OUT" "$LOGS"; rm -rf "$LOGS"/*
if ls "$SRC"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$SRC"/.whl/*.whl || exit 1
  SITE=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC:$OPS${SITE:+:$SITE}" TRITON_CACHE_AUTOTUNING=1
cd /tmp  # not the checkout: cachebake comes from PYTHONPATH only
CB=(python3 -m cachebake.cli)
RES="$OUT/results.jsonl"; : >"$RES"
name() { echo "$1" | tr ':' '-'; }
log() { echo "== $*" | tee -a "$LOGS/steps.log"; }
record() {  # label model cmd...: run, append {"label","model","rc","wall_s"} to RES
  local label=$1 model=$2; shift 2; local t0=$(date +%s.%N)
  "$@" >"$LOGS/$label.out" 2>"$LOGS/$label.err"; local rc=$?
  local dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 2))")
  echo "{\"label\": \"$label\", \"model\": \"$model\", \"rc\": $rc, \"wall_s\": $dt}" >>"$RES"
  echo "   $label rc=$rc ${dt}s" | tee -a "$LOGS/steps.log"; return $rc
}
{ nvidia-smi -L; python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'; } 2>&1 | tee "$LOGS/env.log"

log "1. bake ${MODELS[*]} (in parallel)"
for m in "${MODELS[@]}"; do n=$(name "$m")
  rm -rf "/tmp/bake-$n" "/tmp/bake-$n.away" "/tmp/art-$n" "/srv/cb-$n"
  record "build-$n" "$m" "${CB[@]}" build --model "$m" --driver kernels --root "/tmp/bake-$n" --keep-root \
    --out "/tmp/art-$n" --work-dir "$LOGS/build-$n" --json &
done
wait
for m in "${MODELS[@]}"; do n=$(name "$m")
  "${CB[@]}" inspect "/tmp/art-$n" --json >"$LOGS/inspect-$n.json" 2>&1
  mv "/tmp/bake-$n" "/tmp/bake-$n.away"
done

log "2. install each at another path"
for m in "${MODELS[@]}"; do n=$(name "$m")
  record "install-$n" "$m" "${CB[@]}" install "/tmp/art-$n" --to "/srv/cb-$n" --json
done

log "3. engine check at the installed paths (replayed vLLM traces), then read-only as uid 65534"
AS_NOBODY=(python3 -c 'import os, sys; os.setgroups([]); os.setgid(65534); os.setuid(65534); os.execvp(sys.argv[1], sys.argv[1:])')
mkdir -p /tmp/nobody && chown 65534:65534 /tmp/nobody
for d in "$SRC" "$OPS" ${SITE:+"$SITE"}; do chmod -R o+rX "$d"; p=$d; while [ "$p" != / ]; do chmod o+x "$p"; p=$(dirname "$p"); done; done
for m in "${MODELS[@]}"; do n=$(name "$m")
  TCD=$(python3 -c "import json; print(json.load(open('$LOGS/install-$n.out'))['env']['TRITON_CACHE_DIR'])")
  T="$SRC/bench/engine_check/traces/$n.json.gz"
  record "check-$n" "$m" env TRITON_CACHE_DIR="$TCD" python3 "$SRC/bench/engine_check/replay.py" "$T" \
    --out "$LOGS/check-$n.json"
  VER=$(readlink -f "$TCD"); chmod -R a-w "$(dirname "$VER")"
  record "readonly-$n" "$m" "${AS_NOBODY[@]}" env HOME=/tmp/nobody TRITON_CACHE_DIR="$TCD" \
    python3 "$SRC/bench/engine_check/replay.py" "$T"
  cp "$LOGS/readonly-$n.out" "$LOGS/readonly-$n.json"
  "${AS_NOBODY[@]}" touch "$TCD/probe" 2>/dev/null && echo "WARNING: uid 65534 can write $TCD" | tee -a "$LOGS/steps.log"
  chmod -R u+w "$(dirname "$VER")"
done

log "4. cachebake verify at the installed paths (in parallel)"
for m in "${MODELS[@]}"; do n=$(name "$m")
  record "verify-$n" "$m" "${CB[@]}" verify --cache "/srv/cb-$n" --driver kernels --model "$m" \
    --work-dir "$LOGS/verify-$n" --json &
done
wait

first=$(name "${MODELS[0]}")
log "5. cold engine check for ${MODELS[0]} (empty cache): what the server would compile unbaked"
rm -rf /tmp/cold-cache
record "cold-$first" "${MODELS[0]}" env TRITON_CACHE_DIR=/tmp/cold-cache python3 \
  "$SRC/bench/engine_check/replay.py" "$SRC/bench/engine_check/traces/$first.json.gz" --out "$LOGS/cold-$first.json"

python3 "$SRC/bench/engine_proof_table.py" "$RES" "$LOGS" "$OUT" "${MODELS[@]}"
tar -C /tmp -czf "$OUT/logs.tgz" engine-proof-logs
cat "$OUT/table.md"
