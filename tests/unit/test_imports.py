"""The package's imports go one way (docs/internals.md): no module imports one that imports
it back, deferred imports (inside a function) included, and ``dialects/`` never imports the
core. Read from the source with ``ast``, so an import added anywhere, at any depth, counts;
only imports under ``if TYPE_CHECKING:`` (annotations, never run) are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import aiojobqueue

ROOT = Path(aiojobqueue.__file__).parent


def modules() -> dict[str, Path]:
    found = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = p
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of package modules, by the deepest module a name reaches (a
    package's ``__init__`` importing its own submodules is not counted: it is their index)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        is_pkg = p.name == "__init__.py"
        tree = ast.parse(p.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test)
                       for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                targets = [full] + [f"{full}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and not (is_pkg and t.startswith(m + ".")):
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
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
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle() -> None:
    assert cycles(imports(modules())) == []


def test_a_cycle_is_found() -> None:
    # (the check itself: a cycle of three, and a self-contained chain that is none)
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_dialects_never_import_the_core() -> None:
    allowed = {"aiojobqueue.schema", "aiojobqueue.errors"}
    graph = imports(modules())
    wrong = {m: sorted(t for t in targets if not t.startswith("aiojobqueue.dialects")
                       and t not in allowed)
             for m, targets in graph.items() if m.startswith("aiojobqueue.dialects")}
    assert {m: t for m, t in wrong.items() if t} == {}
