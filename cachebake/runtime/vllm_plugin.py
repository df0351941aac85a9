"""vLLM general plugin (entry point ``vllm.general_plugins: cachebake_monitor``).

vLLM calls ``register()`` in its engine and in every worker process, which is exactly where
kernels compile; that makes the compile monitor reach processes that PYTHONPATH tricks might
miss.  It must be cheap and inert when not baking: with $CACHEBAKE_MONITOR_LOG unset it only
reads one environment variable.
"""

import os

from cachebake.capture.env import MONITOR_LOG_ENV  # os, pathlib, dataclasses: nothing heavy


def register() -> None:
    if not os.environ.get(MONITOR_LOG_ENV):
        return
    from cachebake.capture import monitor

    monitor.activate()
