#!/usr/bin/env bash
# Restored vs same-path warm sweeps, interleaved (8 each), on the machine bench/gpu_bake.sh just
# ran on (it leaves /tmp/bake-A and /srv/cachebake-B in place).  Interleaving cancels drift;
# the two sweeps do identical work (0 compiles, 16 file-cache hits), so any difference is noise
# or the cache's location.
#   bash bench/gpu_interleaved.sh SRC OPS OUT
set -uo pipefail
SRC=$(realpath "$1"); OPS=$(realpath "$2"); OUT=$(realpath "$3")
cd /tmp
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC:$OPS:/tmp/site" TRITON_CACHE_AUTOTUNING=1
R=$OUT/interleaved.jsonl
for i in 1 2 3 4 5 6 7 8; do
  for w in warm:/tmp/bake-A/triton restored:/srv/cachebake-B/triton; do
    l=${w%%:*}$i
    TRITON_CACHE_DIR=${w#*:} python3 "$SRC/bench/timed_sweep.py" --label "$l" --log "/tmp/ev-$l.jsonl" 2>/dev/null | tail -n1 >>"$R"
  done
done
python3 - "$R" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for k in ("warm", "restored"):
    xs = [r["sweep_s"] for r in rows if r["label"].startswith(k)]
    med[k] = st.median(xs)
    print(k, "n", len(xs), "median", round(med[k], 3), "min", min(xs), "max", max(xs),
          "compiles", sum(r["compiles"] for r in rows if r["label"].startswith(k)))
print("restored/warm", round(med["restored"] / med["warm"], 3))
PY
