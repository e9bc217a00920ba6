"""Monte Carlo products of real campaigns mapped under ``mpiexec -n 2``: noise bias and transfer function.

Each campaign's realisations run through ``mapmaker.programs.realize.realize_to_folder``
(what ``python -m mapmaker realize`` runs) in one ``mpiexec`` job
(``drivers/run_realizations.py``), and are added to the aggregates with the
service's own update (``service.products.aggregates.include_realization``),
as the result hook does.

Tolerances and why:

* noise bias: white noise, four co-located detectors at 0/45/90/135 deg,
  so each pixel's I variance is exactly sigma^2 / h_p and its Q, U variance
  2 sigma^2 / h_p. The expected level is
  ``N = Omega_pix sum_p(mask_p^2 var_p) / sum_p(mask_p^2)`` (the pseudo-level
  over w2). 12 realisations, bins of 16 in ell to 2 nside = 64, fsky ~ 0.7:
  the mean's scatter is 1.5-4 % (TT) and 2-9 % (EE, BB, the lowest bin
  being the worst); every bin must be within 10 %.
* transfer function: a noiseless signal-only scan that covers the whole
  sky (mask = 1, w2 = 1), beam 3 deg FWHM, nside 16. F_l = 1 up to the
  analysis error (below 3 %) and the Monte Carlo scatter of the mean of 48
  realisations, about sqrt(2 / (N_modes N_real)): 1-1.5 % per bin for
  ell >= 10, up to 2.3 % for EE in [10, 17], whose steep C_l gives the bin
  fewer effective modes. Bins from ell = 10 to 2 nside = 32 must be within
  5 % (2 to 5 sd).
"""

import json
import math
import shutil

import healpy as hp
import numpy as np
import pytest
from mpi_support import DRIVERS, run_ranks

from service.products.aggregates import include_realization, load_state, spectra_aggregates
from service.storage import CampaignProducts

pytestmark = pytest.mark.mpi

NOISE_SPEC = """
name = "noise bias test"
kind = "noise-only"
realizations = 12
seed = 7

[scan]
kind = "satellite"
duration_s = 7200.0
chunk_s = 900.0
spin_period_s = 60.0
spin_angle_deg = 50.0
precession_period_s = 600.0
precession_angle_deg = 45.0
drift_deg_per_day = 1440.0

[focal_plane]
sample_rate_hz = 5.0
detectors = [
  { name = "D0", offset_x_deg = 0.5, pol_angle_deg = 0.0 },
  { name = "D45", offset_x_deg = 0.5, pol_angle_deg = 45.0 },
  { name = "D90", offset_x_deg = 0.5, pol_angle_deg = 90.0 },
  { name = "D135", offset_x_deg = 0.5, pol_angle_deg = 135.0 },
]

[pixelization]
nside = 32

[sky]
kind = "none"

[noise]
net_k_sqrt_s = 100e-6
f_knee_hz = 0.0

[products]
ell_bin_width = 16
apodization_deg = 5.0
min_hits = 3

[resources]
ranks = 2
"""

# A fast drift (360 deg in 3 hours) and a 30 s spin cover the whole sphere at nside 16.
SIGNAL_SPEC = """
name = "transfer function test"
kind = "signal-only"
realizations = 48
seed = 11

[scan]
kind = "satellite"
duration_s = 10800.0
chunk_s = 900.0
spin_period_s = 30.0
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
seed = 3
fwhm_arcmin = 180.0

[noise]
enabled = false

[solver]
tol = 1e-10
rcond_min = 1e-3

[products]
ell_bin_width = 8

[resources]
ranks = 2
"""


