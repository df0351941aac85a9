#!/usr/bin/env bash
# Issue 29 on the H200: vLLM 0.34 (torch 2.14, Triton 3.8), in device calls of < 9 minutes
# (state in /tmp/g34 between calls).  README's first command bakes Nemotron-H 8B; the artifact is
# installed at another path by another uid; `vllm serve` from `cachebake serve-args` runs as that
# uid with its own HOME, driven by `vllm bench serve`; then baked starts interleaved with vLLM's
# own warm restart (the bake root, root, HOME=/root), each start broken down per phase from the
# server's log (bench/ready_breakdown.py).
#
#   bash bench/gpu_v034_serve.sh STAGE [N]      (from the checkout's root; results -> $OUT)
#
# STAGE, in order:
#   setup        copy the checkout, cachebake.egg-info (the vllm plugin's entry point), the
#                tokenizer (.carry/tok) and cachebake's wheels (.whl) where uid 65534 reads them;
#                versions; which of vLLM's start-up features this vLLM has
#   bake         cd /tmp/g34 && cachebake build --model nemotron-h --keep-root (README's first
#                command; --keep-root keeps the bake root for the warm restart)          (~6 min)
#   serve        install at /srv/cb as uid 65534, serve-args, `verify --check-only` with its env
#                (expect rc 0), `vllm serve` as uid 65534 with HOME=/tmp/g34/home-other and the
#                traffic of bench/vllm_serve_run.py (random, long, sequential, top-p, top-k+top-p,
#                prefix_repetition, 256-way decode, Poisson): Triton compiles counted by
#                cachebake's compile monitor, the AOT load from vLLM's log          (~5-7 min)
#   interleave N N baked starts (uid 65534, /srv/cb, other HOME) alternating with N warm restarts
#                (root, /var/cache/cachebake, HOME=/root), no traffic; each appended to
#                interleave.jsonl, so calls add up (default N=2: ~5 min)
#   table        the summary of everything so far (every stage prints it last too)
#
# vLLM: VSITE (default /tmp/v34site, .vllm34/PLAN.md's install).  For vLLM 0.24 (the fallback):
#   VSITE=/tmp/vsite bash bench/gpu_v034_serve.sh STAGE
set -uo pipefail
STAGE=${1:?usage: bash bench/gpu_v034_serve.sh setup|bake|serve|interleave [N]|table}
N=${2:-2}
SRC=$(pwd)
VSITE=${VSITE:-/tmp/v34site}
G=${G34:-/tmp/g34}; R=$G/results; OUT=${OUT:-$G/out}
mkdir -p "$R" "$OUT"
# .vllm34/PLAN.md's environment for every run (the FlashInfer sampler is not carried)
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_DEEP_GEMM=0 VLLM_NO_USAGE_STATS=1
unset TZ  # the server's log stamps are read as UTC (ready_breakdown)
export PYTHONPATH="$G/src:$G/site:$VSITE"
CB=(python3 -m cachebake.cli)
ART=$G/cachebake-nemotron-h
NOBODY=65534
OTHER_HOME=$G/home-other
AS_NOBODY=(setpriv --reuid=$NOBODY --regid=$NOBODY --clear-groups env HOME=$OTHER_HOME)
log() { echo "== [$STAGE] $*" | tee -a "$R/steps.log"; }
timed() {  # name cmd...: rc and seconds into stages.jsonl, the output kept
  local name=$1; shift; local t0; t0=$(date +%s.%N)
  "$@" >"$R/$name.out" 2>"$R/$name.err"; local rc=$?
  local dt; dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  echo "{\"stage\": \"$STAGE\", \"name\": \"$name\", \"rc\": $rc, \"wall_s\": $dt}" >>"$R/stages.jsonl"
  log "$name: rc=$rc ${dt}s"; tail -n 3 "$R/$name.err"
  return $rc
}
summary() { python3 "$SRC/bench/gpu_v034_table.py" "$R" 2>&1 | tee "$R/summary.txt"; }
finish() { summary; tar -C "$G" -czf "$OUT/results-$STAGE.tgz" results; }
trap finish EXIT
serve_once() {  # label port work sa.json [setpriv uid home] [--traffic]: one start, measured
  local label=$1 port=$2 work=$3 sa=$4; shift 4
  rm -rf "$work"
  timed "serve-$label" python3 "$G/src/bench/vllm_serve_run.py" --serve-args "$sa" --tok "$G/tok" \
    --port "$port" --work "$work" "$@" --out "$R/serve-$label.json"
  cp "$work/server.log" "$R/server-$label.log" 2>/dev/null
  cp "$work/events.jsonl" "$R/events-$label.jsonl" 2>/dev/null
}

