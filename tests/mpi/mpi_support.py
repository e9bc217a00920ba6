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
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)


def realize(n: int, spec: Path, realization: int, out: Path, *extra: str, timeout: float = 300):
    return run_ranks(
        n, "-m", "mapmaker", "realize", "--spec", str(spec), "--realization", str(realization), "--out", str(out), *extra,
        timeout=timeout,
    )


# 1/f noise and a CMB sky, nside 16, 4 detectors x 2 hours at 5 Hz (144,000 samples, 32 chunks):
# seconds per run. The realize and overlap tests share it.
SMALL_SATELLITE_SPEC = """
name = "small satellite"
kind = "signal+noise"
realizations = 3
seed = 99

[scan]
kind = "satellite"
duration_s = 7200.0
chunk_s = 900.0
spin_period_s = 60.0
spin_angle_deg = 50.0
precession_period_s = 600.0
precession_angle_deg = 45.0
drift_deg_per_day = 2880.0

[focal_plane]
sample_rate_hz = 5.0
detectors = [
  { name = "A0", offset_x_deg = 1.0, pol_angle_deg = 0.0 },
  { name = "B0", offset_x_deg = 1.0, pol_angle_deg = 90.0 },
  { name = "A1", offset_x_deg = -1.0, pol_angle_deg = 45.0 },
  { name = "B1", offset_x_deg = -1.0, pol_angle_deg = 135.0 },
]

[pixelization]
nside = 16

[sky]
kind = "cmb"
seed = 4
fwhm_arcmin = 300.0

[noise]
net_k_sqrt_s = 100e-6
f_knee_hz = 0.5
alpha = 1.0
f_min_hz = 1e-3
interval_s = 300.0

[solver]
tol = 1e-10
max_iter = 500
allreduce_buffer_pixels = 1000
reduction = "allreduce"
"""
