#!/usr/bin/env bash
# Issue 32 on the GPU, in one device call: the bake Job `cachebake bake-job` writes, its own
# argv run on this GPU (no cluster here: the Pod's two containers run as the Job runs them, one
# after the other, /work a scratch dir, HOME under it, uid 65534); its push to a loopback
# registry (where docker-registry and skopeo exist); an sm_120 replay of the bake; `merge` of
# the two; `install` of the merged artifact with no --target (the H200 must get sm_90);
# `verify` there (0 compiles); `diff` of the two bakes (exit 14, target and ptxas named).
#
#   VSITE=/tmp/vsite MODEL=nemotron-h DRIVER=kernels bash bench/gpu_fleet.sh SRC OUT
# SRC: the checkout (cachebake/ on PYTHONPATH); OUT: results.jsonl, jobs.yaml, logs.
# DRIVER=kernels bakes vLLM's Mamba2 ops (minutes); DRIVER=vllm the whole engine (~5.5 min).
set -uo pipefail
SRC=$(realpath "$1"); OUT=$(realpath "$2"); mkdir -p "$OUT"
MODEL=${MODEL:-nemotron-h}; DRIVER=${DRIVER:-kernels}
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC${VSITE:+:$VSITE}${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/fleet; LOGS="$OUT/logs"; RES="$OUT/results.jsonl"
rm -rf "$W" "$LOGS"; mkdir -p "$W/work/home" "$LOGS"; : >"$RES"
chown -R 65534:65534 "$W/work"
cd /tmp  # cachebake from PYTHONPATH only
CB=(python3 -m cachebake.cli)
AS_NOBODY=(python3 -c 'import os, sys; os.setgroups([]); os.setgid(65534); os.setuid(65534); os.execvp(sys.argv[1], sys.argv[1:])')
step() { echo "== $*" | tee -a "$LOGS/steps.log"; }
record() { echo "{\"label\": \"$1\", \"rc\": $2}" >>"$RES"; echo "   rc=$2" | tee -a "$LOGS/steps.log"; }
for d in "$SRC" ${VSITE:+"$VSITE"}; do chmod -R o+rX "$d"; p=$d; while [ "$p" != / ]; do chmod o+x "$p"; p=$(dirname "$p"); done; done
{ nvidia-smi -L; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; } 2>&1 | tee "$LOGS/env.log"

REG=127.0.0.1:5000
step "1. the Jobs, as bake-job writes them"
"${CB[@]}" bake-job --gpu NVIDIA-H200=sm_90 --model "$MODEL" --driver "$DRIVER" \
  --builder-image local/cachebake-builder:1 --repository "docker://$REG/bakes" --no-tls-verify \
  >"$OUT/jobs.yaml" 2>"$LOGS/bake-job.err"; record bake-job $?
# each container's argv from the Job itself: `cachebake` -> this checkout, /work -> $W/work
argv() {  # container-name -> NUL-separated argv
  python3 - "$OUT/jobs.yaml" "$1" "$W" <<'PY'
import sys, yaml
doc = next(yaml.safe_load_all(open(sys.argv[1])))
spec = doc["spec"]["template"]["spec"]
(c,) = [c for c in spec["initContainers"] + spec["containers"] if c["name"] == sys.argv[2]]
argv = [a.replace("/work", sys.argv[3] + "/work") for a in c["command"]]
assert argv[0] == "cachebake"
sys.stdout.write("\0".join([sys.executable, "-m", "cachebake.cli", *argv[1:]]))
PY
}
mapfile -d '' BAKE < <(argv bake); mapfile -d '' PUSH < <(argv push)
echo "   bake: ${BAKE[*]}" | tee -a "$LOGS/steps.log"

step "2. the Job's bake container, as uid 65534, HOME=$W/work/home"
"${AS_NOBODY[@]}" env -i PATH="$PATH" HOME="$W/work/home" PYTHONPATH="$PYTHONPATH" "${BAKE[@]}" \
  >"$LOGS/bake.json" 2>"$LOGS/bake.err"; record job_bake $?
tail -n 3 "$LOGS/bake.err"

step "3. the Job's push container, to a loopback registry (if docker-registry and skopeo are here)"
if command -v docker-registry >/dev/null && command -v skopeo >/dev/null; then
  printf 'version: 0.1\nstorage: {filesystem: {rootdirectory: %s/reg}}\nhttp: {addr: %s}\n' "$W" "$REG" >"$W/reg.yml"
  docker-registry serve "$W/reg.yml" >"$LOGS/registry.log" 2>&1 & REGPID=$!
  sleep 2
  "${PUSH[@]}" >"$LOGS/push.json" 2>"$LOGS/push.err"; record job_push $?
  SRC90="docker://$REG/bakes/$MODEL:sm_90"
else
  echo "   no docker-registry/skopeo here: merging the local bake" | tee -a "$LOGS/steps.log"
  SRC90="$W/work/bake"
fi

step "4. an sm_120 replay of the bake (no sm_120 GPU needed; --partial: Inductor kernels of a vllm bake do not replay)"
"${CB[@]}" replay "$W/work/bake" --target sm_120 --out "$W/b120" --jobs 8 --partial --json >"$LOGS/replay.json" 2>"$LOGS/replay.err"
record replay_sm120 $?

step "5. merge sm_90 ($SRC90) + sm_120 -> $W/merged"
"${CB[@]}" merge "$SRC90" "$W/b120" --out "$W/merged" --no-tls-verify --json >"$LOGS/merge.json" 2>"$LOGS/merge.err"
record merge $?
"${CB[@]}" inspect "$W/merged" >"$LOGS/inspect.txt" 2>&1

step "6. install the merged artifact, no --target: this H200 must get cuda:90"
"${CB[@]}" install "$W/merged" --to "$W/srv" --json >"$LOGS/install.json" 2>"$LOGS/install.err"; record install $?
python3 -c "import json; print('   installed target', json.load(open('$LOGS/install.json'))['target'])" | tee -a "$LOGS/steps.log"

step "7. verify there: 0 compiles expected"
"${CB[@]}" verify --cache "$W/srv" --driver "$DRIVER" --model "$MODEL" >"$LOGS/verify.out" 2>"$LOGS/verify.err"
record verify $?; tail -n 2 "$LOGS/verify.out"

step "8. diff the sm_90 bake and the sm_120 replay: exit 14, target and ptxas named"
"${CB[@]}" diff "$W/work/bake" "$W/b120" >"$LOGS/diff.txt" 2>&1; record diff $?
"${CB[@]}" diff "$W/work/bake" "$W/b120" --json >"$LOGS/diff.json" 2>/dev/null
head -n 12 "$LOGS/diff.txt"

[ -n "${REGPID:-}" ] && kill "$REGPID"
echo "results: $RES"
