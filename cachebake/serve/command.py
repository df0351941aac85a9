"""``serve-args``: from a bake's manifest, the ``vllm serve`` command and the environment that
match the bake (``serve_command``): the bake's serve args (cachebake.vllm.serveargs) turned back
into flags, each cache role where install put it (``roles.serving_env``), the cache-invalidating
variables the bake ran with, and the variables vLLM's torch.compile hashes need to come out as
the bake's (``serveargs.identity_serve_env``: the HOME/XDG-derived compile factors, the Hugging
Face cache of a hub id).

The manifest is hostile input (an artifact from a registry, a JSON file from anywhere), and its
text is meant for ``eval "$(cachebake serve-args ART)"``: so every environment key must be a
shell name (``ENV_NAME``, refused otherwise as install refuses a malformed document, exit 5,
naming the field), every value is a string ``shlex.quote`` quotes, and a note becomes a
comment only folded onto one line (``one_line``).  What ``eval`` runs is then exactly the
``export`` lines and the one ``vllm serve`` command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachebake import roles as roles_mod
from cachebake.errors import BadInput, CorruptArtifact, InvalidDocument
from cachebake.errors import shorten
from cachebake.vllm.serveargs import (BAKE_ONLY, IDENTITY_KEY, identity_serve_env, model_reference,
                                 serve_args_to_flags)

# POSIX's portable environment variable names (and what every shell's `export` takes)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters that end or disturb a line in the text other programs read: C0 and C1 controls,
# DEL, and the line breaks YAML 1.1 (PyYAML) and Unicode know beyond \n and \r.
_BREAKS = {c: ascii(chr(c))[1:-1] for c in [*range(0x00, 0x20), 0x7f, *range(0x80, 0xa0), 0x2028, 0x2029]}


def _has_control(text: str) -> bool:
    return any(ord(ch) < 32 or 0x7f <= ord(ch) < 0xa0 or ord(ch) in (0x2028, 0x2029) for ch in text)


def one_line(text) -> str:
    """``text`` as one line with no control characters: each is written as its escape
    (``\\n``, ``\\x1b``), so a comment made of it cannot end early in a shell script or a YAML
    stream (nor make PyYAML refuse the stream), and the reader still sees what was there."""
    return str(text).translate(_BREAKS)


def comment(text) -> str:
    """A ``# ...`` comment line for shell or YAML, from any text (``one_line``)."""
    return f"# {one_line(text)}"


# What an artifact may set in the server's environment.  The bake records what it ran with
# (vLLM's switches such as VLLM_USE_V2_MODEL_RUNNER; Triton's cache-invalidating variables, which
# enter every kernel key), and serve-args hands that on; but a manifest is hostile, and some
# variables make a process load code or run a program of the writer's choosing (LD_PRELOAD,
# PYTHONPATH, TRITON_CACHE_MANAGER names a class to import, TRITON_PTXAS_PATH a binary, CC a
# compiler).  So only these families pass, and within them no name that points at something to
# load or run.
SERVER_ENV_PREFIXES = ("VLLM_", "TRITON_", "TORCHINDUCTOR_", "FLASHINFER_", "HF_")
# Triton 3.6's cache-invalidating variables (triton/knobs.py env names) beside TRITON_*
INVALIDATING_PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "NVPTX_", "AMDGCN_")
INVALIDATING_NAMES = ("DISABLE_PTXAS_OPT", "PTXAS_OPTIONS", "USE_IR_LOC")
# Within the families, refused by the shape of the name: what points at something to load or run
# (a path, a dir, a class, a plugin, a library), a place files are read from or written to (a
# home or root: TRITON_HOME moves Triton's override and dump dirs, HF_HOME the model cache), and
# a service or credential (an endpoint, host, port, token, key: HF_ENDPOINT sends HF_TOKEN where
# it points, VLLM_API_KEY sets the server's key)...
_LOADS_SOMETHING = re.compile(r"(?:_PATHS?|_DIR|_MANAGER|_BACKEND|_PLUGINS?|_LIBS?|_FILE|PRELOAD"
                              r"|_HOME|_ROOT|_ENDPOINT|_URL|_HOST|_IP|_PORT|_TOKEN|_KEY)\Z")
# ... and by name, the knobs that swap or bypass what the bake made, or open the server:
# Triton 3.6's kernel override and dump (knobs.py: IR loaded from / written to TRITON_HOME's
# dirs), compiling always, the interpreter, the remote cache, instrumentation; vLLM's pickle
# deserialization, dev endpoints, LoRA loading at runtime and ModelScope downloads (envs.py).
_SWAPS_OR_OPENS = frozenset({
    "TRITON_KERNEL_OVERRIDE", "TRITON_KERNEL_DUMP", "TRITON_ALWAYS_COMPILE", "TRITON_INTERPRET",
    "TRITON_REDIS_KEY_FORMAT", "TRITON_INSTRUMENTATION_MODE",
    "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "VLLM_USE_MODELSCOPE",
})


