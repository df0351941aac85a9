"""Activate cachebake's compile monitor in any Python process started with this directory on
PYTHONPATH (``cachebake build -- CMD`` puts it there), then run the sitecustomize this one
shadows, if any.  Does nothing unless $CACHEBAKE_MONITOR_LOG is set; never raises.
"""

import os
import sys


def _activate() -> None:
    # cachebake.capture.env.MONITOR_LOG_ENV, spelled out: this runs in every Python process of
    # a bake before the right cachebake is loaded (below), and most never need it.
    if not os.environ.get("CACHEBAKE_MONITOR_LOG"):
        return
    # Load the cachebake this file belongs to (the one whose parent reads the events), not
    # whichever one this interpreter may have installed, and without putting its
    # site-packages on sys.path.
    pkg_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    loaded = sys.modules.get("cachebake")
    if loaded is None or os.path.abspath(os.path.dirname(loaded.__file__ or "")) != pkg_dir:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "cachebake", os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir])
        module = importlib.util.module_from_spec(spec)
        sys.modules["cachebake"] = module
        spec.loader.exec_module(module)
    import cachebake.capture.activate  # noqa: F401


def _chain() -> None:
    """Run the next sitecustomize on sys.path (a distro's or a venv's), which we shadow."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = list(sys.path)
    me = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved_path
        if me is not None:
            sys.modules["sitecustomize"] = me


try:
    _activate()
except Exception as e:  # a broken monitor must not break the program it watches
    print(f"cachebake monitor: not active in pid {os.getpid()}: {e!r}", file=sys.stderr)
_chain()
