"""A TOAST satellite schedule and focal plane mapped on 2 ranks, through the programs a worker runs.

``mapmaker preprocess`` and ``mapmaker realize`` read both files under ``--instrument-root``; the hit map
written in the ecliptic frame equals the one counted from the map-maker's own pointing in one process, and
1 and 2 ranks give the same map.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import healpy as hp
import numpy as np
import pytest
from mpi_support import realize, run_ranks

from campaignlib.instrument import resolve_files
from mapmaker.model.decomposition import chunk_layout
from mapmaker.model.scan import ChunkPointing
from schemas.io import load_spec
from tests.support.toast_files import hexagon_focal_plane, write_satellite_schedule

pytestmark = pytest.mark.mpi

START = datetime(2027, 3, 1, tzinfo=UTC)
SCANS = [
    {"name": f"scan{i}", "start": START + timedelta(minutes=25 * i), "stop": START + timedelta(minutes=25 * i + 20),
     "prec_period": 10.0, "spin_period": 2.0}
    for i in range(3)
]  # fmt: skip


def spec_text(focal_plane_sha: str, schedule_sha: str) -> str:
    return f"""
name = "toast satellite schedule"
kind = "signal+noise"
realizations = 1
seed = 11

[scan]
kind = "satellite-schedule"
file = "schedules/satellite.ecsv"
sha256 = "{schedule_sha}"
chunk_s = 300.0
spin_angle_deg = 50.0
precession_angle_deg = 45.0

[focal_plane]
sample_rate_hz = 4.0
file = "fp/hexagon.h5"
sha256 = "{focal_plane_sha}"
select = {{ first = 8 }}

[pixelization]
nside = 16

[sky]
kind = "cmb"
seed = 1
fwhm_arcmin = 300.0

[noise]
f_knee_hz = 0.0

[solver]
tol = 1e-10
max_iter = 300
"""


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toast-satellite")
    root = folder / "instruments"
    (root / "fp").mkdir(parents=True)
    (root / "schedules").mkdir()
    focal_plane_sha = hexagon_focal_plane(root / "fp" / "hexagon.h5", n_pix=7, sample_rate_hz=4.0)
    schedule_sha = write_satellite_schedule(root / "schedules" / "satellite.ecsv", SCANS)
    spec = folder / "spec.toml"
    spec.write_text(spec_text(focal_plane_sha, schedule_sha))
    return folder, spec, root


def test_a_satellite_schedule_maps_on_two_ranks_as_on_one(campaign):
    folder, spec, root = campaign
    plan = folder / "plan.bin"
    built = run_ranks(2, "-m", "mapmaker", "preprocess", "--spec", str(spec), "--out", str(plan), "--instrument-root", str(root))
    assert built.returncode == 0, built.stderr[-3000:]
    two = realize(2, spec, 0, folder / "n2", "--plan", str(plan), "--instrument-root", str(root))
    assert two.returncode == 0, two.stderr[-3000:]
    one = realize(1, spec, 0, folder / "n1", "--instrument-root", str(root))
    assert one.returncode == 0, one.stderr[-3000:]

    resolved = resolve_files(load_spec(spec), root)
    layout = chunk_layout(resolved)
    assert layout.n_time_chunks == 12  # three 20-minute scans of four 300 s chunks
    pointing = ChunkPointing(resolved, layout)
    expected = np.zeros(hp.nside2npix(16), dtype=np.int64)
    for time_chunk in range(layout.n_time_chunks):
        for detector in range(8):
            expected += np.bincount(pointing(time_chunk, detector)[0], minlength=expected.size)
    hits, header = hp.read_map(folder / "n2" / "hits.fits", dtype=np.float64, h=True)
    hits = np.where(hits == hp.UNSEEN, 0, hits).astype(np.int64)  # cut-sky form: unobserved pixels read as UNSEEN
    assert dict(header)["COORDSYS"] == "E"
    np.testing.assert_array_equal(hits, expected)

    maps = {n: hp.read_map(folder / f"n{n}" / "map_iqu.fits", field=(0, 1, 2)) for n in (1, 2)}
    solved = maps[1][0] != hp.UNSEEN
    np.testing.assert_array_equal(maps[2][0] != hp.UNSEEN, solved)
    for stokes in range(3):
        scale = np.abs(maps[1][stokes][solved]).max()
        np.testing.assert_allclose(maps[2][stokes][solved], maps[1][stokes][solved], rtol=0, atol=1e-8 * scale)


