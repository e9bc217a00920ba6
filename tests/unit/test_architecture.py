"""The import direction of the project's packages, read from the source (every import, also those inside functions).

``schemas`` is the floor: the contracts every program speaks, importing none of the others. The map-maker,
the service and the worker each build on ``schemas`` alone and never import one another: the worker starts
the map-maker as a program (``python -m mapmaker ...``) and talks to the service over HTTP only (through
``schemas.transport``, the HTTP transport it shares with the user's client). ``mapcampaign`` (the public
client) builds on ``schemas``; only its command line, ``mapcampaign/cli/``, starts the service and a worker
(``serve``, ``up``, ``demo``, ``worker``, ``db``, ``token``) and so imports them: it is the top.
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
# The command line may reach everything: it runs the service and a worker in-process or as children.
TOP = "mapcampaign/cli/"
# The exceptions, and why (none at present; an entry names one module and is checked to be still needed).
EXCEPTIONS: dict[tuple[str, str], set[str]] = {}


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
            if module.startswith(TOP):
                continue
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


def test_the_service_imports_neither_the_worker_nor_the_client():
    """The service runs without the worker or the client installed beside it: not one of its modules (its
    former command line included) imports ``worker`` or ``mapcampaign``."""
    crossing = {
        module: others & {"worker", "mapcampaign"}
        for module, others in project_imports("service").items()
        if others & {"worker", "mapcampaign"}
    }
    assert crossing == {}
    assert not (REPO / "service" / "cli").exists(), "the command line lives in mapcampaign/cli/"


def test_the_client_below_its_command_line_imports_only_schemas():
    """``import mapcampaign`` (the client, errors, products) must not drag in the service or the worker."""
    wrong = {
        module: others - {"schemas"}
        for module, others in project_imports("mapcampaign").items()
        if not module.startswith(TOP) and others - {"schemas"}
    }
    assert wrong == {}


def test_the_command_line_is_where_the_service_and_worker_are_reached():
    """The exemption for mapcampaign/cli/ is not vacuous: the CLI does import both (serve, worker)."""
    reached = set().union(*(others for module, others in project_imports("mapcampaign").items() if module.startswith(TOP)))
    assert {"service", "worker"} <= reached


# Where the service may raise the web framework's own exceptions: modules that are routers (they define an
# ``APIRouter`` or are named ``router.py``) and the one place domain errors become HTTP answers.
HTTP_RAISERS = {"service/errors.py"}
WEB_FRAMEWORKS = ("fastapi", "starlette")


def http_exceptions_raised(path: Path) -> list[int]:
    """Lines of ``path`` that raise a name imported from FastAPI or Starlette (``raise HTTPException(...)``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    web_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in WEB_FRAMEWORKS:
            web_names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            web_names.update(
                alias.asname or alias.name.split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] in WEB_FRAMEWORKS
            )
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            while isinstance(target, ast.Attribute):
                target = target.value
            if isinstance(target, ast.Name) and target.id in web_names:
                lines.append(node.lineno)
    return lines


def is_router(path: Path) -> bool:
    return path.name == "router.py" or "APIRouter(" in path.read_text()


def test_only_routers_and_the_error_mapping_raise_http_exceptions():
    """Services raise domain errors (service.errors.DomainError); their HTTP answer is decided in service/errors.py."""
    wrong = []
    for path in sorted((REPO / "service").rglob("*.py")):
        module = str(path.relative_to(REPO))
        if module in HTTP_RAISERS or is_router(path):
            continue
        wrong.extend(f"{module}:{line}" for line in http_exceptions_raised(path))
    assert wrong == [], "HTTP exceptions raised outside routers and service/errors.py:\n" + "\n".join(wrong)


def test_the_http_exception_reader_finds_one(tmp_path):
    """The check would pass vacuously if a raise were missed: each spelling is found, a domain error is not."""
    module = tmp_path / "probe.py"
    module.write_text(
        "import fastapi\nfrom fastapi.exceptions import RequestValidationError as Invalid\n"
        "from service.errors import NotFound\n\n"
        "def check(x):\n    if x == 1:\n        raise Invalid([])\n    if x == 2:\n"
        "        raise fastapi.HTTPException(404)\n    raise NotFound('no')\n"
    )
    assert http_exceptions_raised(module) == [7, 9]


def test_every_http_raiser_still_raises():
    """An entry of HTTP_RAISERS that no longer raises one is dropped, so the list cannot grow stale."""
    for module in HTTP_RAISERS - {"service/errors.py"}:
        assert http_exceptions_raised(REPO / module), f"{module} raises no HTTP exception: drop it from HTTP_RAISERS"
