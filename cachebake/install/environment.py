"""The server's environment: the one function that says what a server must be started with for
a bake (``server_env``), called by ``install``, ``serve-args`` (and its ``--env-file``, which
the installer entrypoint writes), ``k8s`` and checked against the Dockerfile's serving stage.

Two inputs, kept apart because they are trusted differently:

- ``BakeFacts``: what the bake recorded, read once from its manifest into typed form
  (``BakeRecord``, the fingerprint's environment, the roles, the root).  It comes from an
  artifact, so it is hostile;
- ``ServerLayout``: where *this* server finds each role, its overlay and the writable dirs for
  what it writes at start.  The caller (install's ``--to``/``--serve-at``, serve-args'
  ``--root``, the Pod k8s writes) decides it, never the artifact.

Every variable of the result carries its origin (``EnvVar.origin``).  The layout's variables
(a role's dir, the overlay's, the writable scratch dirs) come only from the layout; an artifact
reaches the environment by three routes, each with its own allowlist, and the same refusals
applied to all three here, so no route can bypass them:

- the bake's ``serve_env`` (what the vllm driver ran with beside the roles): only
  ``SERVE_ENV_NAMES``; the roles' own variables it also records are ignored (the layout's win);
- the cache-invalidating variables (fingerprint and bake records): Triton's families
  (``INVALIDATING_PREFIXES``/``_NAMES``), every kernel key holds them;
- the compile identity (``cachebake.vllm.serveargs.identity_serve_env``): only
  ``IDENTITY_NAMES``, the HOME/XDG-derived compile factors of vLLM 0.24 and a hub id's cache.

Refused on every route (exit 5, naming the field): a name that is no shell variable name, a
role's variable or one the layout sets, one that names something to load or run, a place, a
service or a credential (``_LOADS_SOMETHING``, outside the route's explicit names), one that
swaps what the bake made or opens the server (``_SWAPS_OR_OPENS``), and a value with NUL.

Why install/ and not serve/: install calls it, and install comes before serve in the data flow
(tests/test_layers.py); serve-args, k8s and the Dockerfile's test come after and import it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cachebake.errors import BadInput, InvalidDocument
from cachebake.roles import MANAGER_ENV, MISS_LOG_ENV, OVERLAY_ENV, ROLE_ENV, overlay_env, role_dir, role_env
from cachebake.vllm.engine import SERVE_ENV_VARS

# POSIX's portable environment variable names (and what every shell's `export` takes)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Origins: where each variable of a server's environment comes from.
ROLE = "role"  # a cache role's dir, from the layout
OVERLAY = "overlay"  # the layered cache manager's writable overlay, from the layout
SCRATCH = "writable scratch"  # a writable dir for what the server writes at start, from the layout
SERVE_ENV = "bake serve_env"  # what the bake ran with beside the roles (the artifact)
INVALIDATING = "cache-invalidating"  # enters every Triton kernel key (the artifact)
IDENTITY = "compile identity"  # makes vLLM compute the bake's torch.compile hashes (the artifact)
FROM_ARTIFACT = (SERVE_ENV, INVALIDATING, IDENTITY)

# Route 1: the vllm driver's serve_env holds the roles' variables and these
# (cachebake.vllm.engine.SERVE_ENV_VARS, which records them): nothing else passes.
# One home: the list the driver records from is the list that passes (the startup plan's switch,
# added for vLLM 0.34, was refused here on the H200 while the driver recorded it).
SERVE_ENV_NAMES = SERVE_ENV_VARS
# Route 2: Triton 3.6's cache-invalidating variables (triton/knobs.py env names)
INVALIDATING_PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "NVPTX_", "AMDGCN_")
INVALIDATING_NAMES = ("DISABLE_PTXAS_OPT", "PTXAS_OPTIONS", "USE_IR_LOC")
# Route 3: the compile identity: the factors vLLM 0.24 hashes and derives from HOME/XDG
# (envs.py: VLLM_CONFIG_ROOT, VLLM_XLA_CACHE_PATH; 0.33 and 0.34 hash neither), and the
# Hugging Face cache an offline hub id resolves in.
IDENTITY_NAMES = ("VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH", "HF_HUB_CACHE", "HF_HUB_OFFLINE")

# Within the routes, refused by the shape of the name: what points at something to load or run
# (a path, a dir, a class, a plugin, a library), a place files are read from or written to (a
# home or root: TRITON_HOME moves Triton's override and dump dirs, HF_HOME the model cache), and
# a service or credential (an endpoint, host, port, token, key)...
_LOADS_SOMETHING = re.compile(r"(?:_PATHS?|_DIR|_MANAGER|_BACKEND|_PLUGINS?|_LIBS?|_FILE|PRELOAD"
                              r"|_HOME|_ROOT|_BASE|_ENDPOINT|_URL|_HOST|_IP|_PORT|_TOKEN|_KEY)\Z")
# ... and by name, the knobs that swap or bypass what the bake made, or open the server:
# Triton 3.6's kernel override and dump, compiling always, the interpreter, the remote cache,
# instrumentation; vLLM's pickle deserialization, dev endpoints, runtime LoRA, ModelScope.
_SWAPS_OR_OPENS = frozenset({
    "TRITON_KERNEL_OVERRIDE", "TRITON_KERNEL_DUMP", "TRITON_ALWAYS_COMPILE", "TRITON_INTERPRET",
    "TRITON_REDIS_KEY_FORMAT", "TRITON_INSTRUMENTATION_MODE",
    "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "VLLM_USE_MODELSCOPE",
})
# What only the layout sets: the roles', the overlay's, and where the server writes.
LAYOUT_NAMES = frozenset({*ROLE_ENV.values(), MANAGER_ENV, OVERLAY_ENV, MISS_LOG_ENV, "HOME", "TMPDIR",
                          "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "PYTHONPATH"})

# What the server, its libraries, or vLLM write at import or at start, by the variable that
# places it (/work/notes/vllm034.md section 4; shared/FACTS.md): each must be a writable dir.
# torch's _dynamo/package.py makes TORCHINDUCTOR_CACHE_DIR at import (a read-only one: EROFS
# before the server logs a line, issue 30); vLLM writes VLLM_CACHE_ROOT at every start (its
# mega-AOT load makes dummy_cache there); FlashInfer JITs under FLASHINFER_WORKSPACE_BASE; the
# layered manager makes its overlay; HOME's ~/.cache and ~/.triton are the libraries' defaults.
WRITTEN_AT_START = ("TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE",
                    OVERLAY_ENV, "HOME", "TMPDIR")


def _has_control(text: str) -> bool:
    return any(ord(ch) < 32 or 0x7f <= ord(ch) < 0xa0 or ord(ch) in (0x2028, 0x2029) for ch in text)


REFUSED = "is not a variable an artifact may set in the server"


def _route_refusal(name: str, explicit: tuple[str, ...]) -> str | None:
    """Why an artifact may not set ``name`` on a route whose explicit names are ``explicit``."""
    if name in LAYOUT_NAMES:
        return "it is set by where the server finds its caches (install, serve-args --root, the Pod)"
    if name in _SWAPS_OR_OPENS:
        return "it swaps what the bake made or opens the server"
    if name not in explicit and _LOADS_SOMETHING.search(name):
        return "it names code, a place or a service"
    return None


def check_env(env, document: str, field_name: str,
              allowed: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
              skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """``env`` as a server environment: names ``ENV_NAME``, values strings without NUL (which
    no environment can hold); anything else is refused as a malformed document (exit 5).
    ``allowed``: (prefixes, names) a key must match, and then pass ``_route_refusal``.
    ``skip``: names left out silently (a role's variable the bake recorded beside the rest)."""
    if not isinstance(env, Mapping):
        raise InvalidDocument(document, field_name, "must be an object of environment variables")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise InvalidDocument(document, f"{field_name}[{ascii(key)}]",
                                  "is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidDocument(document, f"{field_name}.{key}", "must be a string without NUL")
        if key in skip:
            continue
        if allowed is not None:
            prefixes, names = allowed
            if not (key.startswith(prefixes) if prefixes else False) and key not in names:
                listed = [*(p + "*" for p in prefixes), *names]
                raise InvalidDocument(document, f"{field_name}.{key}",
                                      f"{REFUSED} (this record may hold only "
                                      f"{', '.join(listed[:8])}{' ...' if len(listed) > 8 else ''})")
            why = _route_refusal(key, names)
            if why:
                raise InvalidDocument(document, f"{field_name}.{key}", f"{REFUSED}: {why}")
        out[key] = value
    return out


@dataclass(frozen=True)
class BakeFacts:
    """What a server's environment takes from a bake, read once from its manifest: the bake
    record (typed, ``BakeRecord``), the fingerprint's cache-invalidating variables, the roles
    and the root the bake was made at.  ``document`` names it in every refusal."""

    bake: object  # cachebake.artifact.manifest.BakeRecord
    fingerprint_env: Mapping[str, str] = field(default_factory=dict)
    roles: tuple[str, ...] | None = None
    layer_root: str | None = None
    document: str = "bake manifest"

    @classmethod
    def from_manifest(cls, manifest, document: str = "bake manifest") -> "BakeFacts":
        """From a ``BakeManifest`` (already schema-checked by its reader)."""
        return cls(manifest.bake, dict(manifest.fingerprint.env), tuple(manifest.roles),
                   manifest.layer_root, document)

    @classmethod
    def from_document(cls, doc, document: str = "bake manifest") -> "BakeFacts":
        """From a manifest document that may hold only some of a manifest's sections (a
        ``serve-args FILE.json``): each section there is typed and checked as the reader checks
        it (InvalidDocument naming ``document`` and the field)."""
        from cachebake.artifact import schema
        from cachebake.artifact.manifest import BakeRecord

        c = schema.Checker(document)
        c.obj(doc)
        bake = BakeRecord.from_json(doc.get("bake") or {}, document, "bake")
        fp = c.obj(doc.get("fingerprint") or {}, "fingerprint")
        fp_env = fp.get("env") or {}
        check_env(fp_env, document, "fingerprint.env")
        roles = schema.check_roles(doc["roles"], c) if doc.get("roles") is not None else None
        root = c.opt_str(doc.get("layer_root"), "layer_root")
        return cls(bake, dict(fp_env), tuple(roles) if roles else None, root, document)

    def recorded_roles(self) -> tuple[str, ...] | None:
        """The roles the bake holds: the manifest's, else the bake record's (older bakes)."""
        from cachebake.artifact.schema import Checker, check_roles

        if self.roles:
            return self.roles
        c = Checker(self.document)
        env = self.bake.env or {}
        for value, where in ((env.get("roles"), "bake.env.roles"), (self.bake.extra.get("roles"), "bake.roles")):
            if value is not None:
                return tuple(check_roles(value, c, where))
        return None

    def recorded_root(self) -> str | None:
        """The root a server finds the bake's roles under when the caller names none
        (``serve-args`` without ``--root``): the layer root, what the layer's paths were
        written relative to (install at any other root rewrites them); for a manifest document
        that records none, the root its bake ran at (``bake.env.root``).  Used only where it is
        the default serving root (``roles.DEFAULT_ROOT``: /var/cache/cachebake, or this
        process's $CACHEBAKE_ROOT), so an artifact cannot point the roles' variables at a place
        of its choosing: another is refused (BadInput: give ``--root``); None where neither is
        recorded.  Both are checked when present (a malformed field is a malformed document)."""
        from cachebake.roles import DEFAULT_ROOT

        env_root = (self.bake.env or {}).get("root")
        for value, where in ((env_root, "bake.env.root"), (self.layer_root, "layer_root")):
            if value is not None and (not isinstance(value, str) or not value.startswith("/")
                                      or _has_control(value) or ".." in value.split("/")):
                raise InvalidDocument(self.document, where,
                                      "must be an absolute path without control characters or '..'")
        root = self.layer_root if self.layer_root is not None else env_root
        if root is None:
            return None
        if root.rstrip("/") != str(DEFAULT_ROOT):
            raise BadInput(f"the bake was packed for {ascii(root[:200])[1:-1]}, not the default "
                           f"serving root {DEFAULT_ROOT}: give --root DIR (where it is installed); an "
                           "artifact does not choose where the server's caches are")
        return str(DEFAULT_ROOT)


@dataclass(frozen=True)
class ServerLayout:
    """Where the server finds each thing; decided by the caller, never by an artifact.

    ``roles``: role -> the dir the server reads it at (only the roles it gets); ``overlay``:
    the layered cache manager's writable dir (misses go there), or None; ``scratch``: variable
    -> a writable dir for what the server writes at start (HOME, and a role's variable when
    that role's dir is read-only: ``TORCHINDUCTOR_CACHE_DIR`` on an image volume)."""

    roles: Mapping[str, str]
    overlay: str | None = None
    scratch: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def installed(cls, root: str, roles, overlay: str | None = None,
                  scratch: Mapping[str, str] | None = None) -> "ServerLayout":
        """Every role of ``roles`` in its dir under ``root`` (install's and the Dockerfile's)."""
        return cls({r: role_dir(root, r) for r in roles}, overlay, dict(scratch or {}))


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    origin: str  # ROLE, OVERLAY, SCRATCH, SERVE_ENV, INVALIDATING, IDENTITY


@dataclass(frozen=True)
class ServerEnv:
    """A server's environment, each variable with its origin, and notes for the operator."""

    vars: tuple[EnvVar, ...]
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, str]:
        return {v.name: v.value for v in self.vars}

    def of(self, *origins: str) -> dict[str, str]:
        return {v.name: v.value for v in self.vars if v.origin in origins}


def server_env(facts: BakeFacts | None, layout: ServerLayout) -> ServerEnv:
    """The environment a server with ``layout`` needs for the bake of ``facts`` (None: a
    command that is no bake's, only the layout's variables).  The layout's variables come
    only from ``layout``; the artifact's through the three routes of the module doc, each
    checked here (InvalidDocument, exit 5, naming the field)."""
    from cachebake.vllm.serveargs import identity_serve_env

    unknown = [r for r in layout.roles if r not in ROLE_ENV]
    if unknown:
        raise BadInput(f"unknown cache role {unknown[0]!r} (known: {', '.join(ROLE_ENV)})")
    out: dict[str, EnvVar] = {}
    notes: list[str] = []

    def put(mapping: Mapping[str, str], origin: str) -> None:
        for k, v in mapping.items():
            out[k] = EnvVar(k, v, origin)

    if facts is not None:
        doc, bake = facts.document, facts.bake
        put(check_env(bake.serve_env or {}, doc, "bake.serve_env", ((), SERVE_ENV_NAMES),
                      skip=frozenset(ROLE_ENV.values())), SERVE_ENV)
        invalidating = (INVALIDATING_PREFIXES, INVALIDATING_NAMES)
        put(check_env(facts.fingerprint_env, doc, "fingerprint.env", invalidating), INVALIDATING)
        put(check_env((bake.env or {}).get("invalidating_env_vars") or {}, doc,
                      "bake.env.invalidating_env_vars", invalidating), INVALIDATING)
        put(check_env(bake.extra.get("invalidating_env_vars") or {}, doc, "bake.invalidating_env_vars",
                      invalidating), INVALIDATING)
        if "vllm" in layout.roles:  # the identity is the vllm role's: without it, nothing to match
            from cachebake.vllm.serveargs import IDENTITY_KEY

            put(check_env(identity_serve_env(bake.to_json()), doc, f"bake.{IDENTITY_KEY}",
                          ((), IDENTITY_NAMES)), IDENTITY)
    # the layout's last: nothing of the artifact's may stand in their place
    put(role_env(dict(layout.roles)), ROLE)
    put(dict(layout.scratch), SCRATCH)
    if layout.overlay is not None:
        put(overlay_env(layout.overlay), OVERLAY)
    return ServerEnv(tuple(out.values()), tuple(notes))
