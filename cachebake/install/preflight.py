"""Preflight: would this bake hit in the environment the server runs in?

Compares the fingerprint stored in the artifact with the serving environment's: read from a
file that ``cachebake fingerprint`` wrote into the serving image at build time (an init
container is often not the serving image), or else from this process.  Each difference is one
line saying what differs, both values, and what it costs.  Nothing is written before this
passes.
"""

from __future__ import annotations

from cachebake.artifact.fingerprint import (Fingerprint, compare_fingerprints, compare_vllm_env,
                                            current_fingerprint)
from cachebake.errors import PreflightMismatch


def load_serving_fingerprint(fingerprint_file: str | None, target: str | None) -> Fingerprint:
    """The fingerprint to check against: ``fingerprint_file`` if given (the user's file: exit 3
    when it is unreadable or malformed), else this process (which imports Triton; with a file,
    an init container needs no Triton at all)."""
    if fingerprint_file is None:
        return current_fingerprint(target)
    return Fingerprint.read(fingerprint_file)


def hashed_vllm_variables(bake: dict) -> dict[str, object]:
    """The VLLM_* variables the bake's vLLM hashed into its torch.compile key: the compile
    identity's env factors (cachebake.vllm.identity), as recorded in the manifest."""
    from cachebake.vllm.serveargs import IDENTITY_KEY

    identity = bake.get(IDENTITY_KEY) if isinstance(bake, dict) else None
    factors = identity.get("env_factors") if isinstance(identity, dict) else None
    return {k: v for k, v in factors.items() if isinstance(k, str)} if isinstance(factors, dict) else {}


def as_rounds_ran(baked: Fingerprint, bake: dict) -> Fingerprint:
    """The bake's fingerprint with its VLLM_* variables as the rounds ran with them.  The
    fingerprint holds the bake process's; the vllm driver turns vLLM's startup plan on in its
    rounds (vllm/engine.py: VLLM_ENABLE_STARTUP_PLAN=1 unless the bake env set it), as its
    record says (``startup_plan.enabled``), and serve-args exports it for the server: without
    this, every install of such a bake warned that the server's 1 differs from the bake's unset."""
    import dataclasses

    from cachebake.vllm.versions import STARTUP_PLAN_ENV

    plan = bake.get("startup_plan") if isinstance(bake, dict) else None
    if (baked.vllm_env is None or STARTUP_PLAN_ENV in baked.vllm_env
            or not (isinstance(plan, dict) and plan.get("enabled") is True)):
        return baked
    return dataclasses.replace(baked, vllm_env={**baked.vllm_env, STARTUP_PLAN_ENV: "1"})


def check(baked: Fingerprint, serving: Fingerprint, allow_mismatch: bool,
          checked_this_process: bool = False, hashed: dict[str, object] | None = None) -> list[str]:
    """Return the difference lines (warnings) or raise PreflightMismatch.  A VLLM_* variable
    set otherwise than at bake is a warning line, and a refusal where vLLM hashes it
    (``hashed``: ``hashed_vllm_variables``)."""
    refuse, route = compare_vllm_env(baked, serving, hashed)
    lines = [str(m) for m in [*compare_fingerprints(baked, serving), *refuse]]
    if lines and not allow_mismatch:
        raise PreflightMismatch(
            f"bake for {baked.target} was made for another environment "
            f"({len(lines)} difference{'s' * (len(lines) > 1)}); nothing installed "
            "(--allow-mismatch installs anyway):\n" + "\n".join(f"  {line}" for line in lines)
            + ("\n(checked against this process; if the server runs another image, pass "
               "--fingerprint FILE from `cachebake fingerprint` run in it)" if checked_this_process else ""))
    return lines + [str(m) for m in route]
