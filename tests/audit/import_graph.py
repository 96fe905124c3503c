"""The import graph of the installed packages' sources, read from the files (no module is
imported): every ``import`` and ``from ... import`` statement, at module level or inside a
function, as an edge to the module it loads (a submodule imported by name, else the module whose
attribute is taken); and the private names one module takes from another (`private_imports`)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: import name -> source folder
ROOTS = {"atlas_core": "atlas_core", "atlas_plugins": "plugins", "atlas_cli": "cli"}


def modules() -> dict[str, tuple[Path, bool]]:
    """``{module name: (file, is a package)}``."""
    out = {}
    for pkg, folder in ROOTS.items():
        base = REPO / folder
        for f in base.rglob("*.py"):
            parts = [pkg, *f.relative_to(base).with_suffix("").parts]
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _targets(node: ast.AST, name: str, is_pkg: bool, mods) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        pkg = name if is_pkg else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        base = f"{pkg}.{node.module}" if node.module else pkg
    else:
        base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def edges(module_level_only: bool = False) -> dict[str, set[str]]:
    """``{module: modules it imports}``, within the three packages."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, (f, is_pkg) in mods.items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        nodes = tree.body if module_level_only else ast.walk(tree)
        for node in nodes:
            for t in _targets(node, name, is_pkg, mods):
                while t and t not in mods:  # the closest enclosing module of ours
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports() -> list[str]:
    """Every private name (``_x``, not a dunder) one module takes from another of the three
    packages: ``from m import _x``, and ``m._x`` where ``m`` names a module of ours (bound by
    ``import m as alias`` or ``from package import m``), as ``file:line: module -> m._x``."""
    mods = modules()
    out = []
    for name, (f, is_pkg) in mods.items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        where = f.relative_to(REPO)
        aliases: dict[str, str] = {}  # local name -> module of ours it binds
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in mods:
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                for a, t in zip(node.names, _targets(node, name, is_pkg, mods)):
                    if t in mods and t.endswith("." + a.name):  # a submodule taken by name
                        aliases[a.asname or a.name] = t
                    elif _is_private(a.name) and t != name:
                        out.append(f"{where}:{node.lineno}: {name} -> {t}.{a.name}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            dotted, v = [], node.value
            while isinstance(v, ast.Attribute):
                dotted.append(v.attr)
                v = v.value
            if not isinstance(v, ast.Name):
                continue
            if not dotted and v.id in aliases:
                target = aliases[v.id]
            else:
                target = ".".join([v.id, *reversed(dotted)])  # a dotted module name: import a.b
                if target not in mods:
                    continue
            if target != name:
                out.append(f"{where}:{node.lineno}: {name} -> {target}.{node.attr}")
    return sorted(set(out))


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out
