#!/usr/bin/env bash
# README's first section as a stranger runs it, on a stock Debian 12 (not part of .ci/run): a
# debootstrap'd bookworm root filesystem, a copy of this checkout's COMMIT under its 0700 /root
# (no git there), then README's commands exactly as written: the venv lines and `cachebake build
# --model nemotron-h` (on this CPU machine: exit 7 and one line), its CPU quick start, then
# `bash .ci/run`, then docs/testing.md's fast lane as written, in the environment .ci/run made.
# Each phase prints its seconds.
#
#   bash .ci/fresh-debian12.sh [COMMIT]      (as root; default HEAD; logs in $DEB12/logs)
#
# The root filesystem is made once ($DEB12/base, ~5 min) and copied for every run, so each run
# starts from the same fresh system.  Network: the host's resolv.conf; nothing else is shared
# but /proc, /sys, /dev (the container job starts its engines in a namespace of its own).
set -euo pipefail
COMMIT=${1:-HEAD}
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEB12=${DEB12:-/var/tmp/cachebake-deb12}
BASE=$DEB12/base
mkdir -p "$DEB12/logs"
if [ ! -x "$BASE/bin/bash" ]; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  rm -rf "$BASE.tmp"
  debootstrap bookworm "$BASE.tmp" http://deb.debian.org/debian >"$DEB12/logs/debootstrap.log" 2>&1
  mv "$BASE.tmp" "$BASE"
fi
sha=$(git -C "$REPO" rev-parse --short "$COMMIT")
ROOT=$DEB12/run-$sha
LOG=$DEB12/logs/$sha
umount_all() {  # what we mounted, and what the container job left (its netns under /run)
  for m in run/netns dev sys proc; do umount -R -l "$ROOT/$m" 2>/dev/null || true; done
  umount -R -l "$ROOT" 2>/dev/null || true
}
trap umount_all EXIT
umount_all
rm -rf "$ROOT" && cp -a "$BASE" "$ROOT"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# A network that intercepts TLS (this workplace's egress proxy) has its own CA, which the host
# trusts through /usr/local/share/ca-certificates: the same files go in, and Debian's
# ca-certificates (installed by README's first apt line) adds them.  A stranger's plain network
# needs none.
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$ROOT/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/" 2>/dev/null || true
fi
mkdir -p "$ROOT/root/cachebake"
git -C "$REPO" archive "$COMMIT" | tar -x -C "$ROOT/root/cachebake"
# the root a mount point of its own, as on a booted machine (the container job's engines make
# their mounts private/slave from /), and /dev with its submounts (/dev/shm, /dev/pts)
mount --bind "$ROOT" "$ROOT"
mount -t proc proc "$ROOT/proc"
mount --rbind /sys "$ROOT/sys"
mount --rbind /dev "$ROOT/dev"
phase_started=$(date +%s)
phase() {  # phase NAME: the seconds since the last phase ended
  echo "fresh-debian12: $1 took $(( $(date +%s) - phase_started )) s"
  phase_started=$(date +%s)
}
# TERM=dumb, as a CI runner's shell has it
in_root() { chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

# README "Start here", the first block, line by line as typed (a login shell in the checkout)
in_root /bin/bash -c 'cd /root/cachebake && stat -c "%a %n" /root && set -x
apt-get update && apt-get install -y python3-venv     # Debian'"'"'s venv module (and pip in a venv)
python3 -m venv .venv && . .venv/bin/activate
python3 -m pip install . && cachebake build --model nemotron-h
echo "readme-block-1: exit $?"' >"$LOG-readme.log" 2>&1 || true
grep -a "readme-block-1:" "$LOG-readme.log"
tail -n 3 "$LOG-readme.log"
phase readme

# README "Quick start on a CPU", in the first block's venv, each line as written (taken from
# README itself), with the exit code it gave: README says 0 for each, 8 for the one marked so
awk '/^## Quick start on a CPU/{f=1} f&&/^```sh/{b=1;next} b&&/^```/{exit} b&&NF{print}' "$ROOT/root/cachebake/README.md" \
  >"$ROOT/root/quickstart.lines"
in_root /bin/bash -c 'cd /root/cachebake && . .venv/bin/activate
while IFS= read -r line; do bash -c "$line" </dev/null; echo "quickstart: exit $? <- $line"; done </root/quickstart.lines' \
  >"$LOG-quickstart.log" 2>&1 || true
grep -a "^quickstart:" "$LOG-quickstart.log"
phase quickstart

# README's test command, in a fresh copy of the checkout (the first block's venv left aside)
rm -rf "$ROOT/root/cachebake-ci" && mkdir -p "$ROOT/root/cachebake-ci"
git -C "$REPO" archive "$COMMIT" | tar -x -C "$ROOT/root/cachebake-ci"
rc=0
in_root /bin/bash -c 'cd /root/cachebake-ci && CI=true bash .ci/run' >"$LOG-ci.log" 2>&1 || rc=$?
grep -a "^\.ci/run:" "$LOG-ci.log" | tail -n 8
echo "fresh-debian12: .ci/run exit $rc (logs: $LOG-readme.log, $LOG-quickstart.log, $LOG-ci.log)"
phase ci

# docs/testing.md's fast lane, the line under its "# runs in: .ci/run's environment" as written,
# in the same checkout after .ci/run (it once gave 2 failed there: a umoci path .ci/run no
# longer used)
awk '/^# runs in: \.ci\/run.s environment/{getline; print; exit}' "$ROOT/root/cachebake-ci/docs/testing.md" \
  >"$ROOT/root/fastlane.line"
frc=0
if grep -q "pytest" "$ROOT/root/fastlane.line"; then
  in_root /bin/bash -c 'cd /root/cachebake-ci && echo "+ $(cat /root/fastlane.line)" && . /root/fastlane.line' \
    >"$LOG-fastlane.log" 2>&1 || frc=$?
else
  echo "docs/testing.md has no fast lane line under '# runs in: .ci/run's environment'" >"$LOG-fastlane.log"
  frc=1
fi
head -n 1 "$LOG-fastlane.log"
tail -n 3 "$LOG-fastlane.log"
echo "fresh-debian12: fast lane exit $frc (log: $LOG-fastlane.log)"
phase fast-lane
[ "$rc" -ne 0 ] || rc=$frc
exit $rc