def run_campaign(folder, text, realizations):
    spec = folder / "spec.toml"
    spec.write_text(text)
    out = folder / "maps"
    completed = run_ranks(
        2, str(DRIVERS / "run_realizations.py"), str(spec), str(out), "0", str(realizations), timeout=600
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    files = CampaignProducts(folder / "campaigns", 1)
    for product_dir in sorted(out.glob("r*")):
        result = json.loads((product_dir / "result.json").read_text())
        assert include_realization(files, result["realization"], result, product_dir)
    return out, files


@pytest.fixture(scope="module")
def noise_campaign(tmp_path_factory):
    folder = tmp_path_factory.mktemp("noise-only")
    yield run_campaign(folder, NOISE_SPEC, 12)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def signal_campaign(tmp_path_factory):
    folder = tmp_path_factory.mktemp("signal-only")
    yield run_campaign(folder, SIGNAL_SPEC, 48)
    shutil.rmtree(folder, ignore_errors=True)


def test_noise_bias_is_the_white_noise_level(noise_campaign):
    out, files = noise_campaign
    state = load_state(files)
    aggregates = spectra_aggregates(state)
    assert aggregates.n == 12 and aggregates.noise_bias_available and not aggregates.transfer_available
    hits = hp.read_map(out / "r0000" / "hits.fits", dtype=np.float64)
    hits[hits == hp.UNSEEN] = 0  # cut-sky: UNSEEN where unobserved
    mask = hp.read_map(out / "r0000" / "mask.fits")
    assert aggregates.w2 == pytest.approx(np.mean(mask**2), rel=1e-12) and 0.1 < aggregates.w2 < aggregates.fsky < 1
    inside = mask > 0
    assert hits[inside].min() >= 3
    sigma2 = (100e-6) ** 2 * 5.0  # NET^2 f_s, K^2 per sample
    omega = 4 * math.pi / hits.size
    level_i = omega * np.sum(mask[inside] ** 2 * sigma2 / hits[inside]) / np.sum(mask**2)
    expected = {"TT": level_i, "EE": 2 * level_i, "BB": 2 * level_i}
    bias = aggregates.noise_bias()
    ratios = {name: bias[name][0] / expected[name] for name in expected}
    print("\nN_l / analytic white-noise level per bin", aggregates.ell_min.tolist(), aggregates.ell_max.tolist())
    for name, ratio in ratios.items():
        print(f"  {name}: {np.round(ratio, 4).tolist()}")
        assert np.all(np.abs(ratio - 1) < 0.10), (name, ratio)
    # Cross spectra of independent I, Q, U noise vanish: within 4 sd of the mean of 12 draws.
    for name in ("TE", "EB", "TB"):
        value, scatter = bias[name]
        assert np.all(np.abs(value) < 4 * scatter / math.sqrt(12)), (name, value, scatter)


def test_mask_is_stored_once_and_is_the_same_in_every_realisation(noise_campaign):
    out, files = noise_campaign
    state = load_state(files)
    assert state.mask["realization"] == 0 and files.mask_path.read_bytes() == (out / "r0000" / "mask.fits").read_bytes()
    assert not (out / "r0005" / "mask.fits").exists()  # the mask goes with realisation 0 and a built coupling
    assert not [warning for warning in state.warnings if "mask" in warning]
    assert state.n_included == state.n_spectra == state.n_maps == 12


def test_transfer_function_of_a_full_sky_noiseless_scan_is_one(signal_campaign):
    out, files = signal_campaign
    result = json.loads((out / "r0000" / "result.json").read_text())
    assert result["cut_pixels"] == 0 and result["observed_pixels"] == 12 * 16**2
    state = load_state(files)
    aggregates = spectra_aggregates(state)
    assert aggregates.n == 48 and aggregates.transfer_available and not aggregates.noise_bias_available
    assert aggregates.w2 == 1.0 and aggregates.fsky == 1.0
    assert aggregates.beam_fwhm_arcmin == 180.0
    resolved = aggregates.ell_min >= 10
    assert aggregates.ell_min[resolved].tolist() == [10, 18, 26] and aggregates.ell_max[-1] == 32
    transfer = aggregates.transfer_function()
    print("\nF_l per bin", aggregates.ell_min.tolist(), aggregates.ell_max.tolist())
    for name, (value, scatter) in transfer.items():
        print(
            f"  {name}: {np.round(value, 4).tolist()}  (error of the mean {np.round(scatter / math.sqrt(48), 4).tolist()})"
        )
        assert np.all(np.abs(value[resolved] - 1) < 0.05), (name, value)
