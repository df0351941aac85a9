#!/usr/bin/env bash
# The container paths that need a GPU, which CI (CPU only) cannot run: the Dockerfile's bake
# stage on a GPU through CDI, and `cachebake build --image` with GPUs requested.
#
# Needs, on the GPU host: Docker >= 27 with the NVIDIA CDI spec (`nvidia-ctk cdi generate
# --output=/etc/cdi/nvidia.yaml`), Buildx >= 0.22, network access to pull BASE and
# moby/buildkit:buildx-stable-1-gpu (or both already loaded), and cachebake installed.
#
#   BASE=vllm/vllm-openai:v0.33.0 MODEL=nemotron-h DRIVER=kernels bash bench/gpu_containers.sh
#
# What to look for: both bakes end "N rounds (stable)"; both `verify` runs print
# "verified ...: 0 compiles"; the two artifacts' fingerprints name the image's Python and Triton.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BASE:?set BASE to a vLLM serving image}"
MODEL=${MODEL:-nemotron-h}
DRIVER=${DRIVER:-kernels}  # kernels: vLLM's Mamba2 ops only (minutes); vllm: the whole engine
OUT=${OUT:-$(mktemp -d)}
echo "results in $OUT"

# 1. The Dockerfile as users build it: the bake stage sees the GPU through CDI.
docker buildx inspect gpubuilder >/dev/null 2>&1 || \
  docker buildx create --name gpubuilder --driver-opt image=moby/buildkit:buildx-stable-1-gpu --bootstrap
docker buildx build --builder gpubuilder --allow device --load --progress=plain \
  --build-arg BASE="$BASE" --build-arg MODEL="$MODEL" --build-arg DRIVER="$DRIVER" \
  -t cachebake-gpu/served:test . 2>&1 | tee "$OUT/dockerfile-build.log"
docker run --rm --gpus all cachebake-gpu/served:test \
  cachebake verify --cache /var/cache/cachebake --driver "$DRIVER" --model "$MODEL" | tee "$OUT/dockerfile-verify.log"

# 2. No GPU in the build: bake inside the serving image through the Docker API, then verify.
docker buildx build --builder gpubuilder --load --target serving-cachebake \
  --build-arg BASE="$BASE" -t cachebake-gpu/serving-cachebake:test .
cachebake build --image cachebake-gpu/serving-cachebake:test --gpus all --driver "$DRIVER" \
  --model "$MODEL" --out "$OUT/artifact" 2>&1 | tee "$OUT/build-image.log"
cachebake inspect "$OUT/artifact" | tee "$OUT/inspect.txt"
cachebake image "$OUT/artifact" --tag cachebake-gpu/cache:test
printf 'FROM cachebake-gpu/serving-cachebake:test\nCOPY --from=cachebake-gpu/cache:test /var/cache/cachebake /var/cache/cachebake\nENV TRITON_CACHE_DIR=/var/cache/cachebake/triton TRITON_CACHE_AUTOTUNING=1\n' \
  | docker build -t cachebake-gpu/served-from-cache:test -
docker run --rm --gpus all cachebake-gpu/served-from-cache:test \
  cachebake verify --cache /var/cache/cachebake --driver "$DRIVER" --model "$MODEL" | tee "$OUT/cache-image-verify.log"
