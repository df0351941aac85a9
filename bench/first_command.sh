#!/usr/bin/env bash
# README's first command, as typed, on a GPU machine: `cachebake build --model nemotron-h` with
# no other flag.  Records which driver it picked, the rounds (two quiet rounds in a row are the
# evidence of stability), the seconds, and what `inspect` verifies; then the same command on
# the same machine with CUDA hidden, which must stop in seconds with exit 7 and one line.
#
#   bash bench/first_command.sh SRC [OPS] OUT
# SRC: the checkout; OPS (optional): the vLLM ops tree from bench/vllm_ops/make_vllm_ops.py when
# the machine has torch but no vllm; OUT: where first_command.jsonl and the logs go.
set -uo pipefail
SRC=$(realpath "$1"); if [ $# -ge 3 ]; then OPS=$(realpath "$2"); OUT=$3; else OPS=""; OUT=$2; fi
mkdir -p "$OUT"; OUT=$(realpath "$OUT"); RES="$OUT/first_command.jsonl"; : >"$RES"
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC${OPS:+:$OPS}"
WORK=$(mktemp -d); ROOT=$(mktemp -d); cd "$WORK"  # a fresh working dir: --out defaults here
CB=(python3 -m cachebake.cli)

t0=$(date +%s.%N)
# exactly as typed (plus --json for the record); CACHEBAKE_ROOT only moves the default root off
# this machine's /var/cache/cachebake
CACHEBAKE_ROOT="$ROOT" "${CB[@]}" build --model nemotron-h --json >"$OUT/build.json" 2>"$OUT/build.err"
rc=$?; dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
python3 - "$OUT/build.json" "$rc" "$dt" >>"$RES" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1])) if open(sys.argv[1]).read().strip() else {}
bake = doc.get("bake", {})
print(json.dumps({"step": "build --model nemotron-h", "rc": int(sys.argv[2]), "wall_s": float(sys.argv[3]),
                  "driver": bake.get("driver"), "out": doc.get("out"), "stable": doc.get("stable"),
                  "quiet_rounds": bake.get("quiet_rounds"),
                  "per_round_compiles": [r["compiles"] for r in bake.get("per_round", [])],
                  "error": doc.get("error")}))
PY
"${CB[@]}" inspect cachebake-nemotron-h >"$OUT/inspect.txt" 2>&1
echo "{\"step\": \"inspect\", \"rc\": $?}" >>"$RES"

# the same command where no GPU is visible: one line, exit 7, in seconds
t0=$(date +%s.%N)
CACHEBAKE_ROOT="$(mktemp -d)" CUDA_VISIBLE_DEVICES="" "${CB[@]}" build --model nemotron-h \
  >/dev/null 2>"$OUT/nogpu.err"
rc=$?; dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 2))")
echo "{\"step\": \"build without a visible GPU\", \"rc\": $rc, \"wall_s\": $dt, \"lines\": $(wc -l <"$OUT/nogpu.err")}" >>"$RES"
cat "$RES"
rm -rf "$WORK" "$ROOT"
