# The init-container image: the smallest image that runs `cachebake install`.
# Python, cachebake (click, zstandard, rich) and skopeo for registry references; no Triton, no
# torch, no vLLM.  The serving environment's fingerprint comes from the serving image (the Pod
# `cachebake k8s` writes takes it there), so the installer needs none of them.
#
# Built from the checkout's root, with cachebake's wheel in dist/ (docker/install-cachebake.sh;
# --build-arg CACHEBAKE_PIP=SPEC installs something else):
#   python3 -m pip wheel --no-deps -w dist .
#   docker build -f docker/installer.Dockerfile -t REGISTRY/cachebake-installer .
#
# In a Pod (what `cachebake k8s --pattern init` writes):
#   args: [install, docker://REGISTRY/bakes/MODEL:sm_90, --to, /cachebake, --serve-at,
#          /var/cache/cachebake, --target, sm_90, --fingerprint, /cachebake-fingerprint/fingerprint.json,
#          --no-sync]
# With docker run, or without arguments, the entrypoint reads CACHEBAKE_* variables instead
# (see cachebake-init.sh).
ARG BASE=python:3.12-slim
FROM ${BASE}
ARG CACHEBAKE_PIP=
# skopeo (Debian/Ubuntu package) reads docker:// references; a base that has it keeps its own.
RUN --mount=type=bind,source=.,target=/cachebake-context \
    if ! command -v skopeo >/dev/null 2>&1; then \
        apt-get update && apt-get install -y --no-install-recommends skopeo ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && CACHEBAKE_PIP="$CACHEBAKE_PIP" sh /cachebake-context/docker/install-cachebake.sh /cachebake-context
COPY docker/cachebake-init.sh /usr/local/bin/cachebake-init
# Not root: the Pod runs it as 65534 with a read-only root filesystem anyway.
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/cachebake-init"]
