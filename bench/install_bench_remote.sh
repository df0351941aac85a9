#!/usr/bin/env bash
# The install benchmark (bench/bench_install.py) on another machine with no network: the GPU
# host (16 cores, its own disk), to set beside the 2-vCPU CI-like VM's numbers.
#
# Prepared here (what travels; .carry and .whl are git-ignored):
#   .whl/zstandard-*.whl                       (python3 -m pip download ... zstandard, README of the device)
#   .carry/installbench/zstd, lib/*.so*        the zstd CLI for the pipeline, and its libraries
#   .carry/installbench/cache.tar.zst          bench/realistic_cache.py's cache, built here
# Run there from the checkout's root:  bash bench/install_bench_remote.sh OUTDIR
set -uo pipefail
OUT=${1:?OUTDIR}
B=.carry/installbench
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:$PATH LD_LIBRARY_PATH=$PWD/$B/lib PYTHONUNBUFFERED=1
mkdir -p /tmp/bin /tmp/cachebake-bench && cp $B/zstd /tmp/bin/
zstd -d -q -c $B/cache.tar.zst | tar -x -C /tmp/cachebake-bench && touch /tmp/cachebake-bench/.triton.complete || exit 1

# A tmpfs of its own when /dev/shm is a container's small one (the bench keeps two trees).
SHM=/dev/shm
if [ "$(df -k --output=avail /dev/shm | tail -1)" -lt 1048576 ]; then
    mkdir -p /mnt/cbshm && mount -t tmpfs -o size=4g tmpfs /mnt/cbshm && SHM=/mnt/cbshm || SHM=
fi
{ nproc; lscpu | sed -n 1,20p; df -T /tmp $SHM; grep -E " / | /tmp | $SHM " /proc/mounts; python3 --version
  zstd --version; tar --version | head -1; uptime; } > "$OUT/machine.txt" 2>&1
DIRS=(--workdir /tmp); [ -n "$SHM" ] && DIRS+=(--workdir "$SHM")
python3 bench/bench_install.py --repeat 21 "${DIRS[@]}" --out "$OUT/install.md" > "$OUT/install.log" 2>&1
cat "$OUT/install.md"
python3 bench/bench_install.py --repeat 15 --keep-trees --workdir /tmp --out "$OUT/install-keep-trees.md" \
    > "$OUT/install-keep-trees.log" 2>&1
cat "$OUT/install-keep-trees.md"
python3 bench/bench_install.py --lanes --repeat 21 "${DIRS[@]}" 2>&1 | tee "$OUT/lanes.txt"
python3 bench/bench_install.py --phases --repeat 15 "${DIRS[@]}" 2>&1 | tee "$OUT/phases.txt"
