"""The E/B transfer matrix on a masked, pixelised sky: it debiases pure-B MASTER's BB where the per-bin F_b cannot.

The skies are the map-maker's own (``mapmaker.model.sky``: band-limited at 3 nside - 1, evaluated at the pixel
centres), which is what a noiseless solve returns; their bandpowers are the campaigns' (pspy's pure-B MASTER,
``mapmaker.model.bandpowers``). The map-maker's wiring of the sky option is checked end to end in
``tests/mpi/test_transfer_matrix_mpi.py``.

Set-up: nside 64, a polar cap of fsky 0.41 apodised over 3 deg (pspy's C2), 1 deg beam, bins of 16. Pure-B
MASTER leaves an E -> B leakage of about 65, 12, 8, 6, 6 % of the lensing BB in the judged bins (ell 34 to 113:
from 2 bin widths up to 2 nside). Five independent sets of N_SIMS skies: the pure-E and the pure-B campaign
(the matrix), a fiducial signal-only campaign (the per-bin F_b), and two "data" sets, lensing BB (r = 0) and
ten times that BB (a stand-in for r > 0), each judged by its mean.

Judged: the data mean corrected by the inverse matrix against the input bandpowers (the input C_l with the beam
through the diagonal windows, what a corrected bandpower estimates), with sigma = the data mean's Monte Carlo
error propagated through the inverse (the set's own covariance / N_SIMS) and the matrix's own error, in
quadrature: every judged bin of EE and BB within 3 sigma, for both inputs. The F_b correction of the BB x 10 data,
judged the same way (its error with F_b's), is more than 5 sigma off in at least one bin: it folds the additive
E -> B leakage into a factor that is right for the lensing BB only.
"""

from __future__ import annotations

import healpy as hp
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from mapmaker.model import bandpowers as bp
from mapmaker.model import sky
from schemas import montecarlo
from schemas.spec import CmbSky

NSIDE = 64
BIN_WIDTH = 16
BEAM_FWHM_ARCMIN = 60.0
APODISATION_DEG = 3.0
N_SIMS = 40
EE, BB = 1, 2


def input_cls(polarization: str = "both", bb_factor: float = 1.0) -> np.ndarray:
    """[n_ell, 4] K^2 (TT EE BB TE) of a campaign's sky (the spec's sky option), BB scaled by ``bb_factor``."""
    cls = sky.sky_input_cls(CmbSky(polarization=polarization)).copy()
    cls[:, 2] *= bb_factor
    return cls


@pytest.fixture(scope="module")
def campaigns():
    return simulate_campaigns(N_SIMS)


def simulate_campaigns(n_sims: int, first_seed: int = 5800) -> dict:
    """The mask, binning, ``samples[set] [n_sims, 6, n_bins]``, each set's model bandpowers and the truths."""
    theta, _ = hp.pix2ang(NSIDE, np.arange(hp.nside2npix(NSIDE)))
    hits = np.where(theta < np.radians(80.0), 10.0, 0.0)
    mask = bp.analysis_mask(hits, apodisation_deg=APODISATION_DEG)
    binning = bp.Binning.for_nside(NSIDE, BIN_WIDTH)
    lmax = 3 * NSIDE - 1
    fwhm = np.radians(BEAM_FWHM_ARCMIN / 60.0)
    sets = {
        "E": input_cls("E-only"),
        "B": input_cls("B-only"),
        "F": input_cls(),
        "data r=0": input_cls(),
        "data BBx10": input_cls(bb_factor=10.0),
    }
    with threadpool_limits(limits=1, user_api="openmp"):
        coupling = bp.build_coupling(mask, binning)
        samples = {}
        for seed, (name, cls) in enumerate(sets.items()):
            samples[name] = np.array(
                [
                    bp.decoupled_bandpowers(
                        sky.synthesize_cmb(cls, NSIDE, lmax, fwhm, sky.rng.generator((first_seed + seed, i))), coupling
                    ).cb
                    for i in range(n_sims)
                ]
            )

    def model(cls: np.ndarray, keep: tuple[int, ...] = (0, 1, 2, 3)) -> np.ndarray:
        rows = np.zeros((4, lmax + 1))
        for row in keep:
            rows[row] = cls[: lmax + 1, row]
        return bp.model_bandpowers(coupling, rows, beam_fwhm_arcmin=BEAM_FWHM_ARCMIN)

    return {
        "mask": mask,
        "binning": binning,
        "samples": samples,
        "models": {name: model(cls) for name, cls in sets.items()},
        # What a corrected EE or BB estimates: that input alone through its own window.
        "truth": {name: np.stack([model(cls, (0,))[0], model(cls, (1,))[EE], model(cls, (2,))[BB]])
                  for name, cls in sets.items()},
    }


