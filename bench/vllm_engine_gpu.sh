#!/usr/bin/env bash
# The real vLLM engine on the GPU, in stages of < 10 minutes each, in ONE device session:
# bake Nemotron-H 8B with `cachebake build --driver vllm` at the default root, install the
# artifact at another path, at the serving path (the layer root) and with --serve-at, start the
# engine from each with `cachebake serve-args`, send the bake's request plan plus traffic it
# did not send, and count compiles with cachebake's monitor and with vLLM's JIT monitor.
#
#   bash bench/vllm_engine_gpu.sh STAGE        (run from the checkout's root; results -> $OUT)
#
# STAGE, in order (state stays in /tmp/vbench on the device between calls):
#   env      versions; installs .whl/*.whl (zstandard) into /tmp/vbench/site
#   bake     cachebake build --model nemotron-h --driver vllm --out /tmp/vbench/art (root
#            /var/cache/cachebake), then moves the bake root away             (~5-8 min)
#   cold     the engine from empty caches (start-up cold, every compile)      (~4-6 min)
#   moved    install at /srv/cachebake-moved-elsewhere (bake root absent), serve from it
#   root     install at /var/cache/cachebake (the serving path / layer root), serve from it
#   serveat  install --to /tmp/vbench/initview --serve-at /srv/cb-mounted, move it there
#            (the volume mounted elsewhere), serve from it
#   verify   cachebake verify --driver vllm against the moved install
#   table    bench/vllm_engine_table.py: table.md + table.json from everything above
# Every stage copies its results (and the table so far) to $OUT and prints a short table last.
# Needs vLLM 0.24 in /tmp/vsite (../shared/vllm-on-h200: three device calls before this).
set -uo pipefail
STAGE=${1:?usage: bash bench/vllm_engine_gpu.sh env|bake|cold|moved|root|serveat|verify|table}
SRC=$(pwd)
OUT=${OUT:-/tmp/vbench/out}
V=/tmp/vbench; R=$V/results; ART=$V/art
ROOT=/var/cache/cachebake; MOVED=/srv/cachebake-moved-elsewhere; MOUNT=/srv/cb-mounted
mkdir -p "$R" "$OUT"
SITE=""
[ -d $V/site ] && SITE=$V/site
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1
export PYTHONPATH="$SRC${SITE:+:$SITE}:/tmp/vsite"
AUTOLOAD="$SRC/cachebake/capture/autoload"
CB=(python3 -m cachebake.cli)
cd /tmp  # not the checkout: cachebake comes from PYTHONPATH only

log() { echo "== [$STAGE] $*" | tee -a "$R/steps.log"; }
timed() {  # name cmd...: run with a wall limit, record rc and seconds
  local name=$1; shift; local t0; t0=$(date +%s.%N)
  timeout 570 "$@" >"$R/$name.out" 2>"$R/$name.err"; local rc=$?
  local dt; dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  echo "{\"stage\": \"$STAGE\", \"name\": \"$name\", \"rc\": $rc, \"wall_s\": $dt}" >>"$R/stages.jsonl"
  log "$name: rc=$rc ${dt}s"; tail -n 4 "$R/$name.err"
  return $rc
}
serve() {  # name root: serve-args for ROOT, then the probe with both monitors on
  local name=$1 root=$2
  "${CB[@]}" serve-args "$ART" --root "$root" --json >"$R/serve-args-$name.json" || return 1
  : >"$R/events-$name.jsonl"
  timed "probe-$name" env CACHEBAKE_MONITOR_LOG="$R/events-$name.jsonl" \
    PYTHONPATH="$AUTOLOAD:$PYTHONPATH" python3 "$SRC/bench/vllm_serve_probe.py" \
    "$R/serve-args-$name.json" "$R/probe-$name.json"
}
finish() {
  python3 "$SRC/bench/vllm_engine_table.py" "$R" --artifact "$ART" --out "$R" >/dev/null 2>"$R/table.err"
  cp -r "$R"/. "$OUT"/ 2>/dev/null
  [ -f "$R/table.md" ] && tail -n 25 "$R/table.md"
}

case $STAGE in
env)
  if ls "$SRC"/.whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target $V/site "$SRC"/.whl/*.whl
  fi
  { nvidia-smi -L; python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'
    PYTHONPATH="$PYTHONPATH:$V/site" python3 -c 'import vllm, zstandard, cachebake; print("vllm", vllm.__version__)'; } 2>&1 | tee "$R/env.log"
  ;;
bake)
  rm -rf "$ROOT" "$ROOT.baked" "$ART" "$V/build"
  timed build "${CB[@]}" build --model nemotron-h --driver vllm --keep-root --out "$ART" --work-dir "$V/build" --json
  cp "$V"/build/*events*.jsonl "$R/" 2>/dev/null; cp "$R/build.out" "$R/build.json"
  "${CB[@]}" inspect "$ART" --json >"$R/inspect.json" 2>&1
  log "moving the bake root away: nothing may read $ROOT until the 'root' stage installs there"
  mv "$ROOT" "$ROOT.baked"
  ;;
cold)
  rm -rf $V/cold && mkdir -p $V/cold
  serve cold $V/cold
  ;;
moved)
  rm -rf "$MOVED"
  [ ! -e "$ROOT" ] || log "WARNING: $ROOT exists; the moved run should not see it"
  timed install-moved "${CB[@]}" install "$ART" --to "$MOVED" --json
  serve moved "$MOVED"
  ;;
root)
  rm -rf "$ROOT"
  timed install-root "${CB[@]}" install "$ART" --to "$ROOT" --json
  serve root "$ROOT"
  ;;
serveat)
  rm -rf $V/initview "$MOUNT"
  timed install-serveat "${CB[@]}" install "$ART" --to $V/initview --serve-at "$MOUNT" --json
  mv $V/initview "$MOUNT"  # the same volume, mounted where the server sees it
  serve serveat "$MOUNT"
  ;;
verify)
  timed verify "${CB[@]}" verify --cache "$MOVED" --driver vllm --model nemotron-h --json
  ;;
table) ;;
*) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
finish
