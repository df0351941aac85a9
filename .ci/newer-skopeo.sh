#!/usr/bin/env bash
# A skopeo that verifies cosign signatures (containers/image's `sigstoreSigned` policy
# requirement), for tests/test_distribute_sign_verifiers.py.  Debian 12's skopeo 1.9.3 and
# podman 4.3.1 carry a Debian patch that turns sigstore off ("Debian-local change: sigstore
# disabled"); Debian 13's skopeo 1.18 has it.  That binary wants glibc >= 2.38 (bookworm has
# 2.36), so its own libc and libraries come along from the same suite, unpacked into DEST (not
# installed: the system's packages stay bookworm's), and DEST/bin/skopeo runs skopeo through
# that suite's dynamic loader.  Fetched with apt itself, a private sources list and state dir,
# signatures checked against Debian's archive keyring.  Prints the wrapper's path.
set -euo pipefail
suite=${1:-trixie}
dest=${2:-/opt/skopeo-$suite}
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
      -o APT::Sandbox::User=root -o Acquire::Check-Valid-Until=false)
apt-get "${opts[@]}" -qq update >&2
# skopeo and what its binary links (ldd: libgpgme, libassuan, libgpg-error, libsqlite3, libc);
# the library packages' names differ between suites (t64), so the suite's own dependency
# closure of skopeo names them.
pkgs=(skopeo)
for dep in $(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
             --no-breaks --no-replaces --no-enhances --no-pre-depends skopeo | awk '/^[a-z]/{print $1}'); do
  case $dep in libc6|libgpgme*|libassuan*|libgpg-error*|libsqlite3-0) pkgs+=("$dep") ;; esac
done
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
(cd "$work" && apt-get "${opts[@]}" -qq download "${pkgs[@]}" >&2)
rm -rf "$dest"
mkdir -p "$dest/root" "$dest/bin"
for deb in "$work"/*.deb; do dpkg -x "$deb" "$dest/root"; done
loader=$(find "$dest/root" -name 'ld-linux*.so.*' \( -type f -o -type l \) | sort | head -n1)
libdir=$(dirname "$(find "$dest/root" -name 'libc.so.6' | head -n1)")
[ -n "$loader" ] && [ -n "$libdir" ] || { echo "newer-skopeo.sh: no loader or libc in $suite's libc6" >&2; exit 1; }
printf '#!/bin/sh\nexec %q --library-path %q %q "$@"\n' "$loader" "$libdir" "$dest/root/usr/bin/skopeo" \
  >"$dest/bin/skopeo"
chmod 755 "$dest/bin/skopeo"
"$dest/bin/skopeo" --version >&2
echo "$dest/bin/skopeo"
