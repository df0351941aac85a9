"""diff: what changed between two bakes, entry by entry, and which key factors made it change.

"Why did my new image recompile" has one answer per cache entry: the entry the server wanted is
not in the bake, because a factor of its key differs.  ``diff_artifacts`` reads both artifacts
exactly as install reads them (every blob digest-verified, every layer entry checked, unpacked
into a private temp dir; nothing in them is run or imported), lists each role's entries, and
pairs them across the two bakes:

- an entry is the same when its cache key is (a Triton key dir, an autotune result's hash, a
  helper's key dir, a vLLM compile dir's hash) and its bytes are;
- an entry is *changed* when the same thing (a kernel name with the same specialization, an
  autotune result for the same kernel and tuning key, the compile dir of the same rank and
  prefix) sits under another key, or its winner or bytes differ; one entry on each side, else
  they are listed as added and removed (two kernels with one signature and different
  constexprs are not guessed at);
- *factors* are the key inputs that differ between the two bakes' manifests: the Triton key,
  ptxas, the GPU, cache-invalidating variables, vLLM's compile factors (its environment factors,
  each sub-config's hashed fields, the code hash), torch's key and Inductor's configs, the
  model reference and the serve flags.

Specialization: from the bake's compile record where it has the kernel (signature, constexprs,
attrs, options: what the key hashes), else from the kernel's own IR (the ``tt.func`` line of its
``.source``: argument types and ``tt.divisibility``; constexprs are folded into the body there)
plus its launch options.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachebake import jsonio
from cachebake.artifact.groups import GROUP_PREFIX
from cachebake.artifact.manifest import BakeManifest
from cachebake.errors import BadInput, CachebakeError, NotComparable

MAX_SOURCE = 8 << 20  # bytes of a kernel's .source read for its signature line
MAX_META = 1 << 20  # a kernel's or autotune result's JSON
MAX_FACTOR_DEPTH = 6
_CHUNK = 1 << 20  # nested dicts flattened into dotted factor names

# What each factor category costs, and which roles it invalidates.
CATEGORIES = {
    "GPU": ("triton", "vllm"),
    "Triton key": ("triton", "vllm"),
    "ptxas": ("triton",),
    "environment": ("triton",),
    "vLLM compile factors": ("vllm",),
    "torch key": ("vllm",),
    "model reference": ("vllm", "triton"),
    "serve flags": ("vllm", "triton"),
}
_FINGERPRINT_FACTORS = {"target": "GPU", "gpu_name": "GPU", "triton_version": "Triton key",
                        "triton_key": "Triton key", "python_tag": "Triton key", "ptxas": "ptxas",
                        "torch_version": "torch key", "vllm_version": "vLLM compile factors"}


@dataclass
class Entry:
    role: str
    kind: str  # "kernel", "autotune", "helper", "compile-dir", "aot", "file"
    name: str  # kernel name, file path
    ident: str  # what it is, across bakes: name + specialization / tuning key / rank
    key: str  # where it is: key dir, hash, path
    bytes: int
    digest: str  # sha256 over its files (path + content)
    detail: dict = field(default_factory=dict)  # specialization, winner, source hash

    def to_dict(self) -> dict:
        return {"role": self.role, "kind": self.kind, "name": self.name, "key": self.key,
                "bytes": self.bytes, **self.detail}


@dataclass
class Factor:
    category: str
    factor: str
    a: Any
    b: Any

    def to_dict(self) -> dict:
        return {"category": self.category, "factor": self.factor, "a": self.a, "b": self.b,
                "roles": list(CATEGORIES[self.category])}


@dataclass
class Change:
    a: Entry
    b: Entry
    what: list[str]  # "key", "winner", "bytes", "source"
    why: list[str]  # factor names (or "kernel source") that explain it

    def to_dict(self) -> dict:
        d = {"role": self.a.role, "kind": self.a.kind, "name": self.a.name, "changed": self.what,
             "why": self.why, "key": [self.a.key, self.b.key], "bytes": [self.a.bytes, self.b.bytes]}
        for k in sorted(set(self.a.detail) | set(self.b.detail)):
            va, vb = self.a.detail.get(k), self.b.detail.get(k)
            d[k] = va if va == vb else [va, vb]
        return d


@dataclass
class BakeDiff:
    target_a: str
    target_b: str
    factors: list[Factor] = field(default_factory=list)
    added: list[Entry] = field(default_factory=list)
    removed: list[Entry] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    same: dict[str, int] = field(default_factory=dict)  # role -> entries identical in both
    same_layer: bool = False  # one layer blob: every entry identical, none listed

    @property
    def equal(self) -> bool:
        return not (self.factors or self.added or self.removed or self.changed)

    def to_dict(self) -> dict:
        roles = sorted({e.role for e in self.added + self.removed} | {c.a.role for c in self.changed}
                       | set(self.same))
        per_role = {r: {"added": [e.to_dict() for e in self.added if e.role == r],
                        "removed": [e.to_dict() for e in self.removed if e.role == r],
                        "changed": [c.to_dict() for c in self.changed if c.a.role == r],
                        "same": self.same.get(r, 0)} for r in roles}
        return {"target_a": self.target_a, "target_b": self.target_b, "equal": self.equal,
                "same_layer": self.same_layer,
                "factors": [f.to_dict() for f in self.factors], "roles": per_role}


@dataclass
class DiffReport:
    a: str
    b: str
    bakes: list[BakeDiff] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)  # targets with a bake in A alone
    only_b: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.only_a and not self.only_b and all(d.equal for d in self.bakes)

    @property
    def ok(self) -> bool:
        return self.equal

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "equal": self.equal, "only_a": self.only_a,
                "only_b": self.only_b, "bakes": [d.to_dict() for d in self.bakes]}

    def summary(self) -> str:
        if self.equal:
            return f"{self.a} and {self.b} hold the same bakes"
        parts = []
        for d in self.bakes:
            if d.equal:
                continue
            names = ", ".join(f.factor for f in d.factors[:4]) + (" ..." if len(d.factors) > 4 else "")
            parts.append(f"{d.target_a}" + (f" vs {d.target_b}" if d.target_b != d.target_a else "")
                         + f": {len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} changed"
                         + (f" ({names} differ)" if names else ""))
        parts += [f"{t} only in A" for t in self.only_a] + [f"{t} only in B" for t in self.only_b]
        return "the bakes differ: " + "; ".join(parts)


# ------------------------------------------------------------------------------ the factors
def _flatten(value: Any, prefix: str, out: dict[str, Any], depth: int = 0) -> None:
    if isinstance(value, dict) and depth < MAX_FACTOR_DEPTH:
        for k in value:
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out, depth + 1)
    else:
        out[prefix] = value


def _differ(category: str, prefix: str, a: Any, b: Any, out: list[Factor]) -> None:
    fa, fb = {}, {}
    _flatten(a if a is not None else {}, prefix, fa)
    _flatten(b if b is not None else {}, prefix, fb)
    for name in sorted(set(fa) | set(fb)):
        if fa.get(name) != fb.get(name):
            out.append(Factor(category, name, fa.get(name), fb.get(name)))


def key_factors(a: BakeManifest, b: BakeManifest) -> list[Factor]:
    """The key inputs that differ between two bakes (see the module doc)."""
    out: list[Factor] = []
    fa, fb = a.fingerprint, b.fingerprint
    for name, category in _FINGERPRINT_FACTORS.items():
        va, vb = getattr(fa, name), getattr(fb, name)
        if va != vb:
            out.append(Factor(category, name, va, vb))
    _differ("environment", "env", dict(fa.env), dict(fb.env), out)
    ra, rb = a.bake.to_json(), b.bake.to_json()
    ia, ib = ra.get("compile_identity"), rb.get("compile_identity")
    ia, ib = (ia if isinstance(ia, dict) else {}), (ib if isinstance(ib, dict) else {})
    if bool(ia) != bool(ib):  # one bake records vLLM's identity, the other is no vLLM bake
        out.append(Factor("vLLM compile factors", "compile_identity", "recorded" if ia else None,
                          "recorded" if ib else None))
        ia, ib = {}, {}
    _differ("vLLM compile factors", "vllm env", ia.get("env_factors"), ib.get("env_factors"), out)
    parts_a = {k: (v or {}).get("factors") if isinstance(v, dict) else v
               for k, v in (ia.get("config_parts") or {}).items()}
    parts_b = {k: (v or {}).get("factors") if isinstance(v, dict) else v
               for k, v in (ib.get("config_parts") or {}).items()}
    _differ("vLLM compile factors", "", parts_a, parts_b, out)
    if ia.get("code_hash") != ib.get("code_hash"):
        out.append(Factor("vLLM compile factors", "code_hash", ia.get("code_hash"), ib.get("code_hash")))
    _differ("torch key", "compiler", ia.get("compiler_factors"), ib.get("compiler_factors"), out)
    if _model_ref(ra) != _model_ref(rb):
        out.append(Factor("model reference", "model", _model_ref(ra), _model_ref(rb)))
    _differ("serve flags", "serve_args", ra.get("serve_args"), rb.get("serve_args"), out)
    _differ("serve flags", "folded serve_args", _folded_flags(ra), _folded_flags(rb), out)
    return out


def _folded_flags(bake: dict) -> dict[str, list]:
    """The serve flags a fold-back added torch.compile dirs for (the bake section's ``folded``
    entries, cachebake.replay.foldback), each flag whose value differs from the bake's own serve
    args, with the values folded: a folded bake's dirs for ``--mamba-ssm-cache-dtype bfloat16``
    name that flag.  The section is the artifact's: anything of another shape is skipped."""
    own = bake.get("serve_args") if isinstance(bake.get("serve_args"), dict) else {}
    folds = bake.get("folded") if isinstance(bake.get("folded"), list) else []
    out: dict[str, list] = {}
    for fold in folds:
        rounds = fold.get("vllm") if isinstance(fold, dict) else None
        for r in rounds if isinstance(rounds, list) else []:
            args = r.get("serve_args") if isinstance(r, dict) else None
            if not isinstance(args, dict) or not r.get("packed"):
                continue
            for k, v in args.items():
                if own.get(k) != v and v not in out.setdefault(str(k), []):
                    out[str(k)].append(v)
    return {k: v for k, v in out.items() if v}


