"""The import direction of the project's packages, read from the source (every import, also those inside functions).

``schemas`` is the floor: the contracts every program speaks, importing none of the others. The map-maker,
the service and the worker each build on ``schemas`` alone and never import one another: the worker starts
the map-maker as a program (``python -m mapmaker ...``) and talks to the service over HTTP only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "mapmaker", "service", "worker", "mapcampaign")

# What each package may import of the project's own packages (besides itself).
ALLOWED = {
    "schemas": set(),
    "mapmaker": {"schemas"},
    "worker": {"schemas"},
    "service": {"schemas"},
    "mapcampaign": {"schemas"},
}
# The exceptions, and why: the CLI's `up`, `demo` and `worker` commands start a worker beside the service, and
# the CLI reads its connection defaults from the client. They go when the CLI moves into mapcampaign/ (issue 22).
EXCEPTIONS = {
    ("service", "worker"): {"service/cli/worker.py", "service/cli/_stack.py"},
    ("service", "mapcampaign"): {"service/cli/_client.py"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every absolute import in ``path`` (relative imports stay inside the package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def project_imports(package: str) -> dict[str, set[str]]:
    """For each module of ``package``: the other project packages it imports."""
    found = {}
    for path in sorted((REPO / package).rglob("*.py")):
        others = (imported_packages(path) & set(PACKAGES)) - {package}
        if others:
            found[str(path.relative_to(REPO))] = others
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_lies_below_it(package):
    wrong = []
    for module, others in project_imports(package).items():
        for other in others - ALLOWED[package]:
            if module not in EXCEPTIONS.get((package, other), set()):
                wrong.append(f"{module} imports {other}")
    assert wrong == [], "imports against the direction schemas <- mapmaker | service | worker:\n" + "\n".join(wrong)


def test_the_reader_sees_imports_inside_functions(tmp_path):
    """The check would pass vacuously if deferred imports were missed: a function-level import is found."""
    module = tmp_path / "probe.py"
    module.write_text("import os\n\ndef run():\n    from worker.agent import Agent\n    import mapmaker.cli\n")
    assert imported_packages(module) == {"os", "worker", "mapmaker"}


def test_every_exception_is_still_needed():
    """An exception that no longer imports across is removed from the list, so the list cannot grow stale."""
    for (package, other), modules in EXCEPTIONS.items():
        imports = project_imports(package)
        for module in modules:
            assert other in imports.get(module, set()), f"{module} no longer imports {other}: drop the exception"
