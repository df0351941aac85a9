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
# After the install, the environment the server needs for this bake goes to
# ${CACHEBAKE_DIR}/cachebake-serve.env as `export` lines (`. /var/cache/cachebake/cachebake-serve.env`
# before `vllm serve`): each cache role at the serving root, and the variables vLLM's
# torch.compile hashes need to come out as the bake's whatever the server's HOME and uid (vLLM
# 0.24's VLLM_CONFIG_ROOT and VLLM_XLA_CACHE_PATH, as the bake recorded them), the model runner
# and cache-invalidating variables.  Both ways below give the same environment, built by one
# function (cachebake.install.environment.server_env, with its refusals of what an artifact may
# not set): for a local artifact `cachebake serve-args --env-file` writes it; for a registry
# reference, install's own report (pulled once).  The server still needs its written paths
# writable (docs/server-environment.md): HOME, /tmp, VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR.
# Exit codes are cachebake's (README): 0 installed or already installed, 4 the bake was made
# for another environment, 5/6 corrupt or unsafe artifact, 11 lock timeout.
set -eu
if [ "$#" -gt 0 ]; then
    exec cachebake "$@"
fi
: "${CACHEBAKE_ARTIFACT:?set CACHEBAKE_ARTIFACT (docker://HOST/REPO:TAG or a path), or pass cachebake arguments}"
dir="${CACHEBAKE_DIR:-/cachebake}"
# --no-sync unless CACHEBAKE_SYNC=1: DIR is a volume this entrypoint fills before each start of
# the server, so a crash's damage (files left empty) is found and repaired by the next run.
set -- install "$CACHEBAKE_ARTIFACT" --to "$dir"
if [ "${CACHEBAKE_SYNC:-0}" != 1 ]; then set -- "$@" --no-sync; fi
if [ -n "${CACHEBAKE_SERVE_AT:-}" ]; then set -- "$@" --serve-at "$CACHEBAKE_SERVE_AT"; fi
if [ -n "${CACHEBAKE_TARGET:-}" ]; then set -- "$@" --target "$CACHEBAKE_TARGET"; fi
if [ -n "${CACHEBAKE_FINGERPRINT:-}" ]; then set -- "$@" --fingerprint "$CACHEBAKE_FINGERPRINT"; fi
# CACHEBAKE_VERIFY_KEY: a PEM public key (the text, or a file): the image must carry its signature (exit 13)
if [ -n "${CACHEBAKE_VERIFY_KEY:-}" ]; then set -- "$@" --verify-key "$CACHEBAKE_VERIFY_KEY"; fi
env_file="$dir/cachebake-serve.env"
if [ -e "$CACHEBAKE_ARTIFACT" ]; then
    cachebake "$@"
    set -- serve-args "$CACHEBAKE_ARTIFACT" --root "${CACHEBAKE_SERVE_AT:-$dir}" --env-file "$env_file"
    if [ -n "${CACHEBAKE_TARGET:-}" ]; then set -- "$@" --target "$CACHEBAKE_TARGET"; fi
    exec cachebake "$@" >/dev/null
fi
# A registry reference is pulled once, by install: its report carries the environment.
report="$(cachebake "$@" --json)" || { status=$?; printf '%s\n' "$report"; exit "$status"; }
printf '%s\n' "$report"
printf '%s' "$report" | exec python3 -c '
import json, re, shlex, sys
env = json.load(sys.stdin).get("env") or {}
bad = [k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
if bad:
    sys.exit(f"cachebake-init: the install report names no variables: {bad[:3]}")
path = sys.argv[1]
with open(path + ".tmp", "w") as f:
    f.writelines(f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(env.items()))
import os
os.replace(path + ".tmp", path)
' "$env_file"
