"""The E/B transfer matrix (campaignlib.montecarlo) on synthetic bandpowers with a known matrix, and the pure-E /
pure-B sky option of the spec and the sky synthesis."""

from __future__ import annotations

import healpy as hp
import numpy as np
import pytest
from pydantic import ValidationError

from campaignlib import montecarlo
from mapmaker.model import sky
from schemas.spec import CampaignSpec, CmbSky, spec_hash

N_BINS = 5
EE, BB, EB = 1, 2, 4


def known_matrix() -> np.ndarray:
    """[n_bins, 3, 3] (EE, EB, BB) out x in: suppression, a strong E -> B leakage, small B -> E, EB column 1."""
    matrix = np.zeros((N_BINS, 3, 3))
    for b in range(N_BINS):
        matrix[b] = [[0.9 - 0.02 * b, 0.0, 0.01], [0.003, 1.0, -0.002], [0.04 + 0.01 * b, 0.0, 0.8 + 0.03 * b]]
    return matrix


def models() -> tuple[np.ndarray, np.ndarray]:
    """The pure-E and pure-B campaigns' input models [6, n_bins] K^2: EE 100 times the BB."""
    e_model, b_model = np.zeros((6, N_BINS)), np.zeros((6, N_BINS))
    e_model[EE] = np.linspace(2e-14, 1e-14, N_BINS)
    b_model[BB] = np.linspace(3e-16, 1e-16, N_BINS)
    return e_model, b_model


def campaign(matrix: np.ndarray, model: np.ndarray, column: int, n: int, scatter: float, rng) -> np.ndarray:
    """n realisations [n, 6, n_bins] whose (EE, EB, BB) means are matrix[:, :, column] * model, with Gaussian
    scatter of ``scatter`` times the kept model per spectrum."""
    kept = model[montecarlo.MATRIX_ROWS[column]]
    samples = np.zeros((n, 6, N_BINS))
    for out, row in enumerate(montecarlo.MATRIX_ROWS):
        samples[:, row] = matrix[:, out, column] * kept + scatter * kept * rng.standard_normal((n, N_BINS))
    return samples


