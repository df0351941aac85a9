"""The pinned environment a bake runs under, and a server later serves under.

A Triton cache only hits when the process that reads it computes the same keys and looks in the
same places as the process that wrote it.  ``bake_env`` is the one function that decides those
places (absolute role directories from ``cachebake.roles``), turns on autotune-result caching,
wires the compile monitor into child processes, and records every cache-invalidating variable
that is set (they enter every kernel key, so the server must set them identically).  Build and
verify both call it; install uses ``roles.serving_env`` with the same root, so the paths match
by construction.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from cachebake import roles as roles_mod
from cachebake.roles import DEFAULT_ROOT, ROLE_ENV

ALL_ROLES: tuple[str, ...] = tuple(ROLE_ENV)

# Variables the monitor reads in every process it runs in (see capture.monitor).
MONITOR_LOG_ENV = "CACHEBAKE_MONITOR_LOG"
STEP_ENV = "CACHEBAKE_STEP"
ROUND_ENV = "CACHEBAKE_ROUND"

# A directory holding a ``sitecustomize.py`` that activates the monitor in any Python child
# started with it on PYTHONPATH (and does nothing when MONITOR_LOG_ENV is unset).
AUTOLOAD_DIR = str(Path(__file__).resolve().parent / "autoload")


class InvalidatingEnvWarning(UserWarning):
    """A cache-invalidating variable is set: the server must set it to the same value."""


@dataclass
class BakeEnv:
    """What to run a bake (or a verify) under, and what was found while deciding it."""

    root: str  # absolute
    roles: tuple[str, ...]
    pinned: dict[str, str]  # only the variables cachebake sets
    env: dict[str, str]  # the full environment for the child: base env + pinned
    invalidating: dict[str, str] = field(default_factory=dict)  # set cache-invalidating vars
    warnings: list[str] = field(default_factory=list)

    def role_dirs(self) -> dict[str, str]:
        return {r: roles_mod.role_dir(self.root, r) for r in self.roles}

    def make_dirs(self) -> None:
        for d in self.role_dirs().values():
            os.makedirs(d, exist_ok=True)

    def with_vars(self, **extra: str) -> dict[str, str]:
        """The child environment plus a few per-round variables (round number, step)."""
        env = dict(self.env)
        env.update(extra)
        return env

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "roles": list(self.roles),
            # the monitor's plumbing is build-host detail, not part of what the server needs
            "pinned": {k: v for k, v in sorted(self.pinned.items())
                       if k not in ("PYTHONPATH", MONITOR_LOG_ENV)},
            "invalidating_env_vars": dict(sorted(self.invalidating.items())),
        }


def invalidating_env_vars(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The cache-invalidating variables set in ``env`` (default: this process), as Triton sees
    them.  Triton only exposes the check for its own process environment, so for another env
    we swap it in for the duration of the call."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
    except ImportError:  # no triton here: nothing can be checked (the child may still differ)
        return {}
    if env is None or env is os.environ:
        return dict(get_cache_invalidating_env_vars())
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return dict(get_cache_invalidating_env_vars())
    finally:
        os.environ.clear()
        os.environ.update(saved)


def bake_env(
    root: os.PathLike | str = DEFAULT_ROOT,
    roles: tuple[str, ...] | list[str] = ALL_ROLES,
    *,
    monitor_log: os.PathLike | str | None = None,
    base_env: Mapping[str, str] | None = None,
    allow_invalidating: bool = False,
) -> BakeEnv:
    """The environment to bake (or serve, or verify) under.

    ``monitor_log``: where every process of the run appends its compile events (None: no
    monitor).  ``allow_invalidating``: set cache-invalidating variables are still recorded, but
    not warned about.
    """
    base = dict(os.environ if base_env is None else base_env)
    root_abs = os.path.abspath(os.fspath(root))
    roles = tuple(roles)
    # serving_env is what install hands the server: the bake must use exactly the same paths.
    pinned = dict(roles_mod.serving_env(root_abs, roles))
    # Autotune results are only written (and read back) with this on; it is read when the
    # @autotune decorator runs, so it must be in the environment before kernels are imported.
    pinned["TRITON_CACHE_AUTOTUNING"] = "1"
    if monitor_log is not None:
        pinned[MONITOR_LOG_ENV] = os.path.abspath(os.fspath(monitor_log))
        # Our sitecustomize goes first on PYTHONPATH; it chains to any other sitecustomize.
        old = base.get("PYTHONPATH", "")
        parts = [AUTOLOAD_DIR] + [p for p in old.split(os.pathsep) if p and p != AUTOLOAD_DIR]
        pinned["PYTHONPATH"] = os.pathsep.join(parts)
    env = {**base, **pinned}

    found = invalidating_env_vars(env)
    notes = []
    if found and not allow_invalidating:
        listed = ", ".join(f"{k}={v}" for k, v in sorted(found.items()))
        msg = (f"cache-invalidating variables are set ({listed}); every kernel key includes them, "
               "so the server must set them to the same values (recorded in the manifest)")
        notes.append(msg)
        warnings.warn(msg, InvalidatingEnvWarning, stacklevel=2)
    return BakeEnv(root=root_abs, roles=roles, pinned=pinned, env=env, invalidating=found,
                   warnings=notes)
