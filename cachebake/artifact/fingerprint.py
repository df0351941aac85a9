"""The compatibility fingerprint: everything in Triton's cache key that differs between machines.

A baked cache only hits where every input of the key matches (shared/FACTS.md, "The cache key"):
the exact Triton wheel (``triton_key()`` hashes its sources and libtriton.so, so the Python tag
matters too), the ptxas that the backend hashes, the GPU target, and each cache-invalidating
environment variable that is set.  vLLM's kernels also pick configs by GPU *name* (H100 and
H200 are both sm_90), and torch/vllm versions change kernel sources.  ``current_fingerprint``
reads all of that from the running process; ``compare_fingerprints`` turns differences into
one-line reasons an operator can act on.

Reading is cheap on purpose: versions come from package metadata, the GPU from nvidia-smi
(or NVML through ``pynvml``, or the AMD KFD topology in sysfs), ptxas from Triton's bundled
binary; torch is never imported unless a caller asks (``allow_torch``: Triton's driver query
imports it, seconds an init container should not spend).  Triton is imported only if it is
installed, so an init container without Triton can still compare against a fingerprint file
written in the serving image.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass, field

from cachebake import jsonio
from cachebake.artifact import schema
from cachebake.errors import BadInput, InvalidDocument, shorten
from cachebake.gpu import resolve_target
from cachebake.roles import ROLE_ENV


# The string fields of a fingerprint, each a version, a hash or a name (None: unknown here).
_TEXT_FIELDS = ("triton_version", "triton_key", "python_tag", "ptxas", "gpu_name", "torch_version",
                "vllm_version")
_MAP_FIELDS = ("env", "bake_paths")
_MAX_FIELD = 64 << 10  # characters of one field: `ptxas --version` and Triton's key are ~1 kB

# Every VLLM_* variable present at bake is recorded (vLLM routes kernels by variables it does not
# hash: 1Cat-vLLM #536 counted 171), except the role dirs cachebake itself points per install.
_VLLM_ENV_NAME = re.compile(r"VLLM_[A-Z0-9_]{1,123}\Z")
# A credential's value is never recorded, only that it was set.
_SECRET_NAME = re.compile(r"(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(?:_|\Z)")
PRESENT_ONLY = "(set; value not recorded)"
_MAX_VLLM_ENV = 1024  # variables recorded


def vllm_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The VLLM_* variables set in ``environ`` (default: this process), credentials as
    ``PRESENT_ONLY``, the role dirs (VLLM_CACHE_ROOT: install points it) left out."""
    env = os.environ if environ is None else environ
    out = {}
    for name in sorted(env):
        if not _VLLM_ENV_NAME.match(name) or name in ROLE_ENV.values():
            continue
        out[name] = PRESENT_ONLY if _SECRET_NAME.search(name[5:]) else env[name][:4096]
        if len(out) >= _MAX_VLLM_ENV:
            break
    return out


