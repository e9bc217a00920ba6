"""Run real MPI ranks from tests: the venv's mpiexec with ``python -m mpi4py``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVERS = Path(__file__).resolve().parent / "drivers"


def mpiexec() -> Path:
    """The mpiexec beside the interpreter (the pip ``mpich`` wheel puts it there)."""
    path = Path(sys.executable).with_name("mpiexec")
    if not path.exists():
        pytest.fail(f"no mpiexec next to {sys.executable}; run scripts/bootstrap --test")
    return path


def run_ranks(n: int, *args: str, timeout: float = 300, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``mpiexec -n n python -m mpi4py ARGS``; output captured as text."""
    command = [str(mpiexec()), "-n", str(n), sys.executable, "-m", "mpi4py", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def realize(n: int, spec: Path, realization: int, out: Path, *extra: str, timeout: float = 300):
    return run_ranks(
        n, "-m", "mapmaker", "realize", "--spec", str(spec), "--realization", str(realization), "--out", str(out), *extra,
        timeout=timeout,
    )
