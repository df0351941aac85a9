"""vLLM general plugin (entry point ``vllm.general_plugins: cachebake_monitor``).

vLLM calls ``register()`` in its engine and in every worker process, which is exactly where
kernels compile; that makes both cachebake taps reach processes that PYTHONPATH tricks might
miss:
- ``$CACHEBAKE_OVERLAY_DIR`` set (``install --overlay``, ``serve-args --overlay``): the
  layered cache (a read-only bake plus a writable overlay, every miss logged), and in the
  ``vllm serve`` process the exit hook that logs the torch.compile dirs the bake lacked
  (cachebake.serve.vllm_misses);
- ``$CACHEBAKE_MONITOR_LOG`` set (build, verify): the compile monitor, which wraps whichever
  cache manager is in use, so it goes second;
- ``$CACHEBAKE_VLLM_PROBE`` set (the vllm driver's rounds): the torch.compile probe, which
  records the hashes vLLM computes and whether it loaded the AOT artifact
  (cachebake.vllm.identity).
It must be cheap and inert otherwise: with none set it only reads three variables.
"""

import os
import sys

from cachebake.capture.env import MONITOR_LOG_ENV
from cachebake.vllm.identity import PROBE_ENV  # light: it imports vLLM only when called
from cachebake.roles import OVERLAY_ENV


def register() -> None:
    if os.environ.get(OVERLAY_ENV):
        try:
            from cachebake.serve import layered

            layered.activate()
        except Exception as e:  # a plugin must never stop vLLM from starting
            print(f"cachebake: the layered cache is off in pid {os.getpid()}: {e!r}", file=sys.stderr)
        try:
            from cachebake.serve import vllm_misses

            vllm_misses.install_exit_hook()
        except Exception as e:  # a plugin must never stop vLLM from starting
            print(f"cachebake: vLLM cache misses are not logged in pid {os.getpid()}: {e!r}",
                  file=sys.stderr)
    if os.environ.get(MONITOR_LOG_ENV):
        from cachebake.capture import monitor

        monitor.activate()
    if os.environ.get(PROBE_ENV):
        try:
            from cachebake.vllm import identity as vllm_identity

            vllm_identity.install_probe()
        except Exception as e:  # a plugin must never stop vLLM from starting
            print(f"cachebake: the compile probe is off in pid {os.getpid()}: {e!r}", file=sys.stderr)
