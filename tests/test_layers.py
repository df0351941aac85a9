"""The package's rooms, read from the source: the data flows one way, one room a step, and no
module imports a later room or sits in an import cycle with another file.

The flow (README "Layout", cachebake/__init__.py):

    recipe -> capture -> bake -> artifact -> install -> serve -> verify

with ``vllm/`` a wing that bake, serve and verify call into, and ``replay`` the loop back (served
misses and recorded compiles, ahead of time, into the next bake).  ROOMS below is that flow,
bottom up, and every rule here derives from it: a module may import its own room and the rooms
before it, never one after, with two exceptions named in HANDOFFS, each one import where a step
hands its output to the next by calling it.  And the server's side never reaches back into the
bake's (SERVER_NEVER_IMPORTS): what runs in a serving pod must not load bake-time code.

Every import counts, at the top of a file or inside a function (a lazy upward import is still an
upward dependency), relative ones resolved; the checker is run on planted violations too, so it
cannot pass by finding nothing.

Not seen: imports by a name held in a string (the driver registry's "module:function", Triton's
TRITON_CACHE_MANAGER): they are data a later room hands a process, not a dependency of the file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "cachebake"

# Bottom up.  A module may import its own room and the rooms before it, never one after.
ROOMS: list[tuple[str, list[str]]] = [
    ("bottom", ["errors", "jsonio", "roles", "gpu", "toolchain", "fsops"]),
    ("recipe", ["recipes"]),
    ("capture", ["capture"]),
    ("vllm wing", ["vllm"]),  # bake, serve and verify call into it; it calls only the rooms above
    ("bake", ["drivers", "bake"]),
    ("artifact", ["artifact"]),
    ("install", ["install"]),
    ("serve", ["serve"]),
    ("verify", ["verify"]),
    ("replay", ["replay"]),
    ("distribute", ["distribute"]),
    ("cli", ["cli"]),
]

# The imports where a step calls the one after it to hand over what it made, each with why.
# Exactly these modules, so nothing else rides on them; each must still exist (test below).
HANDOFFS: dict[tuple[str, str], str] = {
    ("cachebake.bake.build", "cachebake.artifact.pack"): "build packs the caches its rounds filled",
    ("cachebake.bake.seed", "cachebake.replay.engine"): "build --seed compiles a record before round 1",
}

# Rooms that run inside the server, and the rooms they must never import (even downward).
SERVER_NEVER_IMPORTS: dict[str, list[str]] = {"serve": ["bake"]}


# ---------------------------------------------------------------------------- the checker
def modules(pkg: Path) -> dict[str, Path]:
    """Every module of the package at ``pkg``: dotted name -> file."""
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that the module ``name`` imports, anywhere in the file: for
    ``from X import Y`` the module X.Y where Y is one, else X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    top = name.partition(".")[0]
    return {m for m in found if m in known and m.startswith(top)} - {name}


def room_of(name: str, rooms=ROOMS) -> int:
    """The index of the room that holds module ``name`` (the package itself is the bottom's)."""
    parts = name.split(".")
    if len(parts) == 1:
        return 0
    holders = [i for i, (_, members) in enumerate(rooms) if parts[1] in members]
    assert len(holders) == 1, f"{name}: in {len(holders)} rooms; every module belongs to exactly one (ROOMS)"
    return holders[0]


def upward_imports(pkg: Path, rooms=ROOMS, handoffs=HANDOFFS, never=SERVER_NEVER_IMPORTS) -> list[str]:
    """Every import against the flow: into a later room (unless it is a named hand-off), or from
    a server-side room into a room it must never import."""
    known = modules(pkg)
    names = [n for n, _ in rooms]
    bad = []
    for name, path in known.items():
        here = room_of(name, rooms)
        for target in sorted(imports(name, path, known)):
            there = room_of(target, rooms)
            later = there > here and (name, target) not in handoffs
            forbidden = any(names[there] == r for r in never.get(names[here], []))
            if later or forbidden:
                bad.append(f"{name} ({rooms[here][0]}) -> {target} ({rooms[there][0]})")
    return bad


def import_cycles(pkg: Path) -> list[list[str]]:
    """Every set of files that import each other, directly or around (Tarjan's strongly
    connected components of the file graph), each as a sorted list."""
    known = modules(pkg)
    graph = {name: sorted(imports(name, path, known)) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(cycles)


# ---------------------------------------------------------------------------- the rules
def test_every_module_is_in_exactly_one_room():
    names = {m for _, members in ROOMS for m in members}
    assert sum(len(members) for _, members in ROOMS) == len(names), "a name in two rooms"
    for name in modules(PKG):
        room_of(name)  # asserts


def test_the_order_forbids_the_arrows_the_flow_rules_out():
    """The flow's arrows, each forbidden backwards by the one order above, and the three
    imports issue 28 found against it by meaning (bake's verify into serve, twice; serve into
    the bake's drivers)."""
    def later(a: str, b: str) -> bool:
        return room_of(f"cachebake.{b}") > room_of(f"cachebake.{a}")

    flow = ["recipes", "capture", "bake", "artifact", "install", "serve", "verify"]
    for a, b in zip(flow, flow[1:]):
        assert later(a, b), (a, b)
    for step in ("bake", "serve", "verify"):  # the wing is below every step that calls into it
        assert later("vllm", step), step
    assert later("capture", "vllm") and later("recipes", "vllm")
    for a, b in [("capture", "replay"), ("install", "serve"), ("artifact", "install"), ("recipes", "capture"),
                 ("recipes", "artifact"), ("bake", "verify"), ("serve", "verify"), ("serve", "replay")]:
        assert later(a, b), (a, b)
    for _, members in ROOMS[:-1]:
        for m in members:
            assert later(m, "cli"), m
    assert "bake" in SERVER_NEVER_IMPORTS["serve"]


def test_every_handoff_is_a_real_import_of_the_next_step():
    known = modules(PKG)
    for (src, dst), why in HANDOFFS.items():
        assert dst in imports(src, known[src], known), (src, dst, why)
        assert room_of(dst) > room_of(src), f"{src} -> {dst} is not against the flow: drop it from HANDOFFS"


def test_no_module_outside_the_wing_imports_vllm():
    """vLLM is imported by cachebake/vllm/ alone: one home for what one vLLM release does."""
    bad = []
    for name, path in modules(PKG).items():
        if name.startswith("cachebake.vllm"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{name}: {m}" for m in mods if m == "vllm" or m.startswith("vllm.")]
    assert bad == []


def test_no_module_imports_a_later_room():
    assert upward_imports(PKG) == []


def test_no_import_cycle_between_files():
    assert import_cycles(PKG) == []


# ---------------------------------------------------------------------------- the checker, checked
@pytest.fixture
def planted(tmp_path) -> Path:
    """A package laid out like cachebake, with one upward import (inside a function) and one
    cycle (through a relative import and a function-level one), and clean files around them."""
    pkg = tmp_path / "cachebake"
    for d in ("install", "serve", "cli"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("import os\n")
    (pkg / "install" / "a.py").write_text("from cachebake import errors\n\n"
                                          "def late():\n    from cachebake.serve import layered\n")
    (pkg / "serve" / "layered.py").write_text("from cachebake.errors import os  # down: fine\n")
    (pkg / "cli" / "x.py").write_text("from . import y\n")
    (pkg / "cli" / "y.py").write_text("def f():\n    import cachebake.cli.x\n")
    return pkg


def test_the_checker_finds_a_planted_upward_import_and_a_planted_cycle(planted):
    assert upward_imports(planted) == ["cachebake.install.a (install) -> cachebake.serve.layered (serve)"]
    assert import_cycles(planted) == [["cachebake.cli.x", "cachebake.cli.y"]]


def test_the_checker_finds_the_three_imports_issue_28_named(planted):
    """Planted as they stood before the wing: verify inside bake reading serve (twice), and the
    server's before-start check reaching back into the bake's drivers."""
    for d in ("bake", "drivers"):
        (planted / d).mkdir()
        (planted / d / "__init__.py").write_text("")
    (planted / "bake" / "verify.py").write_text("from cachebake.serve import layered\n\n"
                                               "def f():\n    from cachebake.serve.layered import x\n")
    (planted / "serve" / "compile_check.py").write_text("from cachebake.drivers import identity\n")
    (planted / "drivers" / "identity.py").write_text("from cachebake import errors\n")
    found = upward_imports(planted)
    assert "cachebake.bake.verify (bake) -> cachebake.serve.layered (serve)" in found
    assert "cachebake.serve.compile_check (serve) -> cachebake.drivers.identity (bake)" in found


def test_a_handoff_excuses_only_its_own_import(planted):
    (planted / "bake").mkdir()
    (planted / "bake" / "__init__.py").write_text("")
    (planted / "bake" / "build.py").write_text("from cachebake.install import a\n")
    assert "cachebake.bake.build (bake) -> cachebake.install.a (install)" in upward_imports(planted)
    assert "cachebake.bake.build (bake) -> cachebake.install.a (install)" not in upward_imports(
        planted, handoffs={("cachebake.bake.build", "cachebake.install.a"): "planted"})


def test_the_checker_refuses_a_module_in_no_room(planted):
    (planted / "nowhere.py").write_text("")
    with pytest.raises(AssertionError, match="cachebake.nowhere: in 0 rooms"):
        upward_imports(planted)
