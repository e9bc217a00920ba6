"""A 1,000-detector TOAST focal plane mapped on 2 ranks: preprocess and realize with ``--instrument-root``.

Kept small in samples (1,000 detectors x 120 s at 5 Hz = 600,000 samples, nside 16): the point is the
size of the focal plane, its per-detector 1/f noise, and that 1 and 2 ranks give the same map.
``benchmarks/bench_focal_plane.py`` times the same on longer observations.
"""

from __future__ import annotations

import healpy as hp
import numpy as np
import pytest
from mpi_support import realize, run_ranks

from schemas.result import RealizationResult
from tests.support.toast_files import hexagon_focal_plane

pytestmark = pytest.mark.mpi

DETECTORS = 1_000


def spec_text(sha256: str) -> str:
    return f"""
name = "toast focal plane"
kind = "signal+noise"
realizations = 1
seed = 7

[scan]
kind = "satellite"
duration_s = 120.0
chunk_s = 60.0
spin_period_s = 60.0
precession_period_s = 600.0
drift_deg_per_day = 2880.0

[focal_plane]
sample_rate_hz = 5.0
file = "fp/hexagon.h5"
sha256 = "{sha256}"
select = {{ first = {DETECTORS} }}

[pixelization]
nside = 16

[sky]
kind = "cmb"
seed = 1
fwhm_arcmin = 300.0

[solver]
tol = 1e-10
max_iter = 300
reduction = "alltoallv"
"""


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toast-fp")
    (folder / "instruments" / "fp").mkdir(parents=True)
    sha = hexagon_focal_plane(folder / "instruments" / "fp" / "hexagon.h5", n_pix=547, width_deg=10.0)  # 1,094 detectors
    spec = folder / "spec.toml"
    spec.write_text(spec_text(sha))
    return folder, spec


def test_a_thousand_detector_focal_plane_maps_on_two_ranks_as_on_one(campaign):
    folder, spec = campaign
    root = str(folder / "instruments")
    plan = folder / "plan.bin"
    built = run_ranks(2, "-m", "mapmaker", "preprocess", "--spec", str(spec), "--out", str(plan), "--instrument-root", root)
    assert built.returncode == 0, built.stderr[-3000:]
    two = realize(2, spec, 0, folder / "n2", "--plan", str(plan), "--instrument-root", root, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    one = realize(1, spec, 0, folder / "n1", "--instrument-root", root, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]

    result = RealizationResult.model_validate_json((folder / "n2" / "result.json").read_text())
    assert result.samples == DETECTORS * 600 and result.converged and result.ranks == 2
    maps = {n: hp.read_map(folder / f"n{n}" / "map_iqu.fits", field=(0, 1, 2)) for n in (1, 2)}
    solved = maps[1][0] != hp.UNSEEN
    np.testing.assert_array_equal(maps[2][0] != hp.UNSEEN, solved)
    for stokes in range(3):
        scale = np.abs(maps[1][stokes][solved]).max()
        np.testing.assert_allclose(maps[2][stokes][solved], maps[1][stokes][solved], rtol=0, atol=1e-8 * scale)


def test_without_the_instrument_root_the_programs_refuse_with_exit_2(campaign):
    folder, spec = campaign
    refused = realize(2, spec, 0, folder / "refused")
    assert refused.returncode == 2
    assert "hexagon.h5" in refused.stderr and "instrument_root" in refused.stderr
