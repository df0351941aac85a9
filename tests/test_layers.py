"""The package's rooms, read from the source: data flows one way, one room a step, and no module
imports a later room or sits in an import cycle with another file.

The order is ROOMS below, the one list every rule here derives from (README "Layout" and
cachebake/__init__.py say the same).  Every import counts, at the top of a file or inside a
function (a lazy upward import is still an upward dependency), relative ones resolved; the
checker is run on planted violations too, so it cannot pass by finding nothing.

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
    ("what is baked", ["recipes", "serveargs"]),
    ("capture", ["capture"]),
    ("artifact", ["artifact"]),
    ("plan", ["plan"]),
    ("drivers", ["drivers"]),
    ("install", ["install"]),
    ("serve", ["serve"]),
    ("replay", ["replay"]),
    ("bake", ["bake"]),
    ("distribute", ["distribute"]),
    ("cli", ["cli"]),
]


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


def upward_imports(pkg: Path, rooms=ROOMS) -> list[str]:
    known = modules(pkg)
    bad = []
    for name, path in known.items():
        here = room_of(name, rooms)
        for target in sorted(imports(name, path, known)):
            if room_of(target, rooms) > here:
                bad.append(f"{name} ({rooms[room_of(name, rooms)][0]}) -> {target} "
                           f"({rooms[room_of(target, rooms)][0]})")
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
    """The arrows issue 22 names, each forbidden by the one order above."""
    def later(a: str, b: str) -> bool:
        return room_of(f"cachebake.{b}") > room_of(f"cachebake.{a}")

    for a, b in [("capture", "replay"), ("install", "serve"), ("plan", "drivers"), ("artifact", "plan"),
                 ("artifact", "install"), ("recipes", "capture"), ("recipes", "artifact")]:
        assert later(a, b), (a, b)
    for _, members in ROOMS[:-1]:
        for m in members:
            assert later(m, "cli"), m


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


def test_the_checker_refuses_a_module_in_no_room(planted):
    (planted / "nowhere.py").write_text("")
    with pytest.raises(AssertionError, match="cachebake.nowhere: in 0 rooms"):
        upward_imports(planted)
