"""``serve-args``: from a bake's manifest, the ``vllm serve`` command and the environment that
match the bake (``serve_command``): the bake's serve args (cachebake.serveargs) turned back
into flags, each cache role where install put it (``roles.serving_env``), the cache-invalidating
variables the bake ran with, and the variables vLLM's torch.compile hashes need to come out as
the bake's (``serveargs.identity_serve_env``: the HOME/XDG-derived compile factors, the Hugging
Face cache of a hub id).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachebake import roles as roles_mod
from cachebake.errors import BadInput
from cachebake.serveargs import (BAKE_ONLY, IDENTITY_KEY, identity_serve_env, model_reference,
                                 serve_args_to_flags)


@dataclass
class ServeCommand:
    """What a server needs to start with exactly the configuration that was baked."""

    model_path: str
    flags: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        return ["vllm", "serve", self.model_path, *self.flags]

    def shell(self) -> str:
        lines = [f"# {n}" for n in self.notes]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        lines.append(" ".join(shlex.quote(a) for a in self.argv))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "argv": self.argv, "env": dict(sorted(self.env.items())),
                "notes": list(self.notes)}


def read_manifest(artifact: str, target: str | None = None) -> dict[str, Any]:
    """One bake's manifest as a dict: from an artifact (verified by the OCI reader), or from a
    manifest JSON file."""
    p = Path(artifact)
    if p.is_file() and p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise BadInput(f"{p}: not a readable manifest: {e}") from e
        if not isinstance(data, dict) or "bake" not in data:
            raise BadInput(f"{p}: not a bake manifest (no 'bake' section)")
        return data
    from cachebake.artifact.reader import open_source

    if not p.exists():
        raise BadInput(f"{p}: no such artifact")
    return open_source(str(p)).select(target).manifest.to_dict()


def _left_out(root: str) -> dict[str, str]:
    """Roles an install at ``root`` left out (install.json's ``left_out``): the server must
    not be pointed at them."""
    from cachebake.install.atomic import InstallDir

    return dict((InstallDir(root).installed() or {}).get("left_out") or {})


def serve_command(manifest: dict[str, Any], root: str | None = None) -> ServeCommand:
    """The ``vllm serve`` command and environment matching a bake, from its manifest dict.

    ``root``: where the artifact is (or will be) installed; the cache roles' variables point
    under it.  Without it, the root the bake used.  The bake section is either the vllm
    driver's own record (``bake_record``: model path and serve args) or the build's record of
    the driver (``model``, ``tp``, ``serve_args``, ``model_dir``), from which the rest is
    resolved the way the driver resolved it."""
    bake = manifest.get("bake") or {}
    if bake.get("driver") != "vllm":
        raise BadInput("this artifact was not baked with the vllm driver: it records no vLLM serve args")
    model = bake.get("model")
    notes: list[str] = []
    if isinstance(model, dict):
        path, serve_args = model.get("path"), bake.get("serve_args")
    else:
        path, serve_args = bake.get("model_dir"), None
        if not model:
            raise BadInput("this artifact's bake section records no model")
        from cachebake.serveargs import resolve  # as the driver resolved it

        recipe, serve_args, resolved_path = resolve(str(model), bake.get("tp"),
                                                    serve_args=bake.get("serve_args"),
                                                    model_dir=path)
        path = resolved_path
        if recipe.local_path is None:
            notes.append(f"serve args resolved from recipe {recipe.ref} as this cachebake knows it")
    if not path or serve_args is None:
        raise BadInput("this artifact's bake section records no model path / serve args")
    flags = serve_args_to_flags({k: v for k, v in serve_args.items() if k not in BAKE_ONLY})
    env_rec = bake.get("env") or {}
    roles = manifest.get("roles") or env_rec.get("roles") or bake.get("roles")
    env: dict[str, str] = {}
    base = root or env_rec.get("root")
    from cachebake.drivers.vllm_engine import SERVE_ENV_VARS

    # Only the variables the driver records there (the roles, SERVE_ENV_VARS): a manifest is
    # an artifact's word, and must not hand the server LD_PRELOAD or PYTHONPATH.
    allowed = {*roles_mod.ROLE_ENV.values(), *SERVE_ENV_VARS}
    baked_env = {k: str(v) for k, v in (bake.get("serve_env") or {}).items() if k in allowed}
    if base is not None:
        roles = list(roles or roles_mod.ROLE_ENV)
        left_out = _left_out(root) if root else {}
        for role, why in sorted(left_out.items()):
            notes.append(f"the {role} role was left out at install ({why}): not exported")
        env.update(roles_mod.serving_env(base, [r for r in roles if r not in left_out]))
        # the rest of what the bake ran with (e.g. VLLM_USE_V2_MODEL_RUNNER) holds anywhere
        env.update({k: v for k, v in baked_env.items() if k not in roles_mod.ROLE_ENV.values()})
    else:
        env.update(baked_env)
    # Cache-invalidating variables enter every kernel key: the server must set them identically.
    env.update((manifest.get("fingerprint") or {}).get("env") or {})
    env.update(env_rec.get("invalidating_env_vars") or {})
    env.update(bake.get("invalidating_env_vars") or {})
    # vLLM's torch.compile hashes: the factors that follow HOME/XDG, exactly as the bake had them
    env.update(identity_serve_env(bake))
    notes += identity_notes(bake, str(path), env)
    return ServeCommand(model_path=str(path), flags=flags, env=env, notes=notes)


def _shown(text: object, limit: int = 200) -> str:
    """A value from a manifest, fit for one line of a note (the notes become shell comments)."""
    s = "".join(c if c.isprintable() else "?" for c in str(text))
    return s if len(s) <= limit else s[:limit] + "..."


def identity_notes(bake: dict[str, Any], model: str, env: dict[str, str]) -> list[str]:
    """What the server must match that an environment variable cannot give it: the model
    string (it enters vLLM's config hash), and the compile factors the bake's environment set,
    which cachebake does not copy from an artifact into a server (a manifest is not trusted to
    set vLLM's knobs): ``cachebake verify --check-only`` names any that differ."""
    identity = bake.get(IDENTITY_KEY)
    if not isinstance(identity, dict):
        return []
    notes = []
    kind = model_reference(model)[0] if model else "path"
    resolved = (identity.get("model") or {}).get("resolved") if isinstance(identity.get("model"), dict) else None
    if kind == "hub":
        notes.append(f"pass the model exactly as {_shown(model)}: the string enters vLLM's "
                     "torch.compile config hash; offline, vLLM hashes its snapshot path "
                     f"{_shown(resolved)}: the server's Hugging Face cache must be at HF_HUB_CACHE "
                     "with that snapshot")
    else:
        notes.append(f"pass the model exactly as {_shown(model)}: the string enters vLLM's "
                     "torch.compile config hash")
    set_factors = identity.get("set_factors") if isinstance(identity.get("set_factors"), dict) else {}
    missing = [f"{_shown(k, 80)}={_shown(v, 120)}" for k, v in sorted(set_factors.items())
               if env.get(k) != v]
    if missing:
        notes.append("the bake ran with " + ", ".join(missing[:12])
                     + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
                     + " set: vLLM hashes them into its torch.compile cache key; set them the "
                     "same (cachebake does not copy them from an artifact)")
    return notes