def check_env(env: dict, document: str, field: str,
              allowed: tuple[tuple[str, ...], tuple[str, ...]] | None = None) -> dict[str, str]:
    """``env`` as a server environment: names ``ENV_NAME``, values strings without NUL (which
    no environment can hold); anything else is refused as a malformed document (exit 5).
    ``allowed``: (prefixes, names) a key must match, and then name nothing to load or run."""
    if not isinstance(env, dict):
        raise InvalidDocument(document, field, "must be an object of environment variables")
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise InvalidDocument(document, f"{field}[{ascii(key)}]",
                                  "is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if allowed is not None and not (key.startswith(allowed[0]) or key in allowed[1]) or (
                allowed is not None and key not in allowed[1]
                and (_LOADS_SOMETHING.search(key) or key in _SWAPS_OR_OPENS)):
            raise InvalidDocument(document, f"{field}.{key}",
                                  "is not a variable an artifact may set in the server (it names "
                                  "code, a place or a service, swaps what the bake made, or is outside "
                                  f"{', '.join(p + '*' for p in allowed[0])})")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidDocument(document, f"{field}.{key}", "must be a string without NUL")
    return env


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
        """Shell text for ``eval``: comments, ``export NAME=VALUE`` lines, the command.  Names
        are checked again here (the env may have been extended since it was read)."""
        try:
            check_env(self.env, "serve environment", "env")
        except InvalidDocument as e:
            raise CorruptArtifact(str(e)) from None
        lines = [comment(n) for n in self.notes]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        lines.append(shlex.join(self.argv))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "argv": self.argv, "env": dict(sorted(self.env.items())),
                "notes": list(self.notes)}


def read_manifest(artifact: str, target: str | None = None) -> dict[str, Any]:
    """One bake's manifest as a dict: from an artifact (verified by the OCI reader), or from a
    manifest JSON file."""
    p = Path(artifact)
    if p.is_file() and p.suffix == ".json":
        # the strict reader every artifact document goes through: bounded, a regular file,
        # strict JSON (no duplicate keys, no NaN, bounded nesting)
        from cachebake.artifact.schema import CAP_CONFIG
        from cachebake.jsonio import load_document

        data = load_document(p, str(p), CAP_CONFIG)
        if not isinstance(data, dict) or "bake" not in data:
            raise BadInput(f"{p}: not a bake manifest (no 'bake' section)")
        return data
    from cachebake.artifact.reader import open_source

    if not p.exists():
        raise BadInput(f"{p}: no such artifact")
    return open_source(str(p)).select(target).manifest.to_dict()


def _left_out(root: str) -> dict[str, str]:
    """Roles an install at ``root`` left out (install.json's ``left_out``): the server must
    not be pointed at them.  install.json sits in a shared volume: InstallMarker checks that
    its roles are known ones and its reasons strings (they become comments, folded onto one
    line); a malformed one is InvalidDocument."""
    from cachebake.install.atomic import InstallDir

    marker = InstallDir(root).installed()
    return dict(marker.left_out) if marker else {}


def _roles(value, c, field: str) -> list[str] | None:
    if value is None:
        return None
    from cachebake.artifact.schema import check_roles

    return check_roles(value, c, field)


def _kernels_bake(c, bake: dict) -> str:
    """What ``serve-args`` can still say of a ``--driver kernels`` bake: it holds vLLM's
    Mamba2 kernels for one engine plan, and no engine record (model path, torch.compile), so
    no whole command; but the plan was computed for exact serve args, and a server started
    with them on that GPU hits those kernels.  The flags come from the artifact: one line,
    control characters escaped (``one_line``)."""
    plan = c.obj(bake.get("plan") or {}, "bake.plan")
    args = c.obj(plan.get("serve_args") or {}, "bake.plan.serve_args")
    target = c.obj(plan.get("target") or {}, "bake.plan.target")
    gpu = c.opt_str(target.get("gpu_name"), "bake.plan.target.gpu_name")
    flags = serve_args_to_flags({k: v for k, v in args.items() if k not in BAKE_ONLY})
    if not flags:
        return ("this is a --driver kernels bake (vLLM's Mamba2 kernels only) and records no "
                "serve args: serve-args prints a whole command for a --driver vllm bake")
    return one_line(f"this is a --driver kernels bake (vLLM's Mamba2 kernels only, no engine "
                    f"record, so no whole command): its engine plan was computed for "
                    f"`vllm serve MODEL {shlex.join(flags)}`" + (f" on {gpu}" if gpu else "")
                    + "; serve with exactly these flags and the environment `cachebake install` "
                    "prints for the kernels to hit; a --driver vllm bake gives the whole command")


