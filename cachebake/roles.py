"""The cache roles a bake can hold, where each lives, and where a server's misses go.

A role names one kind of cache (Triton's, vLLM's, FlashInfer's, Inductor's).  In the layer each
role is a top-level directory; at serve time each role's directory is handed to its owner
through one environment variable.  Build (capture.env), pack (artifact) and install all read
this table, so a bake's paths match the server's by construction.

The overlay (``install --overlay``, ``serve-args --overlay``) is the writable dir the layered
cache manager (cachebake.serve.layered) sends misses to; its variables are the one home of
those names, read by install, serve-args, verify and the manager itself.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

# role -> the environment variable that points its owner at the directory
ROLE_ENV: dict[str, str] = {
    "triton": "TRITON_CACHE_DIR",
    "vllm": "VLLM_CACHE_ROOT",
    "flashinfer": "FLASHINFER_WORKSPACE_BASE",
    "inductor": "TORCHINDUCTOR_CACHE_DIR",
}

# The default root both the bake and the server use.  Baking and serving at the same absolute
# path means Triton's group files already point at the right place; install at any other path
# rewrites them (install.relocate).
DEFAULT_ROOT = PurePosixPath(os.environ.get("CACHEBAKE_ROOT", "/var/cache/cachebake"))


def role_dir(root: os.PathLike | str, role: str) -> str:
    if role not in ROLE_ENV:
        raise ValueError(f"unknown cache role {role!r} (known: {', '.join(ROLE_ENV)})")
    return os.path.join(os.fspath(root), role)


def serving_env(root: os.PathLike | str, roles: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The environment a server needs to use the roles installed under ``root``."""
    return role_env({r: role_dir(root, r) for r in roles})


def role_env(where: dict[str, str]) -> dict[str, str]:
    """The roles' variables for roles found at ``where`` (role -> dir): the bake's side
    (capture.env) and the server's (cachebake.install.environment.server_env) both use it."""
    env = {ROLE_ENV[r]: d for r, d in where.items()}
    if "triton" in where:
        # vLLM sets this itself, but a plain Triton program does not; results baked with it
        # on are only read back with it on.
        env["TRITON_CACHE_AUTOTUNING"] = "1"
    return env


OVERLAY_ENV = "CACHEBAKE_OVERLAY_DIR"  # writable dir for misses (emptyDir, /tmp)
MISS_LOG_ENV = "CACHEBAKE_MISS_LOG"  # default: <overlay>/misses.jsonl
MANAGER_ENV = "TRITON_CACHE_MANAGER"  # Triton's own knob (triton/knobs.py, cache_knobs)
MANAGER_CLASS = "cachebake.serve.layered:LayeredCacheManager"
MISS_LOG_NAME = "misses.jsonl"


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
    outside the installed tree (which is never written), as written and after resolving links
    on this machine (a symlink into the tree, or a tree reached through one, counts).  The
    server checks the rest when it uses it (cachebake.serve.overlay: its own uid, 0700)."""
    from cachebake.errors import BadInput

    path = os.fspath(overlay)
    if not os.path.isabs(path):
        raise BadInput(f"--overlay {path}: must be an absolute path (the server's)")
    if "triton" not in roles:
        raise BadInput("--overlay: this bake has no triton cache to layer")
    norm = os.path.normpath(path)
    if serve_root is not None:
        root = os.path.normpath(os.fspath(serve_root))
        for mine, tree in ((norm, root), (os.path.realpath(norm), os.path.realpath(root))):
            if mine == tree or mine.startswith(tree.rstrip(os.sep) + os.sep):
                resolved = "" if mine == norm else f" (it resolves to {mine})"
                raise BadInput(f"--overlay {path}: inside the installed tree {tree}{resolved}, which "
                               "the server must never write; use an emptyDir or /tmp")
    return overlay_env(norm)