case $STAGE in
setup)
  rm -rf "$G/src" && mkdir -p "$G/src" "$OTHER_HOME" && chmod 755 "$G"
  cp -r "$SRC/cachebake" "$SRC/bench" "$SRC/cachebake.egg-info" "$G/src/"
  cp -r "$SRC/.carry/tok" "$G/tok"
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$G/site" "$SRC"/.whl/*.whl
  python3 "$SRC/bench/device_v034_msa_import.py" "$VSITE" 2>&1 | tee -a "$R/env.log"  # not in the vllm-openai image's case
  chown -R $NOBODY:$NOBODY "$OTHER_HOME"; chmod -R a+rX "$G"
  { nvidia-smi -L
    python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
    python3 -c 'import vllm, zstandard, cachebake; print("vllm", vllm.__version__, vllm.__file__, cachebake.__file__)'
    python3 -c 'from cachebake.vllm import versions as v; import vllm; print("hash scheme", v.installed_scheme().name, "startup plan", v.has_startup_plan())'
    python3 -c 'import importlib.metadata as m; print([e.name for e in m.entry_points(group="vllm.general_plugins")])'
    "${AS_NOBODY[@]}" python3 -c 'import vllm.envs, cachebake.cli; print("nobody imports ok")'; } 2>&1 | tee -a "$R/env.log"
  ;;
bake)
  rm -rf /var/cache/cachebake "$ART" "$G/bw"
  cd "$G" && timed build "${CB[@]}" build --model nemotron-h --keep-root --work-dir "$G/bw" --json
  "${CB[@]}" inspect "$ART" --json >"$R/inspect.json" 2>&1
  python3 - "$ART" >"$R/identity.json" <<'EOF'
import json, sys
bake = json.load(open(sys.argv[1] + "/cachebake.json"))["bakes"]["cuda:90"]["bake"]
ci = bake.get("compile_identity") or {}
fp = json.load(open(sys.argv[1] + "/cachebake.json"))["bakes"]["cuda:90"].get("fingerprint") or {}
print(json.dumps({"vllm_version": ci.get("vllm_version"), "hash_scheme": ci.get("hash_scheme"),
                  "path_factors": ci.get("path_factors"), "set_factors": ci.get("set_factors"),
                  "engine": ci.get("engine"), "backend_dirs": ci.get("backend_dirs"),
                  "aot": [{"hash": a.get("hash"), "n_factors": len(a.get("factor_reprs") or a.get("factors") or [])}
                          for a in ci.get("aot") or []],
                  "torch_compile": bake.get("torch_compile"), "startup_plan": bake.get("startup_plan"),
                  "fingerprint_vllm_env": fp.get("vllm_env"), "rounds": bake.get("rounds"),
                  "per_round": [{k: r.get(k) for k in ("round", "compiles", "autotunes", "seconds")}
                                for r in bake.get("per_round", [])]}, indent=1, default=str))
EOF
  head -80 "$R/identity.json"
  cp -r "$G/bw"/*.jsonl "$R/" 2>/dev/null
  ls -la /var/cache/cachebake/vllm /var/cache/cachebake/vllm/startup_plan >"$R/bake-root.txt" 2>&1
  tar -C "$G" -cf "$OUT/artifact.tar" "$(basename "$ART")"
  chmod -R a+rX "$ART"
  ;;
serve)
  rm -rf /srv/cb && mkdir -p /srv/cb && chown $NOBODY:$NOBODY /srv/cb
  timed install-moved "${AS_NOBODY[@]}" "${CB[@]}" install "$ART" --to /srv/cb --target sm_90 --json
  timed serve-args-moved "${AS_NOBODY[@]}" "${CB[@]}" serve-args "$ART" --root /srv/cb --json
  cp "$R/serve-args-moved.out" "$R/sa-moved.json"
  python3 - "$R/sa-moved.json" "$R" "$ART" <<'EOF'
import json, shlex, sys
sa, r, art = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
check = ("python3 -m cachebake.cli verify --check-only --json --cache /srv/cb --artifact "
         + shlex.quote(art) + " -- " + shlex.join(sa["argv"]))
env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(sa["env"].items()))
open(f"{r}/check-with-env.sh", "w").write(f"exec env {env} {check}\n")
EOF
  chmod a+r "$R"/*.sh
  timed check-with-env "${AS_NOBODY[@]}" sh "$R/check-with-env.sh"
  serve_once moved 8011 "$G/w-moved" "$R/sa-moved.json" --uid $NOBODY --home "$OTHER_HOME" --traffic
  ;;
interleave)
  [ -f "$R/sa-moved.json" ] || { echo "run the serve stage first" >&2; exit 2; }
  HOME=/root "${CB[@]}" serve-args "$ART" --root /var/cache/cachebake --json >"$R/sa-warm.json" 2>"$R/sa-warm.err"
  for i in $(seq 1 "$N"); do
    k=$(date +%s)
    serve_once "baked-$k" 8021 "$G/w-baked" "$R/sa-moved.json" --uid $NOBODY --home "$OTHER_HOME"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['kind']='baked'; print(json.dumps(d))" \
      "$R/serve-baked-$k.json" >>"$R/interleave.jsonl"
    serve_once "warm-$k" 8022 "$G/w-warm" "$R/sa-warm.json" --home /root
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['kind']='warm'; print(json.dumps(d))" \
      "$R/serve-warm-$k.json" >>"$R/interleave.jsonl"
  done
  ;;
table) ;;
*) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
