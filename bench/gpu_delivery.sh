#!/usr/bin/env bash
# Issue 30 on the GPU host: the three ways a serving container gets its bake, each exactly as
# cachebake writes it, carried to the real `vllm serve` by bench/pod_runner.py (no container
# engine there: the runner is the kubelet/builder stand-in; images map to the host root, where
# vLLM is installed), then driven by `vllm bench serve` (~150 requests, bench/vllm_serve_run.py's
# client), with Triton compiles counted (cachebake's monitor through its vLLM plugin; the
# layered manager's miss log) and whether torch.compile loaded the bake ("Directly load AOT
# compilation", vLLM 0.24 decorators.py:312, 0.34 decorators.py:326-330).
#
#   VSITE=/tmp/v34site bash bench/gpu_delivery.sh STAGE ART        (from the checkout's root)
#
# ART: a `cachebake build --driver vllm --model nemotron-h` artifact for this vLLM (packed for
# /var/cache/cachebake, the default root).  VSITE: where vLLM is (/tmp/v34site for 0.34,
# /tmp/vsite for 0.24).  TOK: the tokenizer dir (default .carry/tok).  Results: $OUT/gd-STAGE.tgz
# and a summary table last.  Each STAGE < 4 minutes; `setup` runs first inside every stage
# (idempotent, seconds), so a stage works on a fresh machine once vLLM and /tmp/site exist.
#   init          the init-container Pod (`cachebake k8s --artifact ART --installer-image ...`)
#   image-volume  the image-volume Pod (`--pattern image-volume --serving-image-has-cachebake`)
#   dockerfile    the Dockerfile's serve stage (its RUN steps; the cache stage = ART installed,
#                 as the Dockerfile advises without a GPU build), then `docker run IMAGE MODEL
#                 FLAGS` with vLLM's image entrypoint (`vllm serve`)
#   miss          the image-volume Pod with `--mamba-ssm-cache-dtype bfloat16` appended (a flag
#                 the bake lacks): misses must go to the overlay, nothing may crash
#   pods          init then image-volume (one call, ~7 min)
#   fold          issue 32: the miss Pod's overlay log (Triton and vllm-role lines) folded into ART
#                 by `cachebake replay --base ART --misses LOG` (--dry-run first; one vLLM round on
#                 this GPU), then `cachebake diff ART FOLDED`; the folded bake at /srv/gd/folded
#   again         the image-volume Pod of the folded bake (ART = /srv/gd/folded) with the same flag:
#                 expect 0 Triton compiles, AOT loaded, no overlay misses
# The Pods run as written; the runner appends only what this machine needs and logs it:
# `--load-format dummy --tokenizer MODEL` to the server (no weights here), and the monitor's
# log (CACHEBAKE_MONITOR_LOG + a bind for it).
set -uo pipefail
STAGE=${1:?usage: bash bench/gpu_delivery.sh setup|init|image-volume|dockerfile|miss|pods|fold|again ART}
ART_IN=${2:?the bake artifact (a --driver vllm bake for this vLLM)}
SRC=$(pwd)
VSITE=${VSITE:-/tmp/v34site}
TOK=${TOK:-$SRC/.carry/tok}
SITE=${SITE:-/tmp/site}  # cachebake's dependencies, from .whl
G=/srv/gd  # not under /tmp: the init Pod's installer has an emptyDir at /tmp (it would hide ART)
R=$G/results; OUT=${OUT:-$G/out}
PORT=8000
PY=$(command -v python3)
ROOT=/var/cache/cachebake
mkdir -p "$R" "$OUT"
# .vllm34/PLAN.md's environment, which the "image" has (--image-env below): the cache stage's
# install checks the bake's hashed VLLM_* variables against this process's
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_USE_DEEP_GEMM=0 VLLM_NO_USAGE_STATS=1
log() { echo "== [$STAGE] $*" | tee -a "$R/steps.log"; }
REQUESTS=${REQUESTS:-150}  # 150: three `vllm bench serve` phases; anything else: the first (64 requests)
RECIPE=${RECIPE:-nemotron-h}  # the bake's recipe: its config.json is the model dir's
CB() { PYTHONPATH="$G/img/cb:$SITE:$VSITE" "$PY" -m cachebake.cli "$@"; }

