# syntax=docker/dockerfile:1
# A vLLM serving image with its Triton/vLLM caches baked in by cachebake: the pattern to copy.
#
# On a GPU builder (README "Containers and Kubernetes"): Docker >= 27 with CDI, Buildx >= 0.22,
# a BuildKit >= 0.20 builder that sees the GPU, from the checkout with its wheel in dist/, e.g.
#   python3 -m pip wheel --no-deps -w dist .
#   docker buildx create --name gpubuilder --driver-opt image=moby/buildkit:buildx-stable-1-gpu --bootstrap
#   docker buildx build --builder gpubuilder --allow device \
#     --build-arg BASE=vllm/vllm-openai:v0.33.0 --build-arg MODEL=nemotron-h -t my/vllm-baked .
# `RUN --device` is stable Dockerfile syntax since frontend 1.27 (the syntax line above takes
# the newest 1.x); with an older frontend use `# syntax=docker/dockerfile:1-labs`.
#
# Builders with no GPU in builds: bake on a GPU host with `cachebake build --image BASE ...`,
# turn it into an image with `cachebake image ART --tag CACHE_IMAGE`, and replace the `cache`
# stage below with `FROM CACHE_IMAGE AS cache`.

# The serving image: vLLM, torch and Triton exactly as they will serve.
ARG BASE
# Where the caches live at bake time and at serve time (the same path: nothing to relocate).
ARG ROOT=/var/cache/cachebake

# ---- the serving image plus cachebake (pure Python: click, zstandard, rich) ----------------
# From the wheel of this checkout in the build context (cachebake is not on PyPI): make it first,
#   python3 -m pip wheel --no-deps -w dist .
# or give pip something else to install: --build-arg CACHEBAKE_PIP=SPEC (docker/install-cachebake.sh).
FROM ${BASE} AS serving-cachebake
ARG CACHEBAKE_PIP=
RUN --mount=type=bind,source=.,target=/cachebake-context \
    CACHEBAKE_PIP="$CACHEBAKE_PIP" sh /cachebake-context/docker/install-cachebake.sh /cachebake-context
ARG ROOT
# vLLM 0.24 hashes these two into its torch.compile cache key and derives them from HOME/XDG
# (vllm/envs.py): set here, in the stage the bake and the server both start from, they are the
# same whatever uid and HOME the server runs with (vLLM 0.33 no longer hashes them).  The serve
# stage's last step checks every compile factor against what the bake recorded.
ENV VLLM_CONFIG_ROOT=${ROOT}/vllm-config \
    VLLM_XLA_CACHE_PATH=${ROOT}/vllm-xla-cache

# ---- bake: warm up on the GPU until a round compiles nothing, pack, install the result ------
FROM serving-cachebake AS bake
ARG ROOT
ARG MODEL=nemotron-h
ARG DRIVER=vllm
# Empty: the GPU the build sees.  A CPU builder compiles ahead of time for the target it names.
ARG TARGET=
# Empty: `--driver DRIVER --model MODEL` on the GPU.  Set, it replaces the driver with a
# command (CI sets a script that AOT-compiles real sm_90 kernels with triton.compile).
ARG BAKE_WARMUP=
# --no-sync on install: the builder commits the stage's files as a layer; a crash fails the build.
RUN --device=nvidia.com/gpu=all \
    set -eu; \
    if [ -n "$BAKE_WARMUP" ]; then set -- -- $BAKE_WARMUP; \
    else set -- --driver "$DRIVER" --model "$MODEL"; fi; \
    cachebake build --out /cachebake/artifact --root "$ROOT" ${TARGET:+--target "$TARGET"} "$@"; \
    cachebake install /cachebake/artifact --to "/cachebake/tree$ROOT" --serve-at "$ROOT" --no-sync \
        ${TARGET:+--target "$TARGET"}

# ---- cache: only the installed tree, at the serving root --------------------------------------
FROM scratch AS cache
COPY --from=bake /cachebake/tree/ /

# ---- the serving image with the cache and the environment `cachebake serve-args` gives ------
FROM serving-cachebake AS serve
ARG ROOT
COPY --from=cache / /
# One variable per cache role (cachebake.roles); autotune results are only read with
# TRITON_CACHE_AUTOTUNING=1.  Cache-invalidating variables set at bake time (`cachebake
# inspect` lists them) must be set here too.  The server writes into the vllm and inductor
# roles at start (torch makes TORCHINDUCTOR_CACHE_DIR at import): run it as the image's user
# on a writable root filesystem; for a read-only one, use `cachebake k8s`'s Pods, which give
# every written path an emptyDir (docs/server-environment.md).
ENV TRITON_CACHE_DIR=${ROOT}/triton \
    VLLM_CACHE_ROOT=${ROOT}/vllm \
    FLASHINFER_WORKSPACE_BASE=${ROOT}/flashinfer \
    TORCHINDUCTOR_CACHE_DIR=${ROOT}/inductor \
    TRITON_CACHE_AUTOTUNING=1
# With a vllm role: fail the build (exit 4, naming the factor) when vLLM would not compute the
# bake's torch.compile hashes in this environment (`vllm serve` with the bake's model path and
# flags, `cachebake serve-args` prints them); no GPU needed.
RUN if [ -d "${ROOT}/vllm/torch_compile_cache" ]; then cachebake verify --check-only --cache "${ROOT}"; fi
