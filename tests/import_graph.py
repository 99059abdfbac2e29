"""Every import between this project's modules, module-level and function-level alike, read from the
source with ast (nothing is imported): what test_layers.py checks the layering with.

    python tests/import_graph.py [PACKAGE]    # modules, edges, import cycles of PACKAGE
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: str) -> dict[str, Path]:
    base = ROOT.joinpath(*package.split("."))
    return {module_name(p): p for p in sorted(base.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (a `from pkg import mod` names the module mod)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
            if not all(t in known for t in targets):  # (names from the module itself, not submodules)
                targets.append(base)
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph(package: str, within: str | None = None) -> dict[str, set[str]]:
    """{module: project modules it imports} for every module of `package`; edges kept only to
    modules under `within` (default: the package itself)."""
    every = modules(within or package)
    every.update(modules(package))
    known = set(every)
    return {m: imports_of(m, p, known) & set(every) for m, p in modules(package).items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    pkg = sys.argv[1] if len(sys.argv) > 1 else "spyre_inductor.compiler"
    g = graph(pkg)
    cs = cycles(g)
    print(f"{len(g)} modules, {sum(map(len, g.values()))} import edges, {len(cs)} cycles")
    for c in cs:
        print(f"  cycle of {len(c)}: {' '.join(m.removeprefix(pkg + '.') for m in c)}")
