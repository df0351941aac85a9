"""``serve-args``: from a bake's manifest, the ``vllm serve`` command and the environment that
match the bake (``serve_command``): the bake's serve args (cachebake.vllm.serveargs) turned back
into flags, and the server's environment as the one function that builds it for every caller
gives it (cachebake.install.environment.server_env: each cache role where install put it, the
cache-invalidating variables the bake ran with, and the variables vLLM's torch.compile hashes
need to come out as the bake's).  The manifest is read once into its typed form
(``read_facts``: ``BakeFacts``) and passed on.

The manifest is hostile input (an artifact from a registry, a JSON file from anywhere), and its
text is meant for ``eval "$(cachebake serve-args ART)"``: so every environment key must be a
shell name (``ENV_NAME``, refused otherwise as install refuses a malformed document, exit 5,
naming the field), every value is a string ``shlex.quote`` quotes, and a note becomes a
comment only folded onto one line (``one_line``).  What ``eval`` runs is then exactly the
``export`` lines and the one ``vllm serve`` command.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachebake import roles as roles_mod
from cachebake.errors import BadInput, CorruptArtifact, InvalidDocument, shorten
# The rules on what an artifact may set in a server's environment live with the one function
# that builds it (cachebake.install.environment); ENV_NAME and check_env re-exported for readers.
from cachebake.install.environment import ENV_NAME, BakeFacts, ServerLayout, check_env, server_env  # noqa: F401
from cachebake.vllm.serveargs import (BAKE_ONLY, IDENTITY_KEY, carried_serve_args, model_reference,
                                      serve_args_to_flags)

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


def read_facts(artifact: str, target: str | None = None, document: str | None = None) -> BakeFacts:
    """What the server's environment takes from a bake (``BakeFacts``), read once: an artifact's
    manifest through the OCI reader (typed there), or a manifest JSON file (typed here)."""
    document = document or f"{artifact}: bake manifest"
    p = Path(artifact)
    if p.is_file() and p.suffix == ".json":
        return BakeFacts.from_document(read_manifest(artifact, target), document)
    from cachebake.artifact.reader import open_source

    if not p.exists():
        raise BadInput(f"{p}: no such artifact")
    return BakeFacts.from_manifest(open_source(str(p)).select(target).manifest, document)


def _left_out(root: str) -> dict[str, str]:
    """Roles an install at ``root`` left out (install.json's ``left_out``): the server must
    not be pointed at them.  install.json sits in a shared volume: InstallMarker checks that
    its roles are known ones and its reasons strings (they become comments, folded onto one
    line); a malformed one is InvalidDocument."""
    from cachebake.install.atomic import InstallDir

    marker = InstallDir(root).installed()
    return dict(marker.left_out) if marker else {}


def _kernels_bake(c, bake) -> str:
    """What ``serve-args`` can still say of a ``--driver kernels`` bake: it holds vLLM's
    Mamba2 kernels for one engine plan, and no engine record (model path, torch.compile), so
    no whole command; but the plan was computed for exact serve args, and a server started
    with them on that GPU hits those kernels.  The flags come from the artifact: one line,
    control characters escaped (``one_line``)."""
    plan = c.obj(bake.extra.get("plan") or {}, "bake.plan")
    args = carried_serve_args(c.obj(plan.get("serve_args") or {}, "bake.plan.serve_args"), c.document,
                              "bake.plan.serve_args")
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


def server_argv(facts: BakeFacts) -> tuple[str, list[str], list[str]]:
    """(model path, flags, notes) of the ``vllm serve`` command a ``--driver vllm`` bake records.

    The bake section is either the vllm driver's own record (``model`` an object: its path, and
    ``serve_args``) or the build's record of the driver (``model``, ``tp``, ``serve_args``,
    ``model_dir``), from which the rest is resolved the way the driver resolved it."""
    from cachebake.artifact.schema import Checker

    c = Checker(facts.document)
    bake = facts.bake
    if bake.driver == "kernels":
        raise BadInput(_kernels_bake(c, bake))
    if bake.driver != "vllm":
        raise BadInput("this artifact was not baked with the vllm driver: it records no vLLM serve args")
    notes: list[str] = []
    if isinstance(bake.model, dict):
        path = c.opt_str(bake.model.get("path"), "bake.model.path")
        serve_args = bake.serve_args
    else:
        if not bake.model:
            raise BadInput("this artifact's bake section records no model")
        from cachebake.vllm.serveargs import resolve  # as the driver resolved it

        recipe, serve_args, path = resolve(bake.model, bake.tp, serve_args=carried_serve_args(
                                               bake.serve_args, c.document, "bake.serve_args"),
                                           model_dir=bake.model_dir)
        if recipe.local_path is None:
            notes.append(f"serve args resolved from recipe {recipe.ref} as this cachebake knows it")
    if not path or serve_args is None:
        raise BadInput("this artifact's bake section records no model path / serve args")
    # the artifact's args become the server's command: only those on the one allowlist
    serve_args = carried_serve_args(serve_args, c.document, "bake.serve_args")
    if _has_control(path):  # the server's first argument, and a line of k8s' command
        c.fail("bake.model.path", "must be one line without control characters")
    return path, serve_args_to_flags({k: v for k, v in serve_args.items() if k not in BAKE_ONLY}), notes


def serve_command(facts: BakeFacts | dict, root: str | None = None,
                  document: str = "bake manifest", overlay: str | None = None) -> ServeCommand:
    """The ``vllm serve`` command and environment matching a bake.

    ``facts``: the bake as ``read_facts`` gives it (a manifest dict is typed once, here).
    ``root``: where the artifact is (or will be) installed; the cache roles' variables point
    under it (less the roles an install there left out).  ``overlay``: the layered cache
    manager's writable dir (``roles.serving_overlay_env`` checks it).  Without ``root``, the layer
    root when it is the default serving root (``BakeFacts.recorded_root``; another is refused:
    give ``root``); a manifest that records none gets no role variables, and a note says so
    (they are never taken from the artifact's own record).  The environment is ``server_env``'s."""
    if not isinstance(facts, BakeFacts):
        facts = BakeFacts.from_document(facts, document)
    path, flags, notes = server_argv(facts)
    base = root or facts.recorded_root()
    roles = list(facts.recorded_roles() or roles_mod.ROLE_ENV)
    if base is None:
        roles = []
        notes.append("the bake records no root: no cache role is exported; give --root DIR "
                     "(where the artifact is installed)")
    left_out = _left_out(root) if root else {}
    for role, why in sorted(left_out.items()):
        notes.append(f"the {role} role was left out at install ({why}): not exported")
    kept = [r for r in roles if r not in left_out]
    if overlay is not None:  # checked: absolute, outside the tree, and a triton role to layer
        overlay = roles_mod.serving_overlay_env(overlay, base, kept)[roles_mod.OVERLAY_ENV]
    env = server_env(facts, ServerLayout.installed(base or "/", kept, overlay))
    notes += env.notes
    notes += identity_notes(facts.bake.to_json(), path, env.as_dict())
    return ServeCommand(model_path=path, flags=flags, env=env.as_dict(), notes=notes)


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
