"""The cache roles a bake can hold, and where each lives.

A role names one kind of cache (Triton's, vLLM's, FlashInfer's, Inductor's).  In the layer each
role is a top-level directory; at serve time each role's directory is handed to its owner
through one environment variable.  Build (capture.env), pack (artifact) and install all read
this table, so a bake's paths match the server's by construction.
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
    env = {ROLE_ENV[r]: role_dir(root, r) for r in roles}
    if "triton" in roles:
        # vLLM sets this itself, but a plain Triton program does not; results baked with it
        # on are only read back with it on.
        env["TRITON_CACHE_AUTOTUNING"] = "1"
    return env
