"""mapmaker.model.spectra: the analysis mask and its taper, bins, pseudo-spectra normalisation, the sky model."""

import math

import healpy as hp
import numpy as np
import pytest

from mapmaker.model import spectra
from mapmaker.model.sky import load_fiducial_cls, synthesize_cmb


def polar_cap_mask(nside: int, colatitude_deg: float) -> np.ndarray:
    """Inside: every pixel farther than ``colatitude_deg`` from the north pole."""
    theta, _ = hp.pix2ang(nside, np.arange(hp.nside2npix(nside)))
    return theta > math.radians(colatitude_deg)


def test_ell_bins_cover_two_to_lmax_with_a_short_last_bin():
    ell_min, ell_max = spectra.ell_bins(32, 8)
    assert ell_min.tolist() == [2, 10, 18, 26] and ell_max.tolist() == [9, 17, 25, 32]
    ell_min, ell_max = spectra.ell_bins(5, 1)
    assert ell_min.tolist() == ell_max.tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError):
        spectra.ell_bins(1, 8)


def test_binning_is_the_plain_mean_over_each_bin():
    cl = np.vstack([np.arange(40.0), np.arange(40.0) ** 2])
    ell_min, ell_max = spectra.ell_bins(32, 8)
    binned = spectra.bin_spectra(cl, ell_min, ell_max)
    for k, (lo, hi) in enumerate(zip(ell_min, ell_max, strict=True)):
        np.testing.assert_allclose(binned[:, k], cl[:, lo : hi + 1].mean(axis=1), rtol=1e-14)


def test_c2_taper_values():
    apodization = math.radians(5.0)
    angles = np.array([0.0, apodization / 2, apodization, 2 * apodization, np.inf])
    taper = spectra.c2_taper(angles, apodization)
    assert taper[0] == 0.0 and taper[2] == 1.0 and taper[3] == 1.0 and taper[4] == 1.0
    assert taper[1] == pytest.approx(0.5, abs=0.01)  # x ~ 1/2 for small angles: (1 - cos(pi/2)) / 2
    assert np.all(np.diff(spectra.c2_taper(np.linspace(0, apodization, 50), apodization)) >= 0)


def test_apodised_mask_is_zero_outside_tapered_at_the_edge_and_one_inside():
    nside = 32
    inside = polar_cap_mask(nside, 40.0)
    mask = spectra.apodized_mask(inside, 10.0)
    assert np.all(mask[~inside] == 0.0) and np.all((mask >= 0) & (mask <= 1))
    theta, _ = hp.pix2ang(nside, np.arange(mask.size))
    depth = np.degrees(theta) - 40.0  # about the distance to the edge
    assert np.all(mask[depth > 10.0 + hp.nside2resol(nside, arcmin=True) / 60] == 1.0)
    edge = inside & (depth < 1.0)
    assert edge.any() and np.all(mask[edge] < 0.1)
    # the taper rises with the distance from the edge
    order = np.argsort(depth[inside & (depth < 10.0)])
    rising = mask[inside & (depth < 10.0)][order]
    assert np.corrcoef(np.arange(rising.size), rising)[0, 1] > 0.95
    w2, fsky = spectra.mask_moments(mask)
    assert fsky == pytest.approx(inside.mean()) and 0 < w2 < fsky


def test_no_apodisation_and_full_sky_leave_the_binary_mask():
    inside = polar_cap_mask(16, 30.0)
    np.testing.assert_array_equal(spectra.apodized_mask(inside, 0.0), inside.astype(float))
    full = np.ones(hp.nside2npix(16), dtype=bool)
    np.testing.assert_array_equal(spectra.apodized_mask(full, 5.0), 1.0)
    assert spectra.mask_moments(np.ones(12)) == (1.0, 1.0)


def test_binary_mask_needs_hits_and_a_solved_pixel():
    hits = np.array([0, 2, 3, 5, 9])
    solved = np.array([False, True, True, False, True])
    assert spectra.binary_mask(hits, solved, 3).tolist() == [False, False, True, False, True]


