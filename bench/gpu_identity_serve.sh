#!/usr/bin/env bash
# Issue 21 on the H200, in device calls of < 10 minutes (state in /tmp/gis between calls):
# README's first command bakes Nemotron-H 8B; the artifact is installed at another path by
# another uid; `vllm serve` from `cachebake serve-args` runs as that uid with another HOME,
# driven by `vllm bench serve`, beside vLLM's own warm restart (the bake root, the bake's HOME).
#
#   bash bench/gpu_identity_serve.sh STAGE      (from the checkout's root; results -> $OUT)
#
# STAGE, in order:
#   setup   copy the checkout, cachebake.egg-info (its vllm plugin entry point), the tokenizer
#           (.carry/tok) and zstandard (.whl) where uid 65534 can read them; versions
#   bake    cd /tmp/gis && cachebake build --model nemotron-h --keep-root (README's first command,
#           keeping the bake root for the warm restart; the 2026-12-01 run predates --keep-root and
#           its default of emptying the root, so it ran without the flag; the
#           default root /var/cache/cachebake and model dir /models/nemotron-h-8b)   (~6 min)
#   serve   install at /srv/cb as uid 65534, `verify --check-only` there (with serve-args'
#           env: expect 0; without it: expect 4), then `vllm serve` as uid 65534 with HOME
#           /tmp/gis/home-other and the traffic; then vLLM's own warm restart: root, HOME=/root,
#           the bake root as it is                                                     (~7 min)
#   verify  `cachebake verify --driver vllm` against /srv/cb as uid 65534 (the AOT check)
#   recheck after `setup` on a fresh machine: the bake from tests/data installed at /srv/cb as
#           uid 65534, then the before-start check, with serve-args' env and without; with
#           RECHECK_SERVE=1 also `vllm serve` as uid 65534 with the traffic (no warm restart:
#           that needs this machine's own bake root)
# Needs vLLM 0.24 in /tmp/vsite (../shared/vllm-on-h200: three device calls before `setup`).
set -uo pipefail
STAGE=${1:?usage: bash bench/gpu_identity_serve.sh setup|bake|serve|verify|recheck}
SRC=$(pwd)
G=/tmp/gis; R=$G/results; OUT=${OUT:-$G/out}
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1
export PYTHONPATH="$G/src:$G/site:/tmp/vsite"
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
finish() { tar -C "$G" -czf "$OUT/results-$STAGE.tgz" results; }
trap finish EXIT

case $STAGE in
setup)
  rm -rf "$G/src" && mkdir -p "$G/src" "$OTHER_HOME" && chmod 755 "$G"
  cp -r "$SRC/cachebake" "$SRC/bench" "$SRC/cachebake.egg-info" "$G/src/"
  cp -r "$SRC/.carry/tok" "$G/tok"
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$G/site" "$SRC"/.whl/*.whl
  chown -R $NOBODY:$NOBODY "$OTHER_HOME"; chmod -R a+rX "$G"
  { nvidia-smi -L; python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
    python3 -c 'import vllm, zstandard, cachebake; print("vllm", vllm.__version__, cachebake.__file__)'
    ls -ld /root; "${AS_NOBODY[@]}" python3 -c 'import vllm.envs, cachebake.cli; print("nobody imports ok")'; } 2>&1 | tee "$R/env.log"
  ;;
bake)
  rm -rf /var/cache/cachebake "$ART" "$G/bw"
  # --keep-root: the warm restart below serves from the bake root itself
  cd "$G" && timed build "${CB[@]}" build --model nemotron-h --keep-root --work-dir "$G/bw" --json
  "${CB[@]}" inspect "$ART" --json >"$R/inspect.json" 2>&1
  python3 - "$ART" >"$R/identity.json" <<'EOF'
import json, sys
bake = json.load(open(sys.argv[1] + "/cachebake.json"))["bakes"]["cuda:90"]["bake"]
ci = bake.get("compile_identity") or {}
print(json.dumps({"path_factors": ci.get("path_factors"), "set_factors": ci.get("set_factors"),
                  "engine": ci.get("engine"), "backend_dirs": ci.get("backend_dirs"),
                  "torch_compile": bake.get("torch_compile"), "rounds": bake.get("rounds"),
                  "per_round": [{k: r.get(k) for k in ("round", "compiles", "autotunes", "seconds")}
                                for r in bake.get("per_round", [])]}, indent=1, default=str))
