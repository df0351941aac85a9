#!/usr/bin/env bash
# Issue 32 on the GPU host: "merge of an sm_90 bake and an sm_120 replay installs the right one".
#
#   bash bench/gpu_merge_pick.sh [MERGED_TAR]        (from the checkout's root; default .carry/merge/merged.tar)
#
# MERGED_TAR: one artifact holding two bakes, made on the CPU machine (docs/fleet.md, "The H200's
# merge"): the vLLM 0.34 sm_90 bake of nemotron-h (H200) and its sm_120 replay, `cachebake merge`d.
# Here: `cachebake install MERGED --to /tmp/m --json` with NO --target (install picks the bake of
# the GPU nvidia-smi reports), then `cachebake verify --cache /tmp/m --check-only` (vLLM computes
# the bake's torch.compile hashes for its model and flags: no round, no compile).  vLLM 0.34 is
# taken from VSITE (default /tmp/v34site, .vllm34/PLAN.md) when it is there: the bake's Triton
# 3.8 / torch 2.14 / Python 3.12 are what install's environment check compares with.  Without it,
# the check names the differences (exit 4) and the pick is shown with --allow-mismatch, said so.
# Needs: .whl (zstandard), .carry/merge/merged.tar.  Results: $OUT/merge-pick.tgz (the JSON
# reports, logs, summary.txt), the summary printed last.  ~1 minute.
set -uo pipefail
SRC=$(pwd)
TAR=${1:-$SRC/.carry/merge/merged.tar}
VSITE=${VSITE:-/tmp/v34site}
SITE=${SITE:-/tmp/site}  # cachebake's dependencies, from .whl
OUT=${OUT:-/tmp/merge-pick-out}
W=/tmp/merge-pick
R=$W/results
PY=$(command -v python3)
rm -rf "$W" /tmp/m
mkdir -p "$W/art" "$R" "$OUT"
[ -d "$SITE/zstandard" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$SRC"/.whl/*.whl
PP="$SRC:$SITE"
[ -d "$VSITE/vllm" ] && PP="$PP:$VSITE"
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_USE_DEEP_GEMM=0 VLLM_NO_USAGE_STATS=1  # .vllm34/PLAN.md's env
CB() { (cd /tmp && PYTHONPATH="$PP" "$PY" -m cachebake.cli "$@"); }
say() { echo "$*" | tee -a "$R/summary.txt"; }
finish() {
  tar -C "$W" -czf "$OUT/merge-pick.tgz" results
  echo "---- summary ($OUT/merge-pick.tgz)"; cat "$R/summary.txt"
}
trap finish EXIT

tar -C "$W/art" -xf "$TAR" || { say "cannot extract $TAR"; exit 1; }
ART=$(find "$W/art" -maxdepth 2 -name index.json -printf '%h\n' | head -1)
{ nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader
  PYTHONPATH="$PP" "$PY" -c 'import sys, triton; print("python", sys.version.split()[0], "triton", triton.__version__)'
  [ -d "$VSITE/vllm" ] && echo "VSITE $VSITE" || echo "no VSITE ($VSITE): the image's own packages"
} >"$R/env.txt" 2>&1
say "gpu/env: $(tr '\n' ';' <"$R/env.txt")"
CB inspect "$ART" --json >"$R/inspect.json" 2>"$R/inspect.err"
say "artifact $ART: bakes $("$PY" -c 'import json,sys; print(sorted(json.load(open(sys.argv[1]+"/cachebake.json"))["bakes"]))' "$ART" 2>&1 | tail -1)"

# PICK_TARGET: only for a try on a machine without a GPU (the pick is then --target's, said so)
PICK=(); [ -n "${PICK_TARGET:-}" ] && PICK=(--target "$PICK_TARGET")
CB install "$ART" --to /tmp/m --json "${PICK[@]}" >"$R/install.json" 2>"$R/install.err"
rc=$?
say "install (${PICK[*]:-no --target}): exit $rc"
if [ $rc -eq 4 ]; then  # another environment: show the differences, then the pick anyway
  say "  environment differs: $(head -3 "$R/install.err" | tr '\n' ' ')"
  rm -rf /tmp/m
  CB install "$ART" --to /tmp/m --json --allow-mismatch "${PICK[@]}" >"$R/install.json" 2>"$R/install-mismatch.err"
  rc=$?
  say "install --allow-mismatch (${PICK[*]:-no --target}): exit $rc"
fi
[ $rc -eq 0 ] || { say "  $(tail -3 "$R/install.err" "$R/install-mismatch.err" 2>/dev/null | tr '\n' ' ')"; exit 1; }
say "installed target: $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["target"], d["layer_digest"])' "$R/install.json")"
say "sm_90 bake of the artifact: $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]+"/cachebake.json")); print(d["bakes"]["cuda:90"]["layer"]["digest"])' "$ART")"
kernels=$("$PY" - /tmp/m/triton <<'EOF'
import collections, json, pathlib, sys
archs = collections.Counter()
for p in pathlib.Path(sys.argv[1]).glob("*/*.json"):
    try:
        d = json.loads(p.read_text())
    except ValueError:
        continue
    if not p.name.startswith("__grp__") and isinstance(d, dict) and isinstance(d.get("target"), dict):
        archs[d["target"].get("arch")] += 1
print(dict(archs), "cubins", len(list(pathlib.Path(sys.argv[1]).glob("*/*.cubin"))))
EOF
)
say "installed kernels by arch: $kernels"

# The server's environment, as install reports it (only these names, plain absolute paths or
# digits: the report is read as data); CUDA_HOME is the image's (the bake recorded it).
mapfile -t SERVE_ENV < <("$PY" - "$R/install.json" <<'EOF'
import json, re, sys
env = json.load(open(sys.argv[1])).get("env", {})
for k in ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "TRITON_CACHE_AUTOTUNING", "VLLM_ENABLE_STARTUP_PLAN"):
    v = env.get(k)
    if isinstance(v, str) and re.fullmatch(r"/[A-Za-z0-9_./-]*|[0-9]+", v) and ".." not in v:
        print(f"{k}={v}")
EOF
)
say "server env: ${SERVE_ENV[*]} CUDA_HOME=${CUDA_HOME:-unset}"
(cd /tmp && env "${SERVE_ENV[@]}" PYTHONPATH="$PP" "$PY" -m cachebake.cli verify --cache /tmp/m --check-only --json) \
  >"$R/verify.json" 2>"$R/verify.err"
rc=$?
say "verify --check-only: exit $rc $([ $rc -eq 0 ] && echo passed || tail -2 "$R/verify.err" | tr '\n' ' ')"