def test_the_matrix_of_noiseless_campaigns_is_the_known_one_and_its_inverse_undoes_it():
    rng = np.random.default_rng(1)
    matrix = known_matrix()
    e_model, b_model = models()
    e_samples = campaign(matrix, e_model, 0, 3, 0.0, rng)
    b_samples = campaign(matrix, b_model, 2, 3, 0.0, rng)
    estimated = montecarlo.transfer_matrix_from_samples(e_samples, e_model, b_samples, b_model)
    np.testing.assert_allclose(estimated.matrix, matrix, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(estimated.error, 0.0, atol=1e-12)
    # A data vector made by the matrix from a sky of EE = 4x, BB = 7x the models, EB 0, plus a noise bias.
    truth = np.zeros((6, N_BINS))
    truth[EE], truth[BB] = 4 * e_model[EE], 7 * b_model[BB]
    noise = np.full((6, N_BINS), 2e-17)
    data = noise.copy()
    data[list(montecarlo.MATRIX_ROWS)] += np.einsum("bij,jb->ib", matrix, truth[list(montecarlo.MATRIX_ROWS)])
    data[0] += 5e-12  # TT, corrected by F_b = 0.5
    transfer_b = np.full((6, N_BINS), 0.5)
    result = montecarlo.matrix_debiased_bandpowers(data, noise_bias_cb=noise, matrix=estimated, transfer_b=transfer_b)
    np.testing.assert_allclose(result.cb[EE], truth[EE], rtol=1e-10)
    np.testing.assert_allclose(result.cb[BB], truth[BB], rtol=1e-10)
    np.testing.assert_allclose(result.cb[EB], 0.0, atol=1e-12 * truth[BB].max())
    np.testing.assert_allclose(result.cb[0], 1e-11, rtol=1e-12)
    assert result.sigma_data is None and result.sigma is None
    # The per-bin F_b of a campaign of both E and B at the models' level reads BB through (BB + leakage) / BB:
    # right for that sky only; the sky with 7 x BB comes out low.
    f_bb = (matrix[:, 2, 0] * e_model[EE] + matrix[:, 2, 2] * b_model[BB]) / b_model[BB]
    assert np.all((data[BB] - noise[BB]) / f_bb < 0.9 * truth[BB])


def test_monte_carlo_errors_of_the_matrix_and_of_the_correction_match_their_scatter():
    """Errors from one estimate against the scatter of 400 independent estimates (known answers: the spread)."""
    matrix = known_matrix()
    e_model, b_model = models()
    truth = np.zeros((6, N_BINS))
    truth[EE], truth[BB] = e_model[EE], 5 * b_model[BB]
    data = np.zeros((6, N_BINS))
    data[list(montecarlo.MATRIX_ROWS)] = np.einsum("bij,jb->ib", matrix, truth[list(montecarlo.MATRIX_ROWS)])
    rng = np.random.default_rng(7)
    estimates, corrected, stated = [], [], []
    for _ in range(400):
        e_samples = campaign(matrix, e_model, 0, 20, 0.3, rng)
        b_samples = campaign(matrix, b_model, 2, 30, 0.2, rng)
        estimate = montecarlo.transfer_matrix_from_samples(e_samples, e_model, b_samples, b_model)
        result = montecarlo.matrix_debiased_bandpowers(data, noise_bias_cb=np.zeros_like(data), matrix=estimate)
        estimates.append(estimate.matrix)
        corrected.append(result.cb)
        stated.append((estimate.error, result.sigma_matrix))
    estimates, corrected = np.array(estimates), np.array(corrected)
    # Each element's error: 0.3 / sqrt(20) (E column) and 0.2 / sqrt(30) (B column) in units of the model.
    expected = np.zeros((N_BINS, 3, 3))
    expected[:, :, 0], expected[:, :, 2] = 0.3 / np.sqrt(20), 0.2 / np.sqrt(30)
    stated_error = np.sqrt(np.mean([s[0] ** 2 for s in stated], axis=0))  # rms: the variance estimate is unbiased
    np.testing.assert_allclose(stated_error, expected, rtol=0.04)
    np.testing.assert_allclose(estimates.std(axis=0, ddof=1), expected, rtol=0.12, atol=1e-12)
    np.testing.assert_allclose(estimates.mean(axis=0), matrix, atol=4 * expected.max() / np.sqrt(400))
    # The correction's stated matrix error against the scatter of the corrected values (first order in dT).
    stated_sigma = np.mean([s[1] for s in stated], axis=0)
    for row in (EE, BB):
        np.testing.assert_allclose(corrected[:, row].std(axis=0, ddof=1), stated_sigma[row], rtol=0.15)
        assert np.all(np.abs(corrected[:, row].mean(axis=0) - truth[row]) < 4 * stated_sigma[row] / np.sqrt(400) + 0.02 * truth[row])


def test_data_errors_are_propagated_through_the_inverse():
    """sigma_data against the scatter of corrected data drawn from the covariance (exact matrix)."""
    matrix = known_matrix()
    e_model, b_model = models()
    exact = montecarlo.transfer_matrix_from_samples(
        campaign(matrix, e_model, 0, 2, 0.0, np.random.default_rng(0)), e_model,
        campaign(matrix, b_model, 2, 2, 0.0, np.random.default_rng(0)), b_model,
    )
    rng = np.random.default_rng(3)
    p = 6 * N_BINS
    factor = rng.standard_normal((p, p)) * 1e-16
    covariance = factor @ factor.T + np.diag(np.full(p, 1e-32))
    mean = np.full(p, 1e-14)
    draws = rng.multivariate_normal(mean, covariance, size=4000).reshape(4000, 6, N_BINS)
    corrected = np.array(
        [montecarlo.matrix_debiased_bandpowers(d, noise_bias_cb=np.zeros((6, N_BINS)), matrix=exact).cb for d in draws]
    )
    result = montecarlo.matrix_debiased_bandpowers(
        mean.reshape(6, N_BINS), noise_bias_cb=np.zeros((6, N_BINS)), matrix=exact, covariance=covariance,
        transfer_b=np.full((6, N_BINS), 0.8),
    )
    for row in montecarlo.MATRIX_ROWS:
        np.testing.assert_allclose(corrected[:, row].std(axis=0), result.sigma_data[row], rtol=0.06)
    np.testing.assert_allclose(result.sigma_data[0], np.sqrt(np.diag(covariance)[:N_BINS]) / 0.8, rtol=1e-12)
    np.testing.assert_allclose(result.sigma_matrix, 0.0, atol=1e-30)


def test_a_bin_without_input_power_is_nan_not_an_error():
    matrix = known_matrix()
    e_model, b_model = models()
    e_samples = campaign(matrix, e_model, 0, 4, 0.1, np.random.default_rng(2))
    b_samples = campaign(matrix, b_model, 2, 4, 0.1, np.random.default_rng(3))
    b_model[BB, 0] = 0.0
    estimate = montecarlo.transfer_matrix_from_samples(e_samples, e_model, b_samples, b_model)
    assert np.all(np.isnan(estimate.matrix[0, :, 2])) and np.all(np.isfinite(estimate.matrix[1:]))
    result = montecarlo.matrix_debiased_bandpowers(e_samples[0], noise_bias_cb=np.zeros((6, N_BINS)), matrix=estimate)
    assert np.all(np.isnan(result.cb[list(montecarlo.MATRIX_ROWS), 0]))
    assert np.all(np.isfinite(result.cb[list(montecarlo.MATRIX_ROWS), 1:]))


# --------------------------------------------------------------------------- the sky option


def test_pure_e_and_pure_b_skies_keep_only_their_modes_and_add_up_to_the_full_sky():
    nside, lmax = 32, 95
    full = sky.synthesize_cmb(sky.sky_input_cls(CmbSky()), nside, lmax, 0.0, sky.rng.generator((4, 5)))
    pure_e = sky.synthesize_cmb(sky.sky_input_cls(CmbSky(polarization="E-only")), nside, lmax, 0.0, sky.rng.generator((4, 5)))
    pure_b = sky.synthesize_cmb(sky.sky_input_cls(CmbSky(polarization="B-only")), nside, lmax, 0.0, sky.rng.generator((4, 5)))
    np.testing.assert_allclose(pure_e[1:] + pure_b[1:], full[1:], atol=1e-12 * np.abs(full[1:]).max())
    np.testing.assert_array_equal(pure_e[0], full[0])  # T is drawn as usual
    _, e_of_b, b_of_b = hp.map2alm(pure_b, lmax=lmax, pol=True, iter=3)
    _, e_of_e, b_of_e = hp.map2alm(pure_e, lmax=lmax, pol=True, iter=3)
    # What map2alm finds of the other mode is HEALPix quadrature's error on a field band-limited at 3 nside - 1
    # (2e-4 of the power here): the leakage a transfer matrix measures, not an a_lm the synthesis drew.
    assert np.sum(np.abs(e_of_b) ** 2) < 1e-3 * np.sum(np.abs(b_of_b) ** 2)
    assert np.sum(np.abs(b_of_e) ** 2) < 1e-3 * np.sum(np.abs(e_of_e) ** 2)


def test_a_power_law_replaces_the_kept_spectrum():
    law = {"amplitude_k2": 1e-15, "ell_pivot": 50.0, "index": -1.5}
    cls_b = sky.sky_input_cls(CmbSky(polarization="B-only", power_law=law))
    np.testing.assert_allclose(cls_b[50, 2], 1e-15)
    np.testing.assert_allclose(cls_b[100, 2], 1e-15 * 2.0**-1.5)
    assert cls_b[1, 2] == 0 and np.all(cls_b[:, 1] == 0) and np.all(cls_b[:, 3] == 0)
    cls_e = sky.sky_input_cls(CmbSky(polarization="E-only", power_law=law))
    np.testing.assert_allclose(cls_e[50, 1], 1e-15)
    assert np.all(cls_e[:, 2] == 0)
    np.testing.assert_array_equal(cls_e[:, 0], sky.load_fiducial_cls()[:, 0])


BASE = {"name": "t", "kind": "signal-only", "focal_plane": {"detectors": [{"name": "d"}]}}


def test_the_spec_refuses_a_power_law_on_both_polarisations_and_a_pure_sky_outside_signal_only():
    with pytest.raises(ValidationError) as refused:
        CampaignSpec.model_validate({**BASE, "sky": {"kind": "cmb", "power_law": {"amplitude_k2": 1e-15}}})
    assert refused.value.errors()[0]["loc"] == ("sky", "cmb")
    assert 'sky.polarization = "E-only" or "B-only"' in refused.value.errors()[0]["msg"]
    with pytest.raises(ValidationError) as refused:
        CampaignSpec.model_validate({**BASE, "kind": "signal+noise", "sky": {"kind": "cmb", "polarization": "B-only"}})
    assert "kind must be 'signal-only'" in str(refused.value)
    with pytest.raises(ValidationError) as refused:
        CampaignSpec.model_validate({**BASE, "sky": {"kind": "cmb", "polarization": "B"}})
    assert refused.value.errors()[0]["loc"] == ("sky", "cmb", "polarization")


def test_the_new_sky_fields_keep_old_spec_hashes_and_change_the_hash_when_set():
    plain = CampaignSpec.model_validate(BASE)
    explicit = CampaignSpec.model_validate({**BASE, "sky": {"kind": "cmb", "polarization": "both"}})
    pure_b = CampaignSpec.model_validate({**BASE, "sky": {"kind": "cmb", "polarization": "B-only"}})
    assert spec_hash(plain) == spec_hash(explicit) != spec_hash(pure_b)
    data = plain.model_dump(mode="json")
    del data["realizations"]
    for section, name in (("sky", "polarization"), ("sky", "power_law"), ("products", "map_precision"),
                          ("solver", "pointing"), ("solver", "coarse_stokes")):
        del data[section][name]
    import hashlib
    import json

    expected = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert spec_hash(plain) == expected  # the hash a spec had before the fields existed
