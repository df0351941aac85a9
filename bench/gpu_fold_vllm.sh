#!/usr/bin/env bash
# Issue 32's vllm-role fold-back on the H200 (written on CPU, NOT RUN yet), device calls < 10 min,
# state in /tmp/gfv between calls.  The bake of tests/data (vLLM 0.24, Nemotron-H 8B, sm_90) is
# installed with an overlay as uid 65534 and served with a flag it was not baked for
# (--mamba-ssm-cache-dtype bfloat16); its Triton misses go to the overlay's log, its vLLM
# torch.compile dirs are logged by the server's exit hook and by `cachebake misses --vllm-cache`;
# `replay --base --misses` plans (--dry-run) and runs one vLLM build round with the logged flags;
# the folded bake is served again with the flag: expect 0 Triton compiles and
# "Directly load AOT compilation" in the server log, engine init near a baked start's.
#
#   bash bench/gpu_fold_vllm.sh setup|miss|fold|again      (from the checkout's root; OUT=... for results)
#
# setup  as bench/gpu_identity_serve.sh setup (checkout, egg-info for the vllm plugin entry point,
#        .carry/tok, .whl); vLLM 0.24 in /tmp/vsite (../shared/vllm-on-h200)
# miss   install tests/data's bake at /srv/cb --overlay /tmp/gfv/ovl as uid 65534; serve with the
#        new flag (bench/vllm_serve_run.py, traffic); then `cachebake misses --vllm-cache`    (~4 min)
# fold   replay --base ART --misses LOG --dry-run, then for real (one vLLM round)          (~5 min)
# again  install the folded bake at /srv/cb2 --overlay /tmp/gfv/ovl2; serve with the flag    (~3 min)
set -uo pipefail
STAGE=${1:?usage: bash bench/gpu_fold_vllm.sh setup|miss|fold|again}
SRC=$(pwd)
G=/tmp/gfv; R=$G/results; OUT=${OUT:-$G/out}
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export PYTHONPATH="$G/src:$G/site:/tmp/vsite"
CB=(python3 -m cachebake.cli)
ART=$G/cachebake-nemotron-h; ART2=$G/folded
NOBODY=65534; HOMEN=$G/home
AS_NOBODY=(setpriv --reuid=$NOBODY --regid=$NOBODY --clear-groups env HOME=$HOMEN)
NEW_FLAG=(--mamba-ssm-cache-dtype bfloat16)
log() { echo "== [$STAGE] $*" | tee -a "$R/steps.log"; }
timed() {  # name cmd...: rc and seconds into stages.jsonl, the output kept
  local name=$1; shift; local t0; t0=$(date +%s.%N)
  "$@" >"$R/$name.out" 2>"$R/$name.err"; local rc=$?
  local dt; dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  echo "{\"stage\": \"$STAGE\", \"name\": \"$name\", \"rc\": $rc, \"wall_s\": $dt}" >>"$R/stages.jsonl"
  log "$name: rc=$rc ${dt}s"; tail -n 3 "$R/$name.err"
  return $rc
}
serve_args_with_flag() {  # ART ROOT OVERLAY OUT.json: serve-args' JSON plus the new flag
  "${AS_NOBODY[@]}" "${CB[@]}" serve-args "$1" --root "$2" --overlay "$3" --json >"$4.base" || return 1
  python3 - "$4.base" "$4" "${NEW_FLAG[@]}" <<'PY'
import json, sys
sa = json.load(open(sys.argv[1]))
sa["argv"] = sa["argv"] + sys.argv[3:]
json.dump(sa, open(sys.argv[2], "w"))
PY
}
serve() {  # label SA.json port: vllm serve as uid 65534, traffic, the server log kept
  timed "serve-$1" python3 "$G/src/bench/vllm_serve_run.py" --serve-args "$2" --tok "$G/tok" --port "$3" \
    --work "$G/w-$1" --uid $NOBODY --home "$HOMEN" --traffic --out "$R/serve-$1.json"
  cp "$G/w-$1/server.log" "$R/server-$1.log" 2>/dev/null
  python3 - "$R/serve-$1.json" "$R/server-$1.log" <<'PY' | tee -a "$R/steps.log"
import json, sys
r = json.load(open(sys.argv[1]))
log = open(sys.argv[2], errors="replace").read() if len(sys.argv) > 2 else ""
print(json.dumps({k: r.get(k) for k in ("ready_s", "init_engine_s", "torch_compile_s", "aot_loaded",
                                         "triton_compiles", "triton_compiles_traffic")} |
                 {"log_aot_loaded": "Directly load AOT compilation" in log}))
PY
}
finish() { tar -C "$G" -czf "$OUT/results-$STAGE.tgz" results; }
trap finish EXIT