def judged(binning: bp.Binning) -> np.ndarray:
    return (binning.ell_lo >= 2 + 2 * binning.bin_width) & binning.reliable_bins


def test_matrix_corrected_bandpowers_are_unbiased_where_the_per_bin_transfer_function_is_not(campaigns):
    mask, binning, samples, models = (campaigns[key] for key in ("mask", "binning", "samples", "models"))
    assert 0.3 <= np.mean(mask > 0) <= 0.6
    bins = judged(binning)
    assert bins.sum() == 5
    matrix = montecarlo.transfer_matrix_from_samples(samples["E"], models["E"], samples["B"], models["B"])
    leakage = matrix.matrix[:, 2, 0] * models["E"][EE] / models["F"][BB]  # E -> B over the lensing BB
    print("\nbins", binning.ell_lo[bins], "E->B leakage / lensing BB", np.round(leakage[bins], 3))
    assert np.all(leakage[bins] > 5 * matrix.error[bins, 2, 0] * models["E"][EE][bins] / models["F"][BB][bins])
    transfer_b, transfer_error = montecarlo.transfer_function(samples["F"], models["F"])
    zero = np.zeros((6, binning.n_bins))
    worst_f_b = 0.0
    for name in ("data r=0", "data BBx10"):
        data = samples[name]
        covariance_of_mean = montecarlo.bandpower_covariance(data)[0] / len(data)
        corrected = montecarlo.matrix_debiased_bandpowers(
            data.mean(axis=0), noise_bias_cb=zero, matrix=matrix, covariance=covariance_of_mean
        )
        truth = campaigns["truth"][name]
        for row, spectrum in ((EE, "EE"), (BB, "BB")):
            z = (corrected.cb[row] - truth[row]) / corrected.sigma[row]
            print(
                f"{name} {spectrum}: matrix bias / input {np.round((corrected.cb[row] / truth[row] - 1)[bins], 4)}"
                f" sigma / input {np.round((corrected.sigma[row] / truth[row])[bins], 4)}"
                f" (matrix part {np.round((corrected.sigma_matrix[row] / truth[row])[bins], 4)}) z {np.round(z[bins], 2)}"
            )
            assert np.all(np.abs(z[bins]) < 3), f"{name} {spectrum}: z = {z[bins]}"
        # The per-bin F_b of the fiducial campaign on the same data.
        by_f_b, sigma_by_f_b = montecarlo.debiased_bandpowers(
            data.mean(axis=0), noise_bias_cb=zero, transfer_b=transfer_b, covariance=covariance_of_mean
        )
        sigma_f = np.hypot(sigma_by_f_b[BB], by_f_b[BB] * transfer_error[BB] / transfer_b[BB])
        z_f = (by_f_b[BB] - truth[BB]) / sigma_f
        print(
            f"{name} BB by F_b: bias / input {np.round((by_f_b[BB] / truth[BB] - 1)[bins], 4)}"
            f" sigma / input {np.round((sigma_f / truth[BB])[bins], 4)} z {np.round(z_f[bins], 2)}"
        )
        worst_f_b = max(worst_f_b, float(np.max(np.abs(z_f[bins]))))
    assert worst_f_b > 5, f"the per-bin F_b correction is within {worst_f_b:.2f} sigma of both inputs"
