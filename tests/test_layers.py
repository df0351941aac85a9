"""The package's layers, read from the source: data flows recipe -> env -> driver -> monitor ->
snapshot -> manifest -> layer -> install -> serve -> verify, and no module imports one above it.
(Imports inside functions count too: a lazy upward import is still an upward dependency.)"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "cachebake"

# module prefix -> cachebake modules it must never import
FORBIDDEN = {
    "cachebake.errors": ["cachebake."],
    "cachebake.roles": ["cachebake.artifact", "cachebake.capture", "cachebake.drivers",
                        "cachebake.install", "cachebake.bake.build", "cachebake.bake.verify", "cachebake.cli"],
    "cachebake.recipes": ["cachebake.drivers", "cachebake.capture", "cachebake.artifact",
                          "cachebake.install", "cachebake.bake.build", "cachebake.bake.verify",
                          "cachebake.serve.command", "cachebake.cli", "cachebake.cli.render"],
    "cachebake.capture": ["cachebake.drivers", "cachebake.artifact", "cachebake.install",
                          "cachebake.bake.build", "cachebake.bake.verify", "cachebake.bake.rounds", "cachebake.cli"],
    "cachebake.artifact": ["cachebake.drivers", "cachebake.install", "cachebake.bake.build",
                           "cachebake.bake.verify", "cachebake.bake.rounds", "cachebake.cli",
                           "cachebake.cli.render", "cachebake.serve.command"],
    "cachebake.bake.rounds": ["cachebake.bake.build", "cachebake.bake.verify", "cachebake.drivers",
                         "cachebake.cli", "cachebake.artifact"],
    "cachebake.bake.verify": ["cachebake.bake.build", "cachebake.cli"],
    "cachebake.bake.build": ["cachebake.bake.verify", "cachebake.cli"],
    "cachebake.drivers": ["cachebake.bake.build", "cachebake.bake.verify", "cachebake.cli", "cachebake.cli.render"],
    "cachebake.install": ["cachebake.bake.build", "cachebake.bake.verify", "cachebake.drivers", "cachebake.cli"],
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


MODULES = sorted(p for p in PKG.rglob("*.py") if "autoload" not in p.parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_no_upward_import(path):
    name = _module_name(path)
    rules = [bad for prefix, bads in FORBIDDEN.items()
             if name == prefix or name.startswith(prefix + ".") for bad in bads]
    wrong = sorted(i for i in _imports(path) for bad in rules
                   if (i == bad.rstrip(".") or i.startswith(bad if bad.endswith(".") else bad + ".")
                       or i == bad) and not i.startswith(name))
    assert not wrong, f"{name} imports {wrong}"