def serve_command(manifest: dict[str, Any], root: str | None = None,
                  document: str = "bake manifest") -> ServeCommand:
    """The ``vllm serve`` command and environment matching a bake, from its manifest dict.

    ``root``: where the artifact is (or will be) installed; the cache roles' variables point
    under it.  Without it, the root the bake used.  The bake section is either the vllm
    driver's own record (``bake_record``: model path and serve args) or the build's record of
    the driver (``model``, ``tp``, ``serve_args``, ``model_dir``), from which the rest is
    resolved the way the driver resolved it.  Every field read is type-checked first
    (InvalidDocument, exit 5, naming ``document`` and the field)."""
    from cachebake.artifact.schema import Checker

    c = Checker(document)
    bake = c.obj(manifest.get("bake") or {}, "bake")
    if bake.get("driver") == "kernels":
        raise BadInput(_kernels_bake(c, bake))
    if bake.get("driver") != "vllm":
        raise BadInput("this artifact was not baked with the vllm driver: it records no vLLM serve args")
    model = bake.get("model")
    notes: list[str] = []
    if isinstance(model, dict):
        path = c.opt_str(model.get("path"), "bake.model.path")
        serve_args = bake.get("serve_args")
        if serve_args is not None:
            c.obj(serve_args, "bake.serve_args")
    else:
        path = c.opt_str(bake.get("model_dir"), "bake.model_dir")
        if not model:
            raise BadInput("this artifact's bake section records no model")
        c.string(model, "bake.model")
        tp = c.opt_int(bake.get("tp"), "bake.tp", lo=1, hi=1 << 16)
        recorded = bake.get("serve_args")
        if recorded is not None and not isinstance(recorded, (dict, str)):
            c.fail("bake.serve_args", "must be an object or vllm serve flags")
        from cachebake.vllm.serveargs import resolve  # as the driver resolved it

        recipe, serve_args, resolved_path = resolve(model, tp, serve_args=recorded, model_dir=path)
        path = resolved_path
        if recipe.local_path is None:
            notes.append(f"serve args resolved from recipe {recipe.ref} as this cachebake knows it")
    if not path or serve_args is None:
        raise BadInput("this artifact's bake section records no model path / serve args")
    if _has_control(path):  # the server's first argument, and a line of k8s' command
        c.fail("bake.model.path", "must be one line without control characters")
    flags = serve_args_to_flags({k: v for k, v in serve_args.items() if k not in BAKE_ONLY})
    env_rec = c.obj(bake.get("env") or {}, "bake.env")
    roles = (_roles(manifest.get("roles"), c, "roles") or _roles(env_rec.get("roles"), c, "bake.env.roles")
             or _roles(bake.get("roles"), c, "bake.roles"))
    env: dict[str, str] = {}
    base = root or c.opt_str(env_rec.get("root"), "bake.env.root")
    if base is not None and not base.startswith("/"):
        c.fail("bake.env.root", "must be an absolute path")
    if root is None and base is not None and _has_control(base):
        # every role's variable is made of it: one line, as the user's --root must be for k8s
        c.fail("bake.env.root", "must be an absolute path without control characters")
    # the roles' own variables: where the bake had them (replaced below by the install's)
    baked_env = check_env(bake.get("serve_env") or {}, document, "bake.serve_env",
                          (SERVER_ENV_PREFIXES, tuple(roles_mod.ROLE_ENV.values())))
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
    fingerprint = c.obj(manifest.get("fingerprint") or {}, "fingerprint")
    invalidating = (INVALIDATING_PREFIXES, INVALIDATING_NAMES)
    env.update(check_env(fingerprint.get("env") or {}, document, "fingerprint.env", invalidating))
    env.update(check_env(env_rec.get("invalidating_env_vars") or {}, document,
                         "bake.env.invalidating_env_vars", invalidating))
    env.update(check_env(bake.get("invalidating_env_vars") or {}, document,
                         "bake.invalidating_env_vars", invalidating))
    # vLLM's torch.compile hashes: the factors that follow HOME/XDG, exactly as the bake had them
    env.update(identity_serve_env(bake))
    notes += identity_notes(bake, path, env)
    return ServeCommand(model_path=path, flags=flags, env=env, notes=notes)


def _shown(text: object, limit: int = 200) -> str:
    """A value from a manifest, fit for one line of a note (``one_line``), and short."""
    return shorten(one_line(text), limit, keep=limit)


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
