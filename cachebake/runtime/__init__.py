"""The serving side: what runs inside the server's processes.

- ``layered``: a Triton cache manager that reads the baked tree read-only and writes misses to
  a writable overlay (or to memory), so a miss never crashes a server whose cache is read-only;
- ``misslog``: one JSON line per miss, from every process of every replica;
- ``misses``: merge those logs (``cachebake misses``); ``foldback``: compile them into the
  next artifact without a GPU;
- ``vllm_plugin``: the ``vllm.general_plugins`` entry point that turns both the monitor and
  the layered cache on in vLLM's engine and worker processes.

This module stays import-light: the vLLM plugin imports it in every process.
"""

from __future__ import annotations

import os

# The one home of the runtime's variable names (install, serve-args, verify and the manager
# read them from here).
OVERLAY_ENV = "CACHEBAKE_OVERLAY_DIR"  # writable dir for misses (emptyDir, /tmp)
MISS_LOG_ENV = "CACHEBAKE_MISS_LOG"  # default: <overlay>/misses.jsonl
MANAGER_ENV = "TRITON_CACHE_MANAGER"  # Triton's own knob (triton/knobs.py, cache_knobs)
MANAGER_CLASS = "cachebake.runtime.layered:LayeredCacheManager"
MISS_LOG_NAME = "misses.jsonl"
# "triton": read the baked tree exactly as Triton's own FileCacheManager does (the absolute
# paths in group files, partial groups as they are), still writing misses to the overlay.
# verify uses it: its verdict must be the one a server with Triton's manager would get.
READS_ENV = "CACHEBAKE_LAYERED_READS"
# Where the downward API puts a pod's identity, by the usual convention (the manifests in
# README's Kubernetes section set them); HOSTNAME is the pod name anyway on Kubernetes.
POD_ENV = {"POD_NAME": "pod", "POD_NAMESPACE": "namespace", "NODE_NAME": "node"}


def overlay_env(overlay: os.PathLike | str) -> dict[str, str]:
    """The variables that turn the layered cache on for a server whose TRITON_CACHE_DIR is the
    baked tree: misses go to ``overlay``, and are logged in it."""
    overlay = os.path.abspath(os.fspath(overlay))
    return {MANAGER_ENV: MANAGER_CLASS, OVERLAY_ENV: overlay,
            MISS_LOG_ENV: os.path.join(overlay, MISS_LOG_NAME)}


def serving_overlay_env(overlay: os.PathLike | str, serve_root: os.PathLike | str | None,
                        roles: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``overlay_env`` for a bake installed at ``serve_root``, after checking the overlay is a
    path the server can use: absolute (it is the server's path, not this process's) and
    outside the installed tree (which is never written)."""
    from cachebake.errors import BadInput

    path = os.fspath(overlay)
    if not os.path.isabs(path):
        raise BadInput(f"--overlay {path}: must be an absolute path (the server's)")
    if "triton" not in roles:
        raise BadInput("--overlay: this bake has no triton cache to layer")
    norm = os.path.normpath(path)
    root = os.path.normpath(os.fspath(serve_root)) if serve_root is not None else None
    if root is not None and (norm == root or norm.startswith(root + os.sep)):
        raise BadInput(f"--overlay {path}: inside the installed tree {root}, which the server "
                       "must never write; use an emptyDir or /tmp")
    return overlay_env(norm)
