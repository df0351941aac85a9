#!/usr/bin/env bash
# The GPU proof, in one device call: bake vLLM's Mamba2 kernels at Nemotron-H 8B shapes with
# cachebake's own commands, install the artifact at another path, verify there, and time cold,
# same-path warm and restored sweeps in fresh processes; then the restored cache read-only,
# used by uid 65534.
#
#   bash bench/gpu_bake.sh SRC OPS OUT
# SRC: a dir holding the cachebake package and bench/ (the checkout); OPS: the vLLM ops tree
# from bench/vllm_ops/make_vllm_ops.py; OUT: where results.jsonl, table.md and logs.tgz go.
# Wheels the device lacks (zstandard) are installed from .whl/ next to SRC if present.
set -uo pipefail
SRC=$(realpath "$1"); OPS=$(realpath "$2"); OUT=$(realpath "$3")
mkdir -p "$OUT" /tmp/gpu-bake-logs
LOGS=/tmp/gpu-bake-logs
if ls "$SRC"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$SRC"/.whl/*.whl || exit 1
  SITE=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC:$OPS${SITE:+:$SITE}" TRITON_CACHE_AUTOTUNING=1
cd /tmp  # not the checkout: its cachebake/ must come from PYTHONPATH only
CB=(python3 -m cachebake.cli)
A=/tmp/bake-A; B=/srv/cachebake-B; ART=/tmp/artifact; RES="$OUT/results.jsonl"
rm -rf "$A" "$A.away" "$B" "$ART" /tmp/cold-* /tmp/ev-*.jsonl "$LOGS"/*; : >"$RES"

step() { echo "== $*" | tee -a "$LOGS/steps.log"; }
timed() {  # label cmd...: run, record exit code and wall seconds
  local label=$1; shift; local t0=$(date +%s.%N)
  "$@" >"$LOGS/$label.out" 2>"$LOGS/$label.err"; local rc=$?
  local dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 3))")
  echo "{\"label\": \"$label\", \"rc\": $rc, \"wall_s\": $dt}" >>"$RES"
  echo "   rc=$rc ${dt}s" | tee -a "$LOGS/steps.log"; tail -n 3 "$LOGS/$label.err"
  return $rc
}
sweep() {  # label cache [runner...]: one timed sweep in a fresh process
  local label=$1 cache=$2; shift 2
  "$@" env TRITON_CACHE_DIR="$cache" python3 "$SRC/bench/timed_sweep.py" --label "$label" \
    --log "/tmp/ev-$label.jsonl" 2>"$LOGS/$label.err" | tail -n 1 | tee -a "$RES"
  tail -n 2 "$LOGS/$label.err"
}

{ nvidia-smi -L; python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'; } 2>&1 | tee "$LOGS/env.log"

step "build: cachebake build --model nemotron-h --driver kernels --root $A --out $ART"
timed build "${CB[@]}" build --model nemotron-h --driver kernels --root "$A" --keep-root --out "$ART" --work-dir "$LOGS/build" --json
"${CB[@]}" inspect "$ART" --json >"$LOGS/inspect.json" 2>&1
"${CB[@]}" inspect "$ART" 2>&1 | head -n 40

step "move the bake path away: nothing may read $A from here on"
mv "$A" "$A.away"

step "install to another path: cachebake install $ART --to $B"
timed install "${CB[@]}" install "$ART" --to "$B" --json
cat "$LOGS/install.out" | head -c 1500; echo
timed install_again "${CB[@]}" install "$ART" --to "$B" --json
TCD=$(python3 -c "import json,sys; print(json.load(open('$LOGS/install.out'))['env']['TRITON_CACHE_DIR'])")
echo "TRITON_CACHE_DIR=$TCD"

step "verify at $B"
timed verify "${CB[@]}" verify --cache "$B" --driver kernels --model nemotron-h --json
head -c 1500 "$LOGS/verify.out"; echo

step "restored sweeps at $B (fresh processes)"
for i in 1 2 3; do sweep "restored$i" "$TCD"; done

step "same-path warm sweeps at $A (the bake's own cache)"
mv "$A.away" "$A"
for i in 1 2 3; do sweep "warm$i" "$A/triton"; done

step "cold sweep (empty cache)"
sweep cold /tmp/cold-1

step "read-only installed cache, used by uid 65534"
VER=$(readlink -f "$TCD")
chmod -R a-w "$(dirname "$VER")"
for d in "$SRC" "$OPS" ${SITE:+"$SITE"}; do chmod -R o+rX "$d"; p=$d; while [ "$p" != / ]; do chmod o+x "$p"; p=$(dirname "$p"); done; done
mkdir -p /tmp/nobody && chown 65534:65534 /tmp/nobody
AS_NOBODY=(python3 -c 'import os, sys; os.setgroups([]); os.setgid(65534); os.setuid(65534); os.execvp(sys.argv[1], sys.argv[1:])')
sweep readonly_nobody "$TCD" "${AS_NOBODY[@]}" env HOME=/tmp/nobody
"${AS_NOBODY[@]}" touch "$TCD/probe" 2>/dev/null && echo "WARNING: uid 65534 can write the cache" || echo "the cache is read-only for uid 65534"

du -sb "$A/triton" | tee -a "$LOGS/steps.log"
python3 "$SRC/bench/gpu_table.py" "$RES" "$LOGS/inspect.json" "$LOGS/build.out" "$LOGS/verify.out" | tee "$OUT/table.md"
cp "$LOGS/build.out" "$OUT/build.json" 2>/dev/null
tar -C /tmp -czf "$OUT/logs.tgz" gpu-bake-logs
