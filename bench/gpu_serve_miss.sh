#!/usr/bin/env bash
# The serve-time miss proof on a CUDA GPU, in one device call of about two minutes:
#   1. bake a small workload (bench/serve_workload.py: a plain and an autotuned kernel) with
#      `cachebake build`, for fp32/fp16 at n=4096;
#   2. install it read-only; serve, as uid 65534, a workload the bake lacks (bf16: new kernel
#      specializations and autotune candidates; n=8192: new autotune keys):
#      a. control, Triton's own cache manager: expected to die with PermissionError;
#      b. `install --overlay`'s environment (the layered manager): must complete, log its
#         misses, and leave the installed tree byte-identical;
#   3. `cachebake misses` on the overlay's log; `cachebake replay --base --misses` folds them
#      into a new artifact (no GPU used: compiles and launcher helpers built offline);
#   4. install the new artifact read-only at another path; serve the same workload as uid 65534
#      with Triton's own manager: 0 compiles, 0 autotune benchmarks; `cachebake verify` exit 0.
#
#   bash bench/gpu_serve_miss.sh SRC OUT
# SRC: the checkout (cachebake/ and bench/); OUT: results.jsonl, summary.txt, logs.tgz.
# Wheels the device lacks (zstandard) are installed from SRC/.whl/ if present.
set -uo pipefail
SRC=$(realpath "$1"); OUT=$(realpath "$2")
mkdir -p "$OUT"; LOGS=/tmp/serve-miss-logs; rm -rf "$LOGS"; mkdir -p "$LOGS"
if ls "$SRC"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$SRC"/.whl/*.whl || exit 1
  SITE=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC:$SRC/bench${SITE:+:$SITE}"
cd /tmp
CB=(python3 -m cachebake.cli)
ROOT=/tmp/serve-bakeroot; ART=/tmp/serve-art; ART2=/tmp/serve-art2; SRV=/srv/cb-serve; SRV2=/srv/cb-serve2
OVL=/tmp/serve-overlay; RES="$OUT/results.jsonl"
rm -rf "$ROOT" "$ART" "$ART2" "$SRV" "$SRV2" "$OVL"; : >"$RES"
BAKED="--dtypes fp32,fp16 --sizes 4096"; SERVED="--dtypes fp32,fp16,bf16 --sizes 4096,8192"
AS_NOBODY=(python3 -c 'import os, sys; os.setgroups([]); os.setgid(65534); os.setuid(65534); os.execvp(sys.argv[1], sys.argv[1:])')
step() { echo "== $*" | tee -a "$LOGS/steps.log"; }
record() { echo "{\"label\": \"$1\", \"rc\": $2, \"out\": ${3:-null}}" >>"$RES"; echo "   rc=$2 $3" | tee -a "$LOGS/steps.log"; }
envargs() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f'{k}={v}' for k, v in d['env'].items()))" "$1"; }
tree_sum() { (cd "$1" && find . -printf '%p %m\n' | sort; find . -type f -exec sha256sum {} + | sort) | sha256sum | cut -c1-16; }
serve() {  # label env-args...: the workload as uid 65534 with exactly that environment
  local label=$1; shift
  "${AS_NOBODY[@]}" env -i PATH="$PATH" HOME=/tmp/nobody PYTHONPATH="$PYTHONPATH" "$@" \
    python3 "$SRC/bench/serve_workload.py" $SERVED >"$LOGS/$label.out" 2>"$LOGS/$label.err"
  local rc=$?; record "$label" $rc "$(tail -n 1 "$LOGS/$label.out" | grep '^{' || echo null)"
  tail -n 3 "$LOGS/$label.err"
}

