"""The E/B transfer matrix of real pure-E and pure-B campaigns mapped under ``mpiexec -n 1`` and ``-n 2``.

A noiseless signal-only satellite patch at nside 32 (one 90-minute drift of a 50 deg spin circle, four
co-located detectors at 0/45/90/135 deg, fsky ~0.4, 5 deg apodisation), 3 realisations of each sky
option. Each campaign's realisations run through ``realize_to_folder`` (what ``python -m mapmaker realize``
runs) in one ``mpiexec`` job and join the aggregates through the service's own update, as the result hook
does. The matrix from 2 ranks must equal the 1-rank one: a noiseless solve to tol 1e-10 returns the same
map on any number of ranks (to ~1e-10), so the matrix agrees to 1e-6 relative. The wiring is checked too: the
pure-E campaign's model has no BB and the pure-B one's no EE nor TE, the diagonal is near 1 and the E -> B
leakage positive.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from mpi_support import DRIVERS, run_ranks

from schemas import montecarlo
from service.products.aggregates import bandpower_aggregates, include_realization, load_state
from service.storage import CampaignProducts

pytestmark = pytest.mark.mpi

REALIZATIONS = 3

SPEC = """
name = "transfer matrix {polarization} on {ranks} ranks"
kind = "signal-only"
realizations = 3
seed = 38

[scan]
kind = "satellite"
duration_s = 5400.0
chunk_s = 900.0
spin_period_s = 30.0
spin_angle_deg = 50.0
precession_period_s = 600.0
precession_angle_deg = 0.0
drift_deg_per_day = 1440.0

[focal_plane]
sample_rate_hz = 8.0
detectors = [
  {{ name = "A0", offset_x_deg = 0.5, pol_angle_deg = 0.0 }},
  {{ name = "B0", offset_x_deg = 0.5, pol_angle_deg = 90.0 }},
  {{ name = "A1", offset_x_deg = 0.5, pol_angle_deg = 45.0 }},
  {{ name = "B1", offset_x_deg = 0.5, pol_angle_deg = 135.0 }},
]

[pixelization]
nside = 32

[sky]
kind = "cmb"
seed = 5
fwhm_arcmin = 120.0
polarization = "{polarization}"

[noise]
enabled = false

[solver]
tol = 1e-10
rcond_min = 1e-2

[products]
ell_bin_width = 8
apodization_deg = 5.0
min_hits = 3

[resources]
ranks = {ranks}
"""


def run_campaign(folder, polarization, ranks):
    spec = folder / f"{polarization}-{ranks}.toml"
    spec.write_text(SPEC.format(polarization=polarization, ranks=ranks))
    out = folder / f"maps-{polarization}-{ranks}"
    completed = run_ranks(
        ranks, str(DRIVERS / "run_realizations.py"), str(spec), str(out), "0", str(REALIZATIONS), timeout=600
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    files = CampaignProducts(folder / "campaigns", {"E-only": 1, "B-only": 2}[polarization] + 10 * ranks)
    for product_dir in sorted(out.glob("r*")):
        result = json.loads((product_dir / "result.json").read_text())
        assert include_realization(files, result["realization"], result, product_dir)
    return bandpower_aggregates(files, load_state(files))


def matrix_of(pure_e, pure_b):
    return montecarlo.transfer_matrix(
        e_mean=pure_e.mean, e_covariance=pure_e.covariance, e_n=pure_e.n, e_model=pure_e.model,
        b_mean=pure_b.mean, b_covariance=pure_b.covariance, b_n=pure_b.n, b_model=pure_b.model,
    )


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory):
    folder = tmp_path_factory.mktemp("transfer-matrix")
    yield {
        (polarization, ranks): run_campaign(folder, polarization, ranks)
        for polarization in ("E-only", "B-only")
        for ranks in (1, 2)
    }
    shutil.rmtree(folder, ignore_errors=True)


def test_the_campaigns_draw_pure_skies_and_model_them(campaigns):
    pure_e, pure_b = campaigns["E-only", 2], campaigns["B-only", 2]
    assert pure_e.n == pure_b.n == REALIZATIONS
    assert pure_e.mask_sha256 == pure_b.mask_sha256
    ee, bb, te = 1, 2, 3
    reliable = pure_e.reliable & (pure_e.ell_lo >= 2 + 2 * pure_e.bin_width)
    # The input's other modes are 0; what the windows' E <-> B mixing of the pure estimator adds is rounding.
    assert np.all(np.abs(pure_e.model[bb]) < 1e-12 * pure_e.model[ee].max()) and np.all(pure_e.model[ee, reliable] > 0)
    assert np.all(np.abs(pure_b.model[ee]) < 1e-12 * pure_b.model[bb].max()) and np.all(pure_b.model[bb, reliable] > 0)
    assert np.all(pure_b.model[te] == 0)
    matrix = matrix_of(pure_e, pure_b)
    print("\nbins", pure_e.ell_lo[reliable], "\nT[BB, BB]", np.round(matrix.matrix[reliable, 2, 2], 3),
          "\nT[EE, EE]", np.round(matrix.matrix[reliable, 0, 0], 3),
          "\nT[BB, EE]", matrix.matrix[reliable, 2, 0], "+-", matrix.error[reliable, 2, 0])
    # B -> B and E -> E near 1 (3 realisations: within 5 of their Monte Carlo errors or 20 %).
    for column in (0, 2):
        diagonal, error = matrix.matrix[reliable, column, column], matrix.error[reliable, column, column]
        assert np.all(np.abs(diagonal - 1) < np.maximum(5 * error, 0.2)), (column, diagonal, error)
    # E -> B adds power, a few percent of EE at most (at nside 32 it is 0.2-6 % of EE: up to 6 lensing BBs).
    assert np.all(matrix.matrix[reliable, 2, 0] > 0) and np.all(matrix.matrix[reliable, 2, 0] < 0.1)


def test_the_matrix_from_two_ranks_equals_the_one_rank_matrix(campaigns):
    one = matrix_of(campaigns["E-only", 1], campaigns["B-only", 1])
    two = matrix_of(campaigns["E-only", 2], campaigns["B-only", 2])
    assert campaigns["E-only", 1].mask_sha256 == campaigns["E-only", 2].mask_sha256
    finite = np.isfinite(one.matrix)
    judged = campaigns["E-only", 1].reliable & (campaigns["E-only", 1].ell_lo >= 2 + 2 * campaigns["E-only", 1].bin_width)
    assert finite[judged].all()  # a low bin whose model bandpower is not positive (a negative window) is NaN
    np.testing.assert_array_equal(finite, np.isfinite(two.matrix))
    scale = np.abs(one.matrix[finite]).max()
    np.testing.assert_allclose(two.matrix[finite], one.matrix[finite], rtol=1e-6, atol=1e-9 * scale)
    np.testing.assert_allclose(two.error[finite], one.error[finite], rtol=1e-5, atol=1e-9 * scale)