case $STAGE in
setup)
  rm -rf "$G/src" && mkdir -p "$G/src" "$HOMEN" && chmod 755 "$G"
  cp -r "$SRC/cachebake" "$SRC/bench" "$SRC/cachebake.egg-info" "$G/src/"
  cp -r "$SRC/.carry/tok" "$G/tok"
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$G/site" "$SRC"/.whl/*.whl
  rm -rf "$ART" && tar -C "$G" -xf "$SRC/tests/data/nemotron-h-8b-vllm-0.24-sm_90-2026-12-01.artifact.tar"
  python3 -c "from cachebake.recipes import load_recipe; from cachebake.vllm.engine import write_model_dir; write_model_dir(load_recipe('nemotron-h'), '/models/nemotron-h-8b')"
  chown -R $NOBODY:$NOBODY "$HOMEN"; chmod -R a+rX "$G" /models
  { nvidia-smi -L; python3 -c 'import sys, torch, triton, vllm; print(sys.version.split()[0], torch.__version__, triton.__version__, vllm.__version__)'; } 2>&1 | tee "$R/env.log"
  ;;
miss)
  rm -rf /srv/cb "$G/ovl" && mkdir -p /srv/cb && chown $NOBODY:$NOBODY /srv/cb
  timed install "${AS_NOBODY[@]}" "${CB[@]}" install "$ART" --to /srv/cb --target sm_90 --overlay "$G/ovl" --json
  serve_args_with_flag "$ART" /srv/cb "$G/ovl" "$R/sa-miss.json"
  serve miss "$R/sa-miss.json" 8021
  # the exit hook's lines (if vLLM exited cleanly), then the scan, which adds what the hook did not
  timed misses-vllm "${AS_NOBODY[@]}" "${CB[@]}" misses "$G/ovl/misses.jsonl" --vllm-cache /srv/cb/vllm \
    --serve-args "$(python3 -c "import json,shlex,sys; a=json.load(open(sys.argv[1]))['argv']; print(shlex.join(a[a.index('serve')+2:]))" "$R/sa-miss.json")" \
    --model-ref /models/nemotron-h-8b --json
  cp "$G/ovl/misses.jsonl" "$R/misses.jsonl"
  python3 -c "import json; d=json.load(open('$R/misses-vllm.out')); print('misses', d['misses'], 'vllm', [(g['kind'], g['key']) for g in d['groups'] if g['kind']=='vllm'])" | tee -a "$R/steps.log"
  ;;
fold)
  rm -rf "$ART2" /var/cache/cachebake
  timed fold-plan "${CB[@]}" replay --base "$ART" --misses "$R/misses.jsonl" --out "$ART2" --dry-run
  cat "$R/fold-plan.out"
  timed fold "${CB[@]}" replay --base "$ART" --misses "$R/misses.jsonl" --out "$ART2" --json
  python3 -c "import json; d=json.load(open('$R/fold.out')); print(json.dumps({'kernels': len(d['compiled']), 'vllm': d['vllm']}, default=str)[:3000])" | tee -a "$R/steps.log"
  timed diff "${CB[@]}" diff "$ART" "$ART2"
  chmod -R a+rX "$ART2"
  ;;
again)
  rm -rf /srv/cb2 "$G/ovl2" && mkdir -p /srv/cb2 && chown $NOBODY:$NOBODY /srv/cb2
  timed install2 "${AS_NOBODY[@]}" "${CB[@]}" install "$ART2" --to /srv/cb2 --target sm_90 --overlay "$G/ovl2" --json
  serve_args_with_flag "$ART2" /srv/cb2 "$G/ovl2" "$R/sa-again.json"
  serve again "$R/sa-again.json" 8022
  wc -l "$G/ovl2/misses.jsonl" 2>/dev/null | tee -a "$R/steps.log"  # expect none: no Triton miss
  ;;
*) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
