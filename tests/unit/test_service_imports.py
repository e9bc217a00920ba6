"""Service features (the packages under service/) import one way: no cycle between them.

Where two features must talk both ways, the lower one offers a seam (a hook list, a function
passed in by service.app) instead of importing the higher one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"


def features() -> set[str]:
    return {path.name for path in SERVICE.iterdir() if (path / "__init__.py").is_file()}


def imported_modules(path: Path) -> Iterator[str]:
    """Every absolute module a file imports, deferred imports inside functions included."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # `from service import campaigns`


def feature_graph() -> dict[str, set[str]]:
    """feature -> the other features its modules import."""
    known = features()
    graph: dict[str, set[str]] = {feature: set() for feature in known}
    for feature in known:
        for path in (SERVICE / feature).rglob("*.py"):
            for module in imported_modules(path):
                parts = module.split(".")
                if len(parts) > 1 and parts[0] == "service" and parts[1] in known and parts[1] != feature:
                    graph[feature].add(parts[1])
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


def test_service_features_import_one_way():
    graph = feature_graph()
    assert {"campaigns", "events", "queue", "workers"} <= set(graph)  # the walk sees the features
    assert "events" in graph["campaigns"]  # and their imports
    cycle = find_cycle(graph)
    assert cycle is None, "service features import each other in a cycle: " + " -> ".join(cycle or [])