def test_white_noise_pseudo_spectrum_level_is_omega_pix_mean_mask2_var():
    """E[C~_l] = Omega_pix mean_p(mask_p^2 var_p) for pixel-white noise, any mask, every l (and EE = BB).

    200 draws at nside 16 of inhomogeneous noise under an apodised cap mask:
    the mean over l = 2..32 of the ratio measures the level to about 0.5 %
    (each l averages 200 (2l + 1) fsky modes); 2 % is 4 sd.
    """
    nside, lmax = 16, 32
    npix = hp.nside2npix(nside)
    theta, _ = hp.pix2ang(nside, np.arange(npix))
    variance = 1.0 + 3.0 * np.cos(theta) ** 2
    mask = spectra.apodized_mask(polar_cap_mask(nside, 50.0), 10.0)
    expected = 4 * np.pi / npix * np.mean(mask**2 * variance)
    generator = np.random.default_rng(3)
    total = np.zeros((6, lmax + 1))
    draws = 200
    for _ in range(draws):
        iqu = generator.standard_normal((3, npix)) * np.sqrt(variance)
        total += spectra.pseudo_spectra(iqu, mask, lmax)
    mean = total / draws
    for row in (0, 1, 2):  # TT, EE, BB
        assert np.mean(mean[row, 2:]) / expected == pytest.approx(1.0, abs=0.02)
    for row in (3, 4, 5):  # uncorrelated I, Q, U: no cross power
        assert abs(np.mean(mean[row, 2:])) < 0.02 * expected


def test_unseen_pixels_outside_the_mask_do_not_matter():
    nside = 16
    generator = np.random.default_rng(1)
    iqu = generator.standard_normal((3, hp.nside2npix(nside)))
    inside = polar_cap_mask(nside, 30.0)
    mask = spectra.apodized_mask(inside, 5.0)
    with_unseen = np.where(inside, iqu, hp.UNSEEN)
    np.testing.assert_array_equal(spectra.pseudo_spectra(with_unseen, mask, 32), spectra.pseudo_spectra(iqu, mask, 32))


def test_sky_model_is_the_fiducial_times_the_beam_squared():
    cls_in = load_fiducial_cls()
    fwhm = math.radians(3.0)
    model = spectra.sky_model_spectra(cls_in, fwhm, 47, 32)
    beam = hp.gauss_beam(fwhm, lmax=32, pol=True)
    np.testing.assert_allclose(model[0], cls_in[:33, 0] * beam[:, 0] ** 2, rtol=1e-14)
    np.testing.assert_allclose(model[2], cls_in[:33, 2] * beam[:, 2] ** 2, rtol=1e-14)
    np.testing.assert_allclose(model[3], cls_in[:33, 3] * beam[:, 0] * beam[:, 1], rtol=1e-14)
    assert np.all(model[4:] == 0)
    np.testing.assert_array_equal(spectra.sky_model_spectra(cls_in, 0.0, 20, 32)[0, 21:], 0.0)  # band limit


def test_full_sky_pseudo_spectra_of_a_pixel_sampled_sky_need_no_pixel_window():
    """A synfast-at-nside sky (the map-maker's) analysed on the full sky returns C_l^in B_l^2 without p_l^2.

    The a_lm of the draw are known, so TT is compared with the draw's own
    spectrum: no cosmic variance, only the analysis error, below 3 % per
    multipole up to 2 nside. Averaging over pixels instead (the HEALPix pixel
    window) would make C_l about 0.67 times smaller at ell = 2 nside for
    nside 16 (measured by averaging a nside-256 map over pixels): ignoring the
    pixel window is not an approximation here, applying it would be wrong.
    """
    nside, lmax = 16, 32
    cls_in = load_fiducial_cls()
    fwhm = math.radians(2.0)
    generator = np.random.default_rng(7)
    sky = synthesize_cmb(cls_in, nside, 3 * nside - 1, fwhm, generator)
    generator = np.random.default_rng(7)  # the same draw, as a_lm
    ell, m = hp.Alm.getlm(3 * nside - 1)
    normals = generator.standard_normal((3, len(ell), 2))
    z = np.where(m == 0, normals[..., 0], (normals[..., 0] + 1j * normals[..., 1]) * math.sqrt(0.5))
    truth_tt = np.array(
        [np.sum(np.abs(z[0][ell == l]) ** 2 * np.where(m[ell == l] == 0, 1, 2)) / (2 * l + 1) for l in range(lmax + 1)]
    )
    measured = spectra.pseudo_spectra(sky, np.ones(sky.shape[1]), lmax)
    model = spectra.sky_model_spectra(cls_in, fwhm, 3 * nside - 1, lmax)
    ratio = measured[0, 2:] / (model[0, 2:] * truth_tt[2:])
    assert np.max(np.abs(ratio - 1)) < 0.03
