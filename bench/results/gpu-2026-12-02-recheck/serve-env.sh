SERVE_ENV='TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR=/srv/cb/triton VLLM_CACHE_ROOT=/srv/cb/vllm VLLM_CONFIG_ROOT=/root/.config/vllm VLLM_XLA_CACHE_PATH=/root/.cache/vllm/xla_cache'
