"""The benchmarks run from the environment ``scripts/demo`` makes: no test tools there, and no ``tests/``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted((REPO / "benchmarks").glob("bench_*.py"))
# Run a script as ``python benchmarks/bench_x.py --help`` would, with pytest and the tests package unimportable.
WITHOUT_TESTS = (
    "import runpy, sys; sys.modules['pytest'] = None; sys.modules['tests'] = None; "
    "sys.argv = [sys.argv[1], '--help']; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_every_benchmark_is_found():
    assert {path.name for path in BENCHMARKS} >= {"bench_dispatch.py", "bench_load.py", "bench_service.py"}


@pytest.mark.parametrize("script", [*BENCHMARKS, REPO / "benchmarks" / "_support.py"], ids=lambda path: path.name)
def test_no_benchmark_imports_the_tests_or_pytest(script):
    imported = imported_modules(script)
    assert not {name for name in imported if name.split(".")[0] in ("tests", "pytest")}


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.name)
def test_a_benchmark_answers_help_without_pytest_and_offers_json(script):
    done = subprocess.run([sys.executable, "-c", WITHOUT_TESTS, str(script)], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "--json" in done.stdout
