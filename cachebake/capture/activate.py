"""Import this to start the compile monitor in this process if $CACHEBAKE_MONITOR_LOG is set.

Children a bake starts (driver rounds, vLLM's engine and workers through the plugin, any
Python started with ``capture.env``'s PYTHONPATH) import it; with the variable unset it does
nothing and imports nothing heavy.
"""

import os as _os

from cachebake.capture.env import MONITOR_LOG_ENV as _MONITOR_LOG_ENV

if _os.environ.get(_MONITOR_LOG_ENV):
    from cachebake.capture import monitor as _monitor

    _monitor.activate()
