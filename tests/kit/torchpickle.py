"""Read torch's pickles without torch (tests only): every class becomes a stub that keeps its
arguments and state, so a test can ask which field a string sits in.

``fields(data, needle)`` -> {(field path, 'str'|'bytes'): occurrences of ``needle``}, e.g.
``<CompiledFxGraph>._triton_bundle<TritonBundle>.static_autotuners[*]...<CachingAutotuner>.filename``.
``load(data, strict=True)`` runs the pure-Python unpickler, which checks protocol-4 frames
opcode by opcode (the C one only checks that a frame fits in the data).
"""

from __future__ import annotations

import collections
import io
import pickle


class Stub(dict):
    qual = "?"

    def __new__(cls, *args, **kwargs):
        obj = dict.__new__(cls)
        obj.args, obj.items_, obj.state = args, [], None
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def append(self, x):
        self.items_.append(x)

    def extend(self, xs):
        self.items_.extend(xs)

    def __setstate__(self, state):
        self.state = state

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other


_classes: dict[str, type] = {}
_PLAIN = {("builtins", n) for n in ("set", "frozenset", "slice", "tuple", "list", "dict")} | {
    ("collections", "OrderedDict")}


def _find_class(self, module, name):
    if (module, name) in _PLAIN:
        return pickle.Unpickler.find_class(self, module, name)
    if (module, name) == ("builtins", "getattr"):
        return lambda obj, attr: ("getattr", obj, attr)
    key = f"{module}.{name}"
    if key not in _classes:
        _classes[key] = type(name, (Stub,), {"qual": key})
    return _classes[key]


class _C(pickle.Unpickler):
    find_class = _find_class

    def persistent_load(self, pid):
        return ("persistent", pid)


class _Py(pickle._Unpickler):
    find_class = _find_class

    def persistent_load(self, pid):
        return ("persistent", pid)


def load(data: bytes, strict: bool = False):
    return (_Py if strict else _C)(io.BytesIO(data)).load()


def fields(data: bytes, needle: bytes) -> dict[tuple[str, str], int]:
    out: collections.Counter = collections.Counter()
    _walk(load(data), "", out, set(), needle)
    return dict(out)


def _walk(obj, path, out, seen, needle):
    if isinstance(obj, (str, bytes, bytearray)):
        raw = obj.encode("utf-8", "surrogatepass") if isinstance(obj, str) else bytes(obj)
        if n := raw.count(needle):
            out[(path, "str" if isinstance(obj, str) else "bytes")] += n
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Stub):
        here = f"{path}<{obj.qual.rsplit('.', 1)[-1]}>"
        for i, a in enumerate(obj.args):
            _walk(a, f"{here}.arg{i}", out, seen, needle)
        for k, v in dict.items(obj):
            _walk(v, f"{here}[{k}]", out, seen, needle)
        for v in obj.items_:
            _walk(v, f"{here}[*]", out, seen, needle)
        if obj.state is not None:
            _walk(obj.state, here, out, seen, needle)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(k, f"{path}{{key}}", out, seen, needle)
            _walk(v, f"{path}.{k}" if isinstance(k, str) and len(k) < 60 else f"{path}[*]",
                  out, seen, needle)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _walk(v, f"{path}[*]", out, seen, needle)


def payload_files(data: bytes, needle: bytes) -> collections.Counter:
    """File extensions of the Triton files bundled in an FX-graph pickle whose bytes hold
    ``needle`` (``TritonKernelArtifact(filename, payload)``)."""
    found: collections.Counter = collections.Counter()

    def visit(obj, seen):
        if id(obj) in seen or not isinstance(obj, (Stub, dict, list, tuple)):
            return
        seen.add(id(obj))
        if isinstance(obj, Stub) and obj.qual.endswith("TritonKernelArtifact"):
            state = obj.state if isinstance(obj.state, dict) else (obj.state or ({},))[-1]
            if needle in state.get("payload", b""):
                found[state["filename"].rsplit(".", 1)[-1]] += 1
        children = []
        if isinstance(obj, Stub):
            children = [*obj.args, *dict.values(obj), *obj.items_, obj.state]
        elif isinstance(obj, dict):
            children = list(obj.values())
        else:
            children = list(obj)
        for c in children:
            visit(c, seen)

    visit(load(data), set())
    return found
