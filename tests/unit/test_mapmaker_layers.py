"""The map-maker's wings import downwards only: kernels <- model <- parallel <- solve <- programs."""
import ast
from pathlib import Path

MAPMAKER = Path(__file__).resolve().parents[2] / "mapmaker"
WINGS = ["kernels", "model", "parallel", "solve", "programs"]


def imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.append(node.module)
            modules.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
    return modules


def test_every_module_imports_its_own_wing_or_lower_ones():
    upward = []
    for wing_index, wing in enumerate(WINGS):
        for path in sorted((MAPMAKER / wing).rglob("*.py")):
            for module in imported_modules(path):
                parts = module.split(".")
                lower = parts[0] == "mapmaker" and len(parts) > 1 and parts[1] in WINGS
                if lower and WINGS.index(parts[1]) > wing_index:
                    upward.append(f"{path.relative_to(MAPMAKER)} imports {module}")
    assert upward == []


def test_no_module_is_left_beside_the_wings():
    loose = {path.name for path in MAPMAKER.glob("*.py")}
    assert loose == {"__init__.py", "__main__.py"}


def test_kernels_and_models_never_import_mpi():
    for wing in ("kernels", "model"):
        for path in sorted((MAPMAKER / wing).rglob("*.py")):
            assert not any(module.startswith("mpi4py") for module in imported_modules(path)), path