{ nvidia-smi -L; python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'; } 2>&1 | tee "$LOGS/env.log"
for d in "$SRC" ${SITE:+"$SITE"}; do chmod -R o+rX "$d"; p=$d; while [ "$p" != / ]; do chmod o+x "$p"; p=$(dirname "$p"); done; done
mkdir -p /tmp/nobody "$OVL" && chown 65534:65534 /tmp/nobody "$OVL"

step "1. bake: cachebake build -- serve_workload.py $BAKED"
"${CB[@]}" build --root "$ROOT" --out "$ART" --work-dir "$LOGS/build" --json -- python3 "$SRC/bench/serve_workload.py" $BAKED >"$LOGS/build.json" 2>"$LOGS/build.err"
record build $? "$(python3 -c "import json; b=json.load(open('$LOGS/build.json'))['bake']; print(json.dumps({'rounds': b['rounds'], 'stable': b['stable']}))" 2>/dev/null || echo null)"

step "2. install read-only at $SRV, with --overlay $OVL"
"${CB[@]}" install "$ART" --to "$SRV" --overlay "$OVL" --json >"$LOGS/install.json" 2>"$LOGS/install.err"; record install $?
chmod -R a-w "$(readlink -f "$SRV/triton")/.."
BEFORE=$(tree_sum "$(readlink -f "$SRV/triton")")
PLAIN_ENV=$(python3 -c "import json; d=json.load(open('$LOGS/install.json'))['env']; print(' '.join(f'{k}={v}' for k, v in d.items() if not k.startswith(('CACHEBAKE_', 'TRITON_CACHE_MANAGER'))))")

step "2a. control: Triton's own manager on the read-only tree (expected: PermissionError)"
serve control_plain $PLAIN_ENV
grep -c PermissionError "$LOGS/control_plain.err" | sed 's/^/   PermissionError lines: /'

step "2b. the layered manager (install --overlay env) on the read-only tree"
serve layered $(envargs "$LOGS/install.json") POD_NAME=serve-miss-0
AFTER=$(tree_sum "$(readlink -f "$SRV/triton")")
echo "   installed tree before $BEFORE after $AFTER" | tee -a "$LOGS/steps.log"
record tree_unchanged "$([ "$BEFORE" = "$AFTER" ] && echo 0 || echo 1)"

step "3. cachebake misses; fold the misses into $ART2"
"${CB[@]}" misses "$OVL" | tee "$LOGS/misses.txt"
"${CB[@]}" misses "$OVL" --json >"$LOGS/misses.json"; record misses $?
"${CB[@]}" replay --base "$ART" --misses "$OVL" --out "$ART2" --json >"$LOGS/fold.json" 2>"$LOGS/fold.err"
rc=$?; python3 -c "
import json
r = json.load(open('$LOGS/fold.json'))
print(len(r.get('compiled', [])), 'kernels folded;', [a['result'] for a in r.get('autotune', [])], 'autotune;',
      len(r.get('failed', [])), 'failed;', r.get('helpers_built'), 'launcher helpers built')
" | tee -a "$LOGS/steps.log"; record fold $rc

step "4. the next artifact, installed read-only at $SRV2, Triton's own manager, uid 65534"
"${CB[@]}" install "$ART2" --to "$SRV2" --json >"$LOGS/install2.json" 2>"$LOGS/install2.err"; record install2 $?
chmod -R a-w "$(readlink -f "$SRV2/triton")/.."
serve next_plain $(envargs "$LOGS/install2.json")
"${CB[@]}" verify --cache "$SRV2" --work-dir "$LOGS/verify" --json -- python3 "$SRC/bench/serve_workload.py" $SERVED >"$LOGS/verify.json" 2>"$LOGS/verify.err"
record verify_next $?

step "summary"
python3 - "$RES" "$LOGS" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
res = {r["label"]: r for r in map(json.loads, open(sys.argv[1]))}
logs = sys.argv[2]
def out(label): return res.get(label, {}).get("out") or {}
misses = json.load(open(f"{logs}/misses.json"))
checks = [
    ("bake reached its fixed point", res["build"]["rc"] == 0),
    ("control (Triton's manager, read-only) died with PermissionError",
     res["control_plain"]["rc"] != 0 and "PermissionError" in open(f"{logs}/control_plain.err").read()),
    ("layered: the sweep completed with right results", res["layered"]["rc"] == 0 and out("layered").get("ok")),
    ("layered: it compiled what the bake lacks", len(out("layered").get("compiles", [])) > 0),
    ("installed tree byte-identical", res["tree_unchanged"]["rc"] == 0),
    ("misses logged (kernel and autotune)", {g["kind"] for g in misses.get("groups", [])} >= {"kernel", "autotune"}),
    ("fold-back wrote the next artifact", res["fold"]["rc"] == 0),
    ("next artifact: 0 compiles", res["next_plain"]["rc"] == 0 and out("next_plain").get("compiles") == []),
    ("next artifact: 0 autotune benchmarks", out("next_plain").get("autotune_benchmarks") == 0),
    ("verify on the next artifact: exit 0", res["verify_next"]["rc"] == 0),
]
for name, ok in checks:
    print(("PASS " if ok else "FAIL ") + name)
print("layered run:", json.dumps(out("layered")))
print("next run:   ", json.dumps(out("next_plain")))
print("misses:", misses.get("misses"), "in", len(misses.get("groups", [])), "groups")
EOF
tar -C /tmp -czf "$OUT/logs.tgz" serve-miss-logs
