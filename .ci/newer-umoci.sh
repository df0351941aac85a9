#!/usr/bin/env bash
# Debian bookworm's umoci (0.4.7) cannot unpack zstd layers; zstd support came in umoci 0.5.
# Fetch umoci from a newer Debian suite with apt itself (a private sources list and state dir,
# so the system's package lists and installed packages stay bookworm's), unpack the .deb into
# DEST and print the binary's path.  umoci is one Go binary needing only libc6 >= 2.34.
set -euo pipefail
suite=${1:-sid}
dest=${2:-/opt/umoci-$suite}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$uri" ] || uri=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
cat >"$work/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main
SRC
opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
      -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Get::List-Cleanup=0
      -o APT::Sandbox::User=root
      # sid's Release carries a Valid-Until a week ahead; a mirror snapshot or a skewed clock
      # makes it "expired".  The signature (signed-by above) is still checked.
      -o Acquire::Check-Valid-Until=false)
apt-get "${opts[@]}" -qq update >&2
(cd "$work" && apt-get "${opts[@]}" -qq download umoci >&2)
mkdir -p "$dest"
dpkg -x "$work"/umoci_*.deb "$dest"
"$dest/usr/bin/umoci" --version >&2
echo "$dest/usr/bin/umoci"