EOF
  cat "$R/identity.json" | head -60
  cp -r "$G/bw"/*.jsonl "$R/" 2>/dev/null
  tar -C "$G" -cf "$OUT/artifact.tar" "$(basename "$ART")"
  chmod -R a+rX "$ART"
  ;;
recheck)
  rm -rf "$ART" && tar -C "$G" -xf "$SRC/tests/data/nemotron-h-8b-vllm-0.24-sm_90-2026-12-01.artifact.tar"
  chmod -R a+rX "$ART"
  # the model dir the bake wrote (its config.json is compared), as the bake writes it
  python3 -c "from cachebake.recipes import load_recipe; from cachebake.vllm.engine import write_model_dir; write_model_dir(load_recipe('nemotron-h'), '/models/nemotron-h-8b')"
  ;&
serve)
  rm -rf /srv/cb && mkdir -p /srv/cb && chown $NOBODY:$NOBODY /srv/cb
  timed install-moved "${AS_NOBODY[@]}" "${CB[@]}" install "$ART" --to /srv/cb --target sm_90 --json
  timed serve-args-moved "${AS_NOBODY[@]}" "${CB[@]}" serve-args "$ART" --root /srv/cb --json
  cp "$R/serve-args-moved.out" "$R/sa-moved.json"
  # the before-start check, in the server's environment (serve-args' env) and without it
  python3 - "$R/sa-moved.json" "$R" <<'EOF'
import json, shlex, sys
sa, r = json.load(open(sys.argv[1])), sys.argv[2]
check = ("python3 -m cachebake.cli verify --check-only --cache /srv/cb --artifact "
         "/tmp/gis/cachebake-nemotron-h -- " + shlex.join(sa["argv"]))
env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(sa["env"].items()))
open(f"{r}/check-with-env.sh", "w").write(f"exec env {env} {check}\n")
open(f"{r}/check-without-env.sh", "w").write(f"exec {check}\n")
open(f"{r}/serve-env.sh", "w").write(f"SERVE_ENV={shlex.quote(env)}\n")
EOF
  chmod a+r "$R"/*.sh
  timed check-with-env "${AS_NOBODY[@]}" sh "$R/check-with-env.sh"
  timed check-without-env "${AS_NOBODY[@]}" sh "$R/check-without-env.sh"
  [ "$STAGE" = recheck ] && [ "${RECHECK_SERVE:-0}" != 1 ] && exit 0
  timed serve-moved python3 "$G/src/bench/vllm_serve_run.py" --serve-args "$R/sa-moved.json" --tok "$G/tok" \
    --port 8011 --work "$G/w-moved" --uid $NOBODY --home "$OTHER_HOME" --traffic --out "$R/serve-moved.json"
  cp "$G/w-moved/server.log" "$R/server-moved.log" 2>/dev/null
  [ "$STAGE" = recheck ] && exit 0
  # vLLM's own warm restart: the bake's root, user and HOME, its caches as the bake left them
  timed serve-args-warm env HOME=/root "${CB[@]}" serve-args "$ART" --root /var/cache/cachebake --json
  cp "$R/serve-args-warm.out" "$R/sa-warm.json"
  timed serve-warm env HOME=/root python3 "$G/src/bench/vllm_serve_run.py" --serve-args "$R/sa-warm.json" \
    --tok "$G/tok" --port 8012 --work "$G/w-warm" --home /root --out "$R/serve-warm.json"
  cp "$G/w-warm/server.log" "$R/server-warm.log" 2>/dev/null
  ;;
verify)
  . "$R/serve-env.sh"
  mkdir -p "$G/vw" && chown $NOBODY:$NOBODY "$G/vw"
  timed verify-moved "${AS_NOBODY[@]}" sh -c "exec env $SERVE_ENV python3 -m cachebake.cli verify --cache /srv/cb --driver vllm --model nemotron-h --work-dir $G/vw --json"
  ;;
*) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
