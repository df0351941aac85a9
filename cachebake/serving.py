"""The serving side of a bake: the serve args a server starts with, and its environment.

A bake only hits when the server runs with the same serving arguments (every argument that
shapes a kernel: TP size, dtype, max_num_seqs, max_num_batched_tokens, block size, prefix
caching, mamba cache dtypes, speculative decoding, compilation config) and finds each cache
role where the bake put it.  This module is the one home of both halves, on top of
``cachebake.roles``:

- the serve-args dialect: one plain dict of ``EngineArgs`` field names, parsed from JSON or
  ``vllm serve`` flags (``parse_serve_args``), checked (``validate_serve_args`` refuses
  ``enforce_eager``: it turns off vLLM's JIT warmup and CUDA graph capture, so a bake with it
  misses most of what the server compiles at startup), and turned back into the exact flags
  (``serve_args_to_flags``);
- ``serve_command``: from a bake's manifest, the ``vllm serve`` command and the environment
  (``roles.serving_env`` plus the cache-invalidating variables) that match the bake.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachebake import roles as roles_mod
from cachebake.errors import BadInput

# Set by the driver, never by serve args: the bake needs them, the server must not copy them.
DRIVER_OWNED = ("model", "load_format", "skip_tokenizer_init")
# Bake-only settings the driver adds; `serve-args` leaves them out of the server's command.
BAKE_ONLY = {"load_format": "dummy", "skip_tokenizer_init": True}


def validate_serve_args(serve_args: dict[str, Any]) -> dict[str, Any]:
    """Refuse serve args a bake cannot honestly run with; return them unchanged otherwise."""
    if not isinstance(serve_args, dict):
        raise BadInput(f"serve args must be a mapping of vLLM engine arguments, not {type(serve_args).__name__}")
    if serve_args.get("enforce_eager"):
        raise BadInput("refusing enforce_eager: it disables vLLM's JIT warmup and CUDA graph capture, "
                       "so the bake would miss what the server compiles at startup; remove it "
                       "(and serve without it)")
    owned = [k for k in DRIVER_OWNED if k in serve_args]
    if owned:
        raise BadInput(f"serve args must not set {', '.join(owned)}: the vllm driver sets them "
                       "(the model comes from --model, weights are dummy, no tokenizer is loaded)")
    bad = [k for k in serve_args if not isinstance(k, str) or not k.replace("_", "").isalnum()]
    if bad:
        raise BadInput(f"serve args have keys that are no engine argument names: {bad}")
    return serve_args


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def serve_args_to_flags(serve_args: dict[str, Any]) -> list[str]:
    """The ``vllm serve`` flags for ``serve_args`` (EngineArgs names), in the dict's order.

    True -> ``--x``; False -> ``--no-x`` (vLLM's boolean engine args accept both); None is left
    out (vLLM's default); dicts (speculative_config, compilation_config...) -> compact JSON;
    lists -> one value per item."""
    out: list[str] = []
    for key, value in serve_args.items():
        if value is None:
            continue
        if value is True:
            out.append(_flag(key))
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            out += [_flag(key), json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            out += [_flag(key), *(str(v) for v in value)]
        else:
            out += [_flag(key), str(value)]
    return out


def _scalar(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def parse_serve_args(text: str) -> dict[str, Any]:
    """``--serve-args`` text: a JSON object, or ``vllm serve``-style flags
    (``--max-num-seqs 64 --enable-prefix-caching --no-enforce-eager``)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise BadInput(f"--serve-args is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise BadInput("--serve-args JSON must be an object")
        return data
    words = shlex.split(text)
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            raise BadInput(f"--serve-args: expected a --flag, got {w!r} (a model path does not go here)")
        name, eq, val = w[2:].partition("=")
        key = name.replace("-", "_")
        values: list[str] = [val] if eq else []
        if not eq:
            while i + 1 < len(words) and not words[i + 1].startswith("--"):
                values.append(words[i + 1])
                i += 1
        if not values:
            if key.startswith("no_"):
                out[key[3:]] = False
            else:
                out[key] = True
        elif len(values) == 1:
            out[key] = _scalar(values[0])
        else:
            out[key] = [_scalar(v) for v in values]
        i += 1
    return out


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
    from cachebake.install.source import open_source

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
        from cachebake.drivers.vllm_args import resolve  # as the driver resolved it

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
    baked_env = bake.get("serve_env") or {}
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
    return ServeCommand(model_path=str(path), flags=flags, env=env, notes=notes)