@dataclass(frozen=True)
class Fingerprint:
    """The serving environment a bake hits in.  One JSON form (``to_json``): the manifest's
    ``fingerprint`` section, and the very same object in the file ``cachebake fingerprint
    --out`` writes (``write``) and ``install --fingerprint`` reads (``read``)."""

    target: str  # "cuda:90"
    triton_version: str | None = None
    triton_key: str | None = None
    python_tag: str | None = None  # cpython-312 + platform ABI: the wheel triton_key was hashed from
    ptxas: str | None = None  # the backend hash: full `ptxas --version` text + arch
    gpu_name: str | None = None  # None where no GPU was visible (e.g. --target on a CPU builder)
    env: Mapping[str, str] = field(default_factory=dict)  # cache-invalidating vars that are set
    torch_version: str | None = None
    vllm_version: str | None = None
    bake_paths: Mapping[str, str] = field(default_factory=dict)  # role -> absolute path baked at
    # every VLLM_* variable present (``vllm_environment``); None: not recorded (cachebake < 0.34 support)
    vllm_env: Mapping[str, str] | None = None

    def to_json(self) -> dict:
        """The JSON object, every field present (None where unknown)."""
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        doc.update((key, dict(doc[key])) for key in _MAP_FIELDS)
        if self.vllm_env is None:
            del doc["vllm_env"]  # an old reader's form, unchanged
        else:
            doc["vllm_env"] = dict(self.vllm_env)
        return doc

    @classmethod
    def from_json(cls, doc, document: str = "fingerprint", field: str = "") -> "Fingerprint":
        """A fingerprint from untrusted JSON, its types checked (InvalidDocument naming
        ``document`` and the field).  Fields we don't know come from a newer cachebake;
        ignoring them is safe because compare_fingerprints only reasons about fields it knows."""
        c = schema.Checker(document)
        c.obj(doc, field)
        where = (lambda key: f"{field}.{key}") if field else (lambda key: key)
        values = {"target": c.string(c.get(doc, "target", field), where("target"), pattern=schema.TARGET_RE)}
        for key in _TEXT_FIELDS:
            values[key] = c.opt_str(doc.get(key), where(key), max_len=_MAX_FIELD)
        for key in _MAP_FIELDS:
            values[key] = dict(c.str_map(doc.get(key) or {}, where(key), max_len=_MAX_FIELD))
        if doc.get("vllm_env") is not None:
            venv = c.str_map(doc["vllm_env"], where("vllm_env"), max_len=_MAX_FIELD)
            if len(venv) > _MAX_VLLM_ENV or any(not _VLLM_ENV_NAME.match(k) for k in venv):
                raise InvalidDocument(document, where("vllm_env"),
                                      f"holds a name that is no VLLM_ variable, or more than {_MAX_VLLM_ENV}")
            values["vllm_env"] = dict(venv)
        return cls(**values)

    def write(self, path: os.PathLike | str) -> None:
        """The fingerprint file, whole or not at all, mode 0644 (the serving image's user reads
        it, whatever the umask); an error names ``path``."""
        jsonio.write_json_atomic(path, self.to_json())

    @classmethod
    def read(cls, path: os.PathLike | str) -> "Fingerprint":
        """The user's fingerprint file (exit 3 when it is unreadable or malformed), read with the
        same bounds as an artifact's documents.  Also reads what ``cachebake fingerprint --out``
        wrote before 0.2 (this object under ``fingerprint`` in the command's JSON envelope): one
        key's look-up."""
        name = f"fingerprint file {os.fspath(path)}"
        try:
            doc = jsonio.load_document(path, name, schema.CAP_FINGERPRINT, missing=BadInput)
            if isinstance(doc, dict) and isinstance(doc.get("fingerprint"), dict):
                doc = doc["fingerprint"]
            return cls.from_json(doc, name)
        except InvalidDocument as e:  # the user's file, not an artifact's: bad input
            raise BadInput(e.line()) from None


@dataclass(frozen=True)
class Mismatch:
    field: str
    baked: object
    current: object
    consequence: str

    def __str__(self) -> str:
        baked, here = _flat(self.baked), _flat(self.current)
        # Long values (triton_key: the version, then hashes) can share a long prefix: cut both
        # around where they first differ, so the line shows the difference, not the prefix.
        start = 0
        if max(len(baked), len(here)) > 90:
            common = len(os.path.commonprefix([baked, here]))
            start = max(0, common - 20) if common > 40 else 0
        return (f"{self.field}: baked {_short(baked, start)}, here {_short(here, start)} "
                f"-> {self.consequence}")


def _flat(value: object) -> str:
    text = value if isinstance(value, str) else jsonio.dumps(value, sort_keys=True)
    return " ".join(str(text).split())


def _short(text: str, start: int = 0) -> str:
    """At most 90 characters of ``text`` from ``start`` ("..." marks what was cut)."""
    head = "..." if start else ""
    return head + shorten(text[start:], 90 - len(head))


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def python_tag() -> str:
    return f"{sys.implementation.cache_tag}{sysconfig.get_config_var('EXT_SUFFIX') or ''}"


