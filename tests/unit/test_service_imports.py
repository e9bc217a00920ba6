"""The parts of service/ import one way: no cycle between them.

A part is a package under service/ (a feature: campaigns, auth, dashboard...) or a module directly in it
(deps, errors, db...). Where two parts must talk both ways, the lower one offers a seam (a hook list, a
function passed in by service.app) instead of importing the higher one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"


def features() -> set[str]:
    return {path.name for path in SERVICE.iterdir() if (path / "__init__.py").is_file()}


def parts() -> dict[str, list[Path]]:
    """Every part of service/ -> its files: each package (all its modules) and each top-level module."""
    found = {feature: sorted((SERVICE / feature).rglob("*.py")) for feature in features()}
    for path in SERVICE.glob("*.py"):
        if path.name != "__init__.py":
            found[path.stem] = [path]
    return found


def imported_modules(path: Path) -> Iterator[str]:
    """Every absolute module a file imports, deferred imports inside functions included."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # `from service import campaigns`


def part_graph() -> dict[str, set[str]]:
    """part -> the other parts of service/ its files import."""
    known = parts()
    graph: dict[str, set[str]] = {part: set() for part in known}
    for part, paths in known.items():
        for path in paths:
            for module in imported_modules(path):
                names = module.split(".")
                if len(names) > 1 and names[0] == "service" and names[1] in known and names[1] != part:
                    graph[part].add(names[1])
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for child in sorted(graph.get(node, ())):
            if (cycle := visit(child, [*path, node])) is not None:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        if (cycle := visit(start, [])) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_parts_of_service_import_one_way():
    graph = part_graph()
    assert {"campaigns", "events", "queue", "workers"} <= set(graph)  # the walk sees the features
    assert {"app", "deps", "errors", "db", "config"} <= set(graph)  # and the modules beside them
    assert "events" in graph["campaigns"] and "auth" in graph["deps"]  # and their imports
    cycle = find_cycle(graph)
    assert cycle is None, "parts of service/ import each other in a cycle: " + " -> ".join(cycle or [])
