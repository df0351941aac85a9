#!/bin/sh
# Entrypoint of the installer image (docker/installer.Dockerfile).
#
# With arguments: `cachebake ARGS...` (what `cachebake k8s` puts in the Pod).
# Without: install $CACHEBAKE_ARTIFACT (docker://HOST/REPO:TAG, or a path) into
# ${CACHEBAKE_DIR:-/cachebake}, with, when set: CACHEBAKE_SERVE_AT (where the server mounts the
# volume), CACHEBAKE_TARGET (sm_90...), CACHEBAKE_FINGERPRINT (the serving image's fingerprint
# file), REGISTRY_AUTH_FILE (registry credentials, docker config.json format: skopeo reads it),
# CACHEBAKE_SYNC=1 (flush to disk before the switch: for a volume the server may start from
# without this entrypoint running first).
# Exit codes are cachebake's (README): 0 installed or already installed, 4 the bake was made
# for another environment, 5/6 corrupt or unsafe artifact, 11 lock timeout.
set -eu
if [ "$#" -gt 0 ]; then
    exec cachebake "$@"
fi
: "${CACHEBAKE_ARTIFACT:?set CACHEBAKE_ARTIFACT (docker://HOST/REPO:TAG or a path), or pass cachebake arguments}"
# --no-sync unless CACHEBAKE_SYNC=1: DIR is a volume this entrypoint fills before each start of
# the server, so a crash's damage (files left empty) is found and repaired by the next run.
set -- install "$CACHEBAKE_ARTIFACT" --to "${CACHEBAKE_DIR:-/cachebake}"
if [ "${CACHEBAKE_SYNC:-0}" != 1 ]; then set -- "$@" --no-sync; fi
if [ -n "${CACHEBAKE_SERVE_AT:-}" ]; then set -- "$@" --serve-at "$CACHEBAKE_SERVE_AT"; fi
if [ -n "${CACHEBAKE_TARGET:-}" ]; then set -- "$@" --target "$CACHEBAKE_TARGET"; fi
if [ -n "${CACHEBAKE_FINGERPRINT:-}" ]; then set -- "$@" --fingerprint "$CACHEBAKE_FINGERPRINT"; fi
exec cachebake "$@"