def current_fingerprint(target: str | None = None, bake_paths: dict[str, str] | None = None,
                        allow_torch: bool = False) -> Fingerprint:
    spec, gpu_name = resolve_target(target, allow_torch)
    fp = Fingerprint(
        target=spec.key,
        gpu_name=gpu_name,
        python_tag=python_tag(),
        torch_version=_dist_version("torch"),
        vllm_version=_dist_version("vllm"),
        bake_paths=dict(bake_paths or {}),
        vllm_env=vllm_environment(),
    )
    try:
        import triton
        from triton._C.libtriton import get_cache_invalidating_env_vars
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.cache import triton_key
    except ImportError:
        return fp  # no Triton here: compare against a fingerprint file from the serving image
    try:
        ptxas = make_backend(GPUTarget(spec.backend, spec.arch, spec.warp_size)).hash()
    except Exception as e:  # a target this Triton has no backend or assembler for
        raise BadInput(f"Triton {triton.__version__} cannot target {spec.key}: {e}") from None
    return dataclasses.replace(fp, triton_version=triton.__version__, triton_key=triton_key(), ptxas=ptxas,
                               env=dict(sorted(get_cache_invalidating_env_vars().items())))


# field -> what happens at serve time when it differs
_CONSEQUENCES = {
    "target": "the bake holds no kernels for this GPU: every kernel compiles at first use",
    "triton_version": "another Triton: every kernel recompiles at first use",
    "triton_key": "another Triton build (wheel or Python tag): every kernel recompiles at first use",
    "python_tag": "another Python ABI: Triton's key and its launcher .so differ, every kernel recompiles",
    "ptxas": "another ptxas: every kernel recompiles at first use",
    "env": "cache-invalidating variables differ: every kernel recompiles at first use",
    "gpu_name": "vLLM picks kernel configs by GPU name: some kernels recompile and re-autotune",
    "torch_version": "another torch: Inductor and torch.compile caches miss, Triton kernels it generates recompile",
    "vllm_version": "another vLLM: kernels whose source changed recompile and re-autotune",
}


def compare_fingerprints(baked: Fingerprint, current: Fingerprint) -> list[Mismatch]:
    """One Mismatch per field that would make the bake miss.  A value unknown on one side
    (None: not installed, or no GPU visible) is not a difference we can prove, except for
    Triton itself, without which nothing hits."""
    out: list[Mismatch] = []
    for name, consequence in _CONSEQUENCES.items():
        b, c = getattr(baked, name), getattr(current, name)
        if b == c:
            continue
        if name in ("gpu_name", "torch_version", "vllm_version") and (b is None or c is None):
            continue
        out.append(Mismatch(name, b, c, consequence))
    return out


HASHED_CONSEQUENCE = ("vLLM hashes it into torch.compile's cache key: the baked artifact is not "
                      "loaded, Dynamo and Inductor run again at every start")
ROUTE_CONSEQUENCE = ("vLLM does not hash it, but it may route kernels: kernels compiled under "
                     "the baked route can be loaded under this one, or this route's compile at "
                     "first use")


def compare_vllm_env(baked: Fingerprint, current: Fingerprint,
                     hashed: Mapping[str, object] | None = None) -> tuple[list[Mismatch], list[Mismatch]]:
    """(refusals, warnings): one Mismatch per VLLM_* variable set differently (or set on one
    side only).  A refusal where the variable is among the compile factors the bake's vLLM
    hashed (``hashed``: its compile identity's env factors, name -> the value vLLM hashed), a
    warning otherwise; a value here that is the very value vLLM hashed at bake (a path that
    followed HOME there and is exported here, as serve-args prints it) is no difference.
    Nothing where either side did not record its variables (an older artifact or file)."""
    if baked.vllm_env is None or current.vllm_env is None:
        return [], []
    hashed = hashed or {}
    refuse, warn = [], []
    unset = "(unset)"
    for name in sorted(set(baked.vllm_env) | set(current.vllm_env)):
        b, c = baked.vllm_env.get(name, unset), current.vllm_env.get(name, unset)
        if b == c:
            continue
        if name in hashed:
            if c == _as_env_text(hashed[name]):
                continue
            refuse.append(Mismatch(f"env {name}", b, c, HASHED_CONSEQUENCE))
        else:
            warn.append(Mismatch(f"env {name}", b, c, ROUTE_CONSEQUENCE))
    return refuse, warn


def _as_env_text(value: object) -> str | None:
    """A hashed factor's value as the variable's text would give it (str, int; bools as vLLM's
    getters read "1"/"0"); None for what no text maps to one way."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (str, int)):
        return str(value)
    return None