def _model_ref(bake: dict) -> Any:
    model = bake.get("model")
    if isinstance(model, dict):  # the vllm driver's record: what was asked for and resolved
        return {k: model.get(k) for k in ("requested", "resolved", "config_sha256") if k in model} or model
    return model


# ------------------------------------------------------------------------------ the entries
_LOC = re.compile(r"\s*loc\((?:\"[^\"]*\"\()?#loc\d*\)?\)")


def ir_signature(source: bytes, name: str) -> str | None:
    """The argument list of kernel ``name``'s ``tt.func`` line in its IR, locations stripped:
    types and specialization attributes (``tt.divisibility``), what a launch specializes on."""
    marker = f"@{name}(".encode()
    at = source.find(marker)
    if at < 0:
        return None
    end = source.find(b"\n", at)
    line = source[at + len(marker): end if end >= 0 else len(source)].decode("utf-8", "replace")
    line = _LOC.sub("", line)
    line = line.rsplit(") attributes", 1)[0].rstrip(" {")
    return line.rstrip(")")


_IR_ARG = re.compile(r"%[\w.$-]+:\s*(?:!tt\.ptr<(\w+)>|(\w+))(\s*\{tt\.divisibility = 16 : i32\})?")


def short_spec(spec: str | None, limit: int = 90) -> str:
    """A specialization as people compare them: argument types (``*`` a pointer, ``:16``
    divisible by 16), constexprs, warps and stages; from the record's or the IR's form."""
    try:
        doc = jsonio.parse_json(spec or "null", "specialization")
    except CachebakeError:
        return ""
    if not isinstance(doc, dict):
        return ""
    parts = []
    sig = doc.get("signature")
    if isinstance(sig, str):
        parts.append(",".join(f"{'*' + m[1] if m[1] else m[2]}{':16' if m[3] else ''}"
                              for m in _IR_ARG.finditer(sig)))
    elif isinstance(sig, list):
        parts.append(",".join(str(t[1]) for t in sig if isinstance(t, list) and len(t) == 2
                              and t[1] != "constexpr"))
    consts = doc.get("constexprs")
    if isinstance(consts, list) and consts:
        parts.append(" ".join(f"{c[0]}={c[1]}" for c in consts if isinstance(c, list) and len(c) == 2))
    opts = doc.get("options") if isinstance(doc.get("options"), dict) else {}
    parts.append(" ".join(f"{k[4:] if k.startswith('num_') else k}={v}" for k, v in sorted(opts.items())
                          if v is not None and k in ("num_warps", "num_stages")))
    text = " ".join(p for p in parts if p)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _files_digest(root: Path, files: list[Path]) -> tuple[int, str]:
    """Bytes and one sha256 over (path, sha256 of content) of ``files``, read in chunks (a
    vLLM artifact can be hundreds of MB); the tree is the one extract wrote (no links)."""
    h, size = hashlib.sha256(), 0
    for f in sorted(files):
        one = hashlib.sha256()
        with open(f, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                one.update(chunk)
                size += len(chunk)
        h.update(os.fsencode(f.relative_to(root)) + b"\0" + one.digest())
    return size, h.hexdigest()


def _record_specs(record) -> dict[str, dict]:
    """Compile record entries by their key hash: the specialization Triton hashed."""
    out = {}
    for c in getattr(record, "compiles", None) or []:
        out[c.hash] = {"specialization": jsonio.dumps(
            {"signature": c.signature, "constexprs": c.constexprs, "attrs": c.attrs,
             "options": c.options}, sort_keys=True, separators=(",", ":")),
            "source_hash": c.kernel.source_hash}
    return out


def triton_entries(root: Path, record=None) -> list[Entry]:
    specs = _record_specs(record)
    out = []
    if not root.is_dir():
        return out
    for key_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        files = [p for p in key_dir.iterdir() if p.is_file()]
        size, digest = _files_digest(root, files)
        names = {p.name for p in files}
        tuned = [n for n in names if n.endswith(".autotune.json")]
        helpers = [n for n in names if n.endswith(".so")]
        kernels = [n for n in names if n.endswith(".json") and GROUP_PREFIX + n in names]
        if tuned:
            kernel = tuned[0][: -len(".autotune.json")]
            meta = _json(key_dir / tuned[0])
            timings = meta.get("configs_timings") or []
            winner = None
            try:
                best = min(timings, key=lambda ct: _first(ct[1]))
                winner = jsonio.dumps(best[0], sort_keys=True) if best else None
            except (TypeError, ValueError, IndexError):
                winner = None
            tkey = jsonio.dumps(meta.get("key"), sort_keys=True)
            out.append(Entry("triton", "autotune", kernel, f"autotune {kernel} {tkey}", key_dir.name,
                             size, digest, {"tuning_key": meta.get("key"), "winner": winner,
                                            "configs": len(timings)}))
        elif helpers:
            out.append(Entry("triton", "helper", helpers[0], f"helper {helpers[0]}", key_dir.name,
                             size, digest))
        elif kernels:
            meta = _json(key_dir / kernels[0])
            name = str(meta.get("name") or kernels[0][:-5])
            detail = {}
            spec = specs.get(str(meta.get("hash")))
            if spec:
                detail.update(spec)
            else:
                src = key_dir / f"{kernels[0][:-5]}.source"
                sig = None
                try:  # a kernel without its IR, or an oversized one, is listed by its options alone
                    sig = ir_signature(jsonio.read_document(src, src.name, MAX_SOURCE), name)
                except (CachebakeError, FileNotFoundError):
                    sig = None
                opts = {k: meta.get(k) for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")}
                detail["specialization"] = jsonio.dumps({"signature": sig, "options": opts}, sort_keys=True)
            out.append(Entry("triton", "kernel", name, f"kernel {name} {detail['specialization']}",
                             key_dir.name, size, digest, detail))
        else:
            out.append(Entry("triton", "file", key_dir.name, f"dir {key_dir.name}", key_dir.name,
                             size, digest))
    return out


def _first(timing) -> float:
    if isinstance(timing, (list, tuple)):
        return float(timing[0]) if timing else float("inf")
    return float(timing)


def _json(path: Path) -> dict:
    try:
        doc = jsonio.parse_json(jsonio.read_document(path, path.name, MAX_META), path.name,
                                allow_non_finite=True)
    except CachebakeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def tree_entries(role: str, root: Path) -> list[Entry]:
    """Another role's files; vLLM's torch.compile cache as its units: each backend dir
    (``torch_compile_cache/<hash>/<rank>/<prefix>``), each AOT dir
    (``torch_compile_cache/torch_aot_compile/<hash>``), named by what does not hash."""
    units: dict[tuple[str, str, str], list[Path]] = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            path = Path(dirpath) / f
            rel = path.relative_to(root).parts
            if role == "vllm" and len(rel) >= 4 and rel[0] == "torch_compile_cache" \
                    and rel[1] == "torch_aot_compile":
                unit = ("aot", "/".join(rel[:3]), "torch_aot_compile")
            elif role == "vllm" and len(rel) >= 5 and rel[0] == "torch_compile_cache":
                unit = ("compile-dir", "/".join(rel[:4]), "/".join(rel[2:4]))
            else:
                unit = ("file", "/".join(rel), "/".join(rel))
            units.setdefault(unit, []).append(path)
    out = []
    for (kind, key, ident), files in sorted(units.items()):
        size, digest = _files_digest(root, files)
        out.append(Entry(role, kind, ident, f"{kind} {ident}", key, size, digest,
                         {"files": len(files)} if kind != "file" else {}))
    return out


# ------------------------------------------------------------------------------ pairing
_TRITON_CATEGORIES = {"GPU", "Triton key", "ptxas", "environment"}


def _why(a: Entry, b: Entry, factors: list[Factor], what: list[str]) -> list[str]:
    roles_factors = [f for f in factors if a.role in CATEGORIES[f.category]]
    why = []
    if "source" in what:
        why.append("kernel source")
    if a.role == "triton" and a.kind != "autotune":
        why += [f.factor for f in roles_factors if f.category in _TRITON_CATEGORIES]
    else:
        why += [f.factor for f in roles_factors]
    return why or ["not in the manifests' factors (content only)"]


def pair(entries_a: list[Entry], entries_b: list[Entry], factors: list[Factor], diff: BakeDiff) -> None:
    by_key_b = {(e.role, e.kind, e.key, e.digest): e for e in entries_b}
    same_keys = set()
    for e in entries_a:
        k = (e.role, e.kind, e.key, e.digest)
        if k in by_key_b:
            same_keys.add(k)
            diff.same[e.role] = diff.same.get(e.role, 0) + 1
    rest_a = [e for e in entries_a if (e.role, e.kind, e.key, e.digest) not in same_keys]
    rest_b = [e for e in entries_b if (e.role, e.kind, e.key, e.digest) not in same_keys]
    ident_a: dict[tuple, list[Entry]] = {}
    ident_b: dict[tuple, list[Entry]] = {}
    for e in rest_a:
        ident_a.setdefault((e.role, e.ident), []).append(e)
    for e in rest_b:
        ident_b.setdefault((e.role, e.ident), []).append(e)
    for k in sorted(set(ident_a) | set(ident_b)):
        la, lb = ident_a.get(k, []), ident_b.get(k, [])
        if len(la) == 1 and len(lb) == 1:
            a, b = la[0], lb[0]
            what = []
            if a.key != b.key:
                what.append("key")
            if a.detail.get("winner") != b.detail.get("winner"):
                what.append("winner")
            if a.bytes != b.bytes or a.digest != b.digest:
                what.append("bytes")
            if a.detail.get("source_hash") and b.detail.get("source_hash") \
                    and a.detail["source_hash"] != b.detail["source_hash"]:
                what.append("source")
            diff.changed.append(Change(a, b, what, _why(a, b, factors, what)))
        else:
            diff.removed += la
            diff.added += lb


# ------------------------------------------------------------------------------ reading
def verify_layer(source, ref) -> None:
    """Read ``ref``'s layer through its digest check, unpacking nothing: two bakes that declare
    one layer are equal only where each side's blob is that layer (CorruptArtifact, exit 5);
    the caller reads each side's compile record too (``_record``: through its digest)."""
    with source.open_layer(ref) as compressed:
        while compressed.read(1 << 20):
            pass


def bake_entries(source, ref, workdir: Path) -> list[Entry]:
    """Unpack ``ref``'s layer into ``workdir`` as install reads it, and list its entries."""
    from cachebake.install import extract

    limits = extract.LayerLimits.from_manifest(ref.manifest, ref.layer_size, (str(workdir),))
    with source.open_layer(ref) as compressed:
        extract.extract_to(compressed, limits, workdir)
    record = _record(source, ref)
    out: list[Entry] = []
    for role in ref.manifest.roles:
        root = workdir / role
        out += triton_entries(root, record) if role == "triton" else tree_entries(role, root)
    return out


def _record(source, ref):
    desc = ref.manifest.record
    if not desc or not hasattr(source, "read_json_blob"):
        return None
    from cachebake.capture.record import RECORD_MEDIA_TYPE, CompileRecord

    if desc.get("mediaType") != RECORD_MEDIA_TYPE:
        return None
    return CompileRecord.from_dict(source.read_json_blob(desc))


def _pairs(ta: list[str], tb: list[str], target: str | None, a: str, b: str):
    if target:
        from cachebake.gpu import GPUTargetSpec

        key = GPUTargetSpec.parse(target).key
        for side, have in ((a, ta), (b, tb)):
            if key not in have:
                raise NotComparable(f"{side} holds no bake for {key} (it has: {', '.join(have) or 'none'})")
        return [(key, key)], [], []
    common = sorted(set(ta) & set(tb))
    if common:
        return [(t, t) for t in common], sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
    if len(ta) == 1 and len(tb) == 1:  # one bake each, for two GPUs: the GPU is the difference
        return [(ta[0], tb[0])], [], []
    raise NotComparable(f"{a} ({', '.join(ta)}) and {b} ({', '.join(tb)}) share no GPU target "
                        "and hold several bakes each", hint="pick the pair with --target-a/--target-b")


def diff_artifacts(a: str, b: str, *, target: str | None = None, target_a: str | None = None,
                   target_b: str | None = None) -> DiffReport:
    from cachebake.artifact.reader import open_source
    from cachebake.gpu import GPUTargetSpec

    src_a, src_b = open_source(a), open_source(b)
    ta, tb = src_a.targets(), src_b.targets()
    if target_a or target_b:
        if not (target_a and target_b):
            raise BadInput("--target-a and --target-b go together")
        pairs, only_a, only_b = [(GPUTargetSpec.parse(target_a).key, GPUTargetSpec.parse(target_b).key)], [], []
    else:
        pairs, only_a, only_b = _pairs(ta, tb, target, a, b)
    report = DiffReport(a, b, only_a=only_a, only_b=only_b)
    with tempfile.TemporaryDirectory(prefix="cachebake-diff-") as tmp:
        for i, (x, y) in enumerate(pairs):
            ref_a, ref_b = src_a.select(x), src_b.select(y)
            d = BakeDiff(x, y, key_factors(ref_a.manifest, ref_b.manifest))
            if ref_a.layer_digest == ref_b.layer_digest:  # one layer: every entry the same
                for src, ref in ((src_a, ref_a), (src_b, ref_b)):  # each side holds what it declares
                    verify_layer(src, ref)
                    _record(src, ref)
                d.same_layer = True
            else:
                ea = bake_entries(src_a, ref_a, Path(tmp) / f"a{i}")
                eb = bake_entries(src_b, ref_b, Path(tmp) / f"b{i}")
                pair(ea, eb, d.factors, d)
            report.bakes.append(d)
    return report