# The "image": vLLM and cachebake installed into this Python as an image has them in
# site-packages (a .pth that puts VSITE, the deps and cachebake right after PYTHONPATH's own
# entries: a Pod's PYTHONPATH keeps its place), `vllm` and `cachebake` on PATH.  Removed at exit.
PTH=$("$PY" -c 'import site; print(site.getsitepackages()[0])')/zz-cachebake-gpu-delivery.pth
image_on() {
  "$PY" - "$PTH" "$VSITE" "$SITE" "$G/img/cb" <<'EOF'
import json, sys
pth, *paths = sys.argv[1:]
line = ("import os, sys; p = %s; i = next((n for n, e in enumerate(sys.path) if e.startswith(sys.base_prefix + os.sep)), "
        "len(sys.path)); sys.path[i:i] = [e for e in p if e not in sys.path]\n") % json.dumps(paths)
open(pth, "w").write(line)
EOF
}
image_off() { rm -f "$PTH"; }
finish() {
  image_off
  table | tee "$R/table.md"
  tar -C "$G" -czf "$OUT/gd-$STAGE.tgz" results
}
trap finish EXIT

setup() {
  mkdir -p "$G/img/bin" "$G/img/cb" "$G/ctx/docker"
  rm -rf "$G/img/cb/cachebake" && cp -r "$SRC/cachebake" "$G/img/cb/"
  # its dist-info: the vLLM plugin entry point (cachebake_monitor) is found through it
  mkdir -p "$G/img/cb/cachebake-0.0.0+gd.dist-info"
  printf 'Metadata-Version: 2.1\nName: cachebake\nVersion: 0.0.0+gd\n' >"$G/img/cb/cachebake-0.0.0+gd.dist-info/METADATA"
  printf '[console_scripts]\ncachebake = cachebake.cli:main\n\n[vllm.general_plugins]\ncachebake_monitor = cachebake.serve.vllm_plugin:register\n' \
    >"$G/img/cb/cachebake-0.0.0+gd.dist-info/entry_points.txt"
  [ -d "$SITE/zstandard" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$SRC"/.whl/*.whl
  # console scripts as pip writes them: the __main__ guard matters, vLLM's engine core is a
  # spawned process that re-imports the main module (without it: "An attempt has been made to
  # start a new process before the current process has finished its bootstrapping phase", the
  # 2026-12-03 H200 run of all four deliveries)
  printf '#!%s\nimport sys\nfrom vllm.entrypoints.cli.main import main\nif __name__ == "__main__":\n    sys.exit(main())\n' "$PY" >"$G/img/bin/vllm"
  printf '#!%s\nimport sys\nfrom cachebake.cli import main\nif __name__ == "__main__":\n    sys.exit(main())\n' "$PY" >"$G/img/bin/cachebake"
  cp "$SRC/docker/cachebake-init.sh" "$G/img/cachebake-init.sh"
  cp "$SRC/docker/install-cachebake.sh" "$G/ctx/docker/"
  chmod 755 "$G/img/bin/"*
  if [ ! -f "$G/art/index.json" ] || ! cmp -s "$ART_IN/index.json" "$G/art/index.json"; then
    rm -rf "$G/art" "$G/cache-tree" && cp -a "$ART_IN" "$G/art"
  fi
  CB serve-args "$G/art" --target sm_90 --json >"$R/serve-args.json" || { log "serve-args failed"; return 1; }
  MODEL=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["argv"][2])' "$R/serve-args.json")
  # the model (config.json as the bake wrote it, the tokenizer beside it; no weights: dummy load)
  PYTHONPATH="$G/img/cb:$SITE" "$PY" -c "from cachebake.recipes import load_recipe; from cachebake.vllm.engine import write_model_dir; write_model_dir(load_recipe('$RECIPE'), '$MODEL')"
  for f in "$TOK"/*; do [ "$(basename "$f")" = config.json ] || cp "$f" "$MODEL/"; done
  DIGEST=$("$PY" -c "import sys; sys.path[:0] = ['$G/img/cb', '$SITE']
from cachebake.artifact.oci import open_artifact; print(open_artifact('$G/art').select('sm_90').manifest_digest)")
  REF="registry.invalid/bakes/nemotron@$DIGEST"
  CB k8s --kind pod --name vllm --artifact "$G/art" --bake "$G/art" --target sm_90 \
    --serving-image vllm/vllm-openai:host --installer-image cachebake-installer:host --model-pvc model >"$R/init.yaml"
  CB k8s --kind pod --name vllm --pattern image-volume --artifact "docker://$REF" --bake "$G/art" --target sm_90 \
    --serving-image vllm/vllm-openai:host --serving-image-has-cachebake --model-pvc model >"$R/image-volume.yaml"
  if [ ! -d "$G/cache-tree$ROOT/.cachebake" ]; then  # the Dockerfile's cache stage: ART installed at ROOT
    rm -rf "$G/cache-tree" && CB install "$G/art" --to "$G/cache-tree$ROOT" --serve-at "$ROOT" --target sm_90 --no-sync >"$R/cache-stage.out" 2>&1 \
      || { log "the cache stage's install failed: $(tail -n 3 "$R/cache-stage.out")"; rm -rf "$G/cache-tree"; return 1; }
  fi
  chmod -R a+rX "$G" "$SITE"
  # The image's ENV is this machine's environment (the lent machine's own image: CUDA_HOME,
  # LD_LIBRARY_PATH, NVIDIA_*, ... and the exports above), less what a container gets from its
  # runtime or its spec (HOME, HOSTNAME, PWD, ...); PATH gains the "image"'s vllm and cachebake.
  IMAGE_ENV=(--image-env "PATH=$G/img/bin:$PATH")
  while IFS= read -r -d '' kv; do
    case ${kv%%=*} in
      PATH|HOME|PWD|OLDPWD|SHLVL|_|USER|LOGNAME|HOSTNAME|TERM|MAIL|SHELL|PYTHONPATH|OUT|BASH_FUNC_*) ;;
      *) IMAGE_ENV+=(--image-env "$kv") ;;
    esac
  done < <(env -0)
  { nvidia-smi -L; PYTHONPATH="$VSITE" "$PY" -c 'import torch, triton, vllm; print("vllm", vllm.__version__, "torch", torch.__version__, "triton", triton.__version__)'; } >"$R/env.log" 2>&1
  log "setup: model $MODEL, image volume $REF"
}

# drive MODE RUNNER_PID WORK LOGNAME REQUESTS: wait for /health, `vllm bench serve`, stop the runner
drive() {
  PYTHONPATH="$VSITE:$SRC/bench" "$PY" - "$@" "$PORT" "$MODEL" "$R" <<'EOF'
import json, os, signal, sys, time, urllib.request
from pathlib import Path
import vllm_serve_run as v
mode, pid, work, logname, requests, port, model, results = sys.argv[1:]
pid, work, t0 = int(pid), Path(work), time.monotonic()
def alive():  # the runner is the shell's child: a zombie once it exits, until the shell waits
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
ready = None
while time.monotonic() - t0 < float(os.environ.get("HEALTH_S", "220")) and alive():
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            if r.status == 200:
                ready = round(time.monotonic() - t0, 1); break
    except OSError:
        pass
    time.sleep(1)
row = {"mode": mode, "ready_s": ready}
scen = [("random", ["--dataset-name", "random", "--random-input-len", "512", "--random-output-len", "32",
                    "--random-range-ratio", "0.9", "--num-prompts", "64", "--max-concurrency", "16"]),
        ("top-p", ["--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "32",
                   "--num-prompts", "48", "--max-concurrency", "24", "--temperature", "0.8", "--top-p", "0.9"]),
        ("prefix", ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "512",
                    "--prefix-repetition-suffix-len", "64", "--prefix-repetition-num-prefixes", "4",
                    "--prefix-repetition-output-len", "32", "--num-prompts", "38", "--max-concurrency", "16"])]
v.SCENARIOS = scen if requests == "150" else scen[:1]
events = work / "events" / "events.jsonl"
start = v.compiles(events)
if ready is not None:
    row["traffic"] = v.run_traffic(f"http://127.0.0.1:{port}", model, model, work)
row["startup_compiles"], row["traffic_compiles"] = len(start), len(v.compiles(events)) - len(start)
row["requests_ok"] = sum(t.get("completed") or 0 for t in row.get("traffic", []))
row["requests_failed"] = sum(t.get("failed") or 0 for t in row.get("traffic", [])) + sum("error" in t for t in row.get("traffic", []))
row["alive_before_stop"] = alive()
if row["alive_before_stop"]:
    os.kill(pid, signal.SIGTERM)
    for _ in range(120):
        if not alive(): break
        time.sleep(0.5)
server_log = next(iter(sorted(work.rglob(f"logs/{logname}.log"))), None)
text = server_log.read_text(errors="replace") if server_log else ""
row.update(v.log_facts(text))
row["erofs"] = "Read-only file system" in text
misses = next(iter(sorted(work.rglob("cachebake-overlay/cachebake/misses.jsonl"))), None)
row["overlay_misses"] = sum(1 for _ in open(misses)) if misses else None
json.dump(row, open(work / "row.json", "w"), indent=1)
EOF
}

# record MODE WORK RUNNER_RC: the row with the runner's exit code, into the summary
record() {
  "$PY" - "$@" "$R" <<'EOF'
import json, sys
mode, work, rc, results = sys.argv[1:]
try:
    row = json.load(open(f"{work}/row.json"))
except OSError:
    row = {"mode": mode}
row["runner_rc"] = int(rc)
json.dump(row, open(f"{results}/{mode}.json", "w"), indent=1)
with open(f"{results}/summary.jsonl", "a") as f:
    f.write(json.dumps({k: v for k, v in row.items() if k != "traffic"}) + "\n")
print(json.dumps({k: v for k, v in row.items() if k not in ("traffic", "cache_dirs")}))
EOF
}

pod() {  # pod MODE MANIFEST REQUESTS [runner args...]
  local mode=$1 manifest=$2 requests=$3; shift 3
  local W=$G/run-$mode
  rm -rf "$W" && mkdir -p "$W/events" && touch "$W/events/events.jsonl" && chmod -R 777 "$W/events"
  log "$mode: pod_runner on $manifest"
  "$PY" "$SRC/bench/pod_runner.py" pod "$manifest" --work "$W/pod" --pvc "model=$MODEL" \
    --image-volume "$REF=$G/art" \
    --image-entrypoint "cachebake-installer:host=[\"/bin/sh\", \"$G/img/cachebake-init.sh\"]" "${IMAGE_ENV[@]}" \
    --add-env vllm:CACHEBAKE_MONITOR_LOG=/cachebake-events/events.jsonl --add-bind "vllm:$W/events:/cachebake-events" \
    --add-arg vllm:--load-format --add-arg vllm:dummy --add-arg vllm:--tokenizer --add-arg "vllm:$MODEL" \
    --add-arg vllm:--port --add-arg "vllm:$PORT" "$@" >"$W/runner.out" 2>&1 &
  local rpid=$!
  drive "$mode" $rpid "$W" vllm "$requests"
  wait $rpid; record "$mode" "$W" $?
  mkdir -p "$R/$mode" && cp -r "$W/pod/runner.log" "$W/pod/logs" "$W/events" "$W/runner.out" "$R/$mode/" 2>/dev/null
}

dockerfile() {
  local W=$G/run-dockerfile
  rm -rf "$W" && mkdir -p "$W/events" && touch "$W/events/events.jsonl" && chmod -R 777 "$W/events"
  local flags env_args=()
  flags=$("$PY" -c 'import json,sys,shlex; print(shlex.join(json.load(open(sys.argv[1]))["argv"][3:]))' "$R/serve-args.json")
  # the Dockerfile: "Cache-invalidating variables set at bake time must be set here too": the
  # bake's own (serve-args' env beside the cache roles), as the image's ENV
  while IFS= read -r kv; do env_args+=(--image-env "$kv"); done < <("$PY" -c '
import json, sys
sa = json.load(open(sys.argv[1]))
for k, v in sa["env"].items():
    if k not in ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR"):
        print(f"{k}={v}")' "$R/serve-args.json")
  log "dockerfile: pod_runner dockerfile on $SRC/Dockerfile (serve stage), bake's env: ${env_args[*]}"
  # shellcheck disable=SC2086
  "$PY" "$SRC/bench/pod_runner.py" dockerfile "$SRC/Dockerfile" --work "$W/df" --context "$G/ctx" --target serve \
    --build-arg BASE=vllm/vllm-openai:host --build-arg "CACHEBAKE_PIP=--no-deps --no-index cachebake" \
    --stage-dir "cache=$G/cache-tree" --base-entrypoint '["vllm", "serve"]' "${IMAGE_ENV[@]}" "${env_args[@]}" \
    --add-env run:CACHEBAKE_MONITOR_LOG=/cachebake-events/events.jsonl --add-bind "run:$W/events:/cachebake-events" \
    --run "$MODEL" $flags --load-format dummy --tokenizer "$MODEL" --port "$PORT" >"$W/runner.out" 2>&1 &
  local rpid=$!
  drive dockerfile $rpid "$W" serve-run "$REQUESTS"
  wait $rpid; record dockerfile "$W" $?
  mkdir -p "$R/dockerfile" && cp -r "$W/df/runner.log" "$W/df/logs" "$W/events" "$W/runner.out" "$R/dockerfile/" 2>/dev/null
}

NEW_FLAG=(--add-arg vllm:--mamba-ssm-cache-dtype --add-arg vllm:bfloat16)  # a flag the bake lacks

# fold: the miss Pod's overlay log into ART (issue 32), on this GPU; diff the two
fold() {
  local log
  log=$(find "$G/run-miss/pod/volumes" -path '*cachebake-overlay*' -name misses.jsonl 2>/dev/null | head -n 1)
  [ -n "$log" ] || { log "fold: no miss log under $G/run-miss (run the miss stage first)"; return 1; }
  cp "$log" "$R/misses.jsonl"
  log "fold: $(wc -l <"$log") miss lines, $(grep -c '"kind": *"vllm"' "$log") of the vllm role"
  rm -rf "$G/folded" "$G/fold-work" /var/cache/cachebake
  CB replay --base "$G/art" --misses "$R/misses.jsonl" --out "$G/folded" --dry-run >"$R/fold-plan.out" 2>&1
  log "fold --dry-run: rc=$?"; cat "$R/fold-plan.out"
  local t0=$SECONDS
  timeout 520 env PYTHONPATH="$G/img/cb:$SITE:$VSITE" "$PY" -m cachebake.cli replay --base "$G/art" \
    --misses "$R/misses.jsonl" --out "$G/folded" --json >"$R/fold.json" 2>"$R/fold.err"
  log "fold: rc=$? $((SECONDS - t0)) s"; tail -n 5 "$R/fold.err"
  CB diff "$G/art" "$G/folded" >"$R/diff.txt" 2>&1; log "diff: rc=$?"; head -n 40 "$R/diff.txt"
  CB diff "$G/art" "$G/folded" --json >"$R/diff.json" 2>/dev/null
  [ -d "$G/folded" ] && chmod -R a+rX "$G/folded" && tar -C "$G" -cf "$R/folded.tar" folded
}

table() {
  [ -f "$R/summary.jsonl" ] || return 0
  "$PY" - "$R/summary.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cols = ["mode", "runner_rc", "ready_s", "aot_loaded", "graphs_compiled", "startup_compiles", "traffic_compiles",
        "overlay_misses", "requests_ok", "requests_failed", "erofs", "engine_init_s", "torch_compile_s"]
print("| " + " | ".join(cols) + " |")
print("|" + "---|" * len(cols))
for r in rows:
    print("| " + " | ".join(str(r.get(c)) for c in cols) + " |")
EOF
}

setup || exit 1
# The Pods mount an emptyDir at /tmp (HOME and scratch of a read-only root), which hides what the
# "image" keeps under /tmp: vLLM (/tmp/v34site) and cachebake's deps (/tmp/site) move beside it
# (hard links: seconds).  The 2026-12-03 run failed on exactly this: no vllm, no zstandard.
for v in VSITE SITE; do
  p=${!v}
  case $p in /tmp/*)
    d=$G/img/$(basename "$p")
    [ -d "$d" ] || cp -al "$p" "$d" 2>/dev/null || cp -a "$p" "$d" || exit 1
    printf -v "$v" %s "$d" ;;
  esac
done
image_on
case $STAGE in
setup) ;;
init) pod init "$R/init.yaml" "$REQUESTS" ;;
image-volume) pod image-volume "$R/image-volume.yaml" "$REQUESTS" ;;
pods) pod init "$R/init.yaml" "$REQUESTS"; pod image-volume "$R/image-volume.yaml" "$REQUESTS" ;;
dockerfile) dockerfile ;;
miss) pod miss "$R/image-volume.yaml" 32 "${NEW_FLAG[@]}" ;;
again) pod again "$R/image-volume.yaml" "$REQUESTS" "${NEW_FLAG[@]}" ;;
fold) fold ;;
*) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
