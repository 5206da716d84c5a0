"""The package's modules import one way: no cycles, lazy imports inside functions included.

A cycle hidden in a function body (`from slicewise.silver import ...` inside reconcile)
works at run time but means two modules each need the other: the code no longer reads
top-down and neither can be understood or tested alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "slicewise"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere in its body (TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from slicewise.kafka import broker` imports the module slicewise.kafka.broker
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, known) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by depth-first search, each once (rotated to its minimum)."""
    found: set[tuple[str, ...]] = set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                loop = path[path.index(nxt) :]
                i = loop.index(min(loop))
                found.add(tuple(loop[i:] + loop[:i]))
            elif len(path) < len(graph):
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return [list(c) for c in sorted(found)]


def test_the_graph_sees_lazy_imports() -> None:
    """The check itself: a function-level import is an edge (else it could not fail)."""
    graph = import_graph()
    assert "slicewise.silver" in graph["slicewise.jobs"]  # imported inside a function there
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in found)
