"""mapmaker.model.spectra: the analysis mask, bins, pseudo-spectra normalisation, the sky model, the monopole
and dipole removal and the per-realisation record with its bandpowers."""

import math

import healpy as hp
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from mapmaker.model import bandpowers, spectra
from mapmaker.model.sky import load_fiducial_cls, synthesize_cmb
from schemas.io import load_example_spec
from schemas.result import BinnedSpectra
from schemas.spec import CampaignSpec


@pytest.fixture(scope="module", autouse=True)
def one_openmp_thread():
    """pspy's and healpy's OpenMP threads spin-wait: on a busy 2-core machine they run 10x slower than one thread."""
    with threadpool_limits(limits=1, user_api="openmp"):
        yield


def ground_spec(nside: int, **products) -> CampaignSpec:
    """The bundled ground example at ``nside`` with the given products settings."""
    data = load_example_spec("ground").model_dump(mode="json")
    data["pixelization"]["nside"] = nside
    data["products"].update(products)
    return CampaignSpec.model_validate(data)


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


def test_campaign_mask_is_the_bandpowers_analysis_mask_of_the_solved_pixels_with_enough_hits():
    """One apodisation in the project: pspy's C2 taper (mapmaker.model.bandpowers.analysis_mask)."""
    spec = ground_spec(nside=16, apodization_deg=10.0, min_hits=3)
    npix = hp.nside2npix(16)
    inside = polar_cap_mask(16, 40.0)
    hits = np.where(inside, 5, 1)
    iqu = np.zeros((3, npix))
    iqu[:, -10:] = hp.UNSEEN  # cut by the solver (at the south pole, inside the cap)
    mask = spectra.campaign_mask(spec, iqu, hits)
    solved = np.ones(npix, dtype=bool)
    solved[-10:] = False
    expected = bandpowers.analysis_mask(hits, apodisation_deg=10.0, min_hits=3, solved=solved)
    np.testing.assert_array_equal(mask, expected)
    assert np.all(mask[~inside] == 0.0) and np.all(mask[-10:] == 0.0)
    assert 0 < mask[inside & solved].min() < 0.5 and mask.max() == 1.0  # tapered at the edge, 1 deep inside
    w2, fsky = spectra.mask_moments(mask)
    assert fsky == pytest.approx(np.mean(mask > 0)) and 0 < w2 < fsky
    assert spectra.mask_moments(np.ones(12)) == (1.0, 1.0)


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
    mask = bandpowers.analysis_mask(polar_cap_mask(nside, 50.0), apodisation_deg=10.0)
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
    mask = bandpowers.analysis_mask(inside, apodisation_deg=5.0)
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


def test_ground_map_offset_is_recorded_and_removed_before_every_spectrum():
    """A -2944 uK offset and a 2 mK dipole on the I map of a CMB sky seen by a ground-like band (fsky ~0.45).

    The record's monopole equals the injected one to 1%: what the fit returns beyond it is the
    CMB's own projection onto the monopole over the band, the clean sky's fitted monopole (which
    must be below 1% of the offset for this seed and band). The fit is linear, so the record minus
    the clean sky's fit equals the injected offset and dipole to rounding (relative 1e-9; the CMB's
    projection onto the dipole over a band is ~60 uK, too large to judge the dipole alone at
    1-2%). The polluted map's TT (pseudo and decoupled) equals the clean sky's to rounding (relative
    1e-8): no monopole is left. Left in, the offset would raise TT more than tenfold in the low bins.
    """
    nside = 32
    spec = ground_spec(nside=nside, apodization_deg=10.0, ell_bin_width=8)
    npix = hp.nside2npix(nside)
    _, declination = hp.pix2ang(nside, np.arange(npix), lonlat=True)
    hits = np.where((declination > -70.0) & (declination < 0.0), 10, 0)  # a CES drift scan covers a band
    sky = synthesize_cmb(load_fiducial_cls(), nside, 3 * nside - 1, math.radians(1.0), np.random.default_rng(16))
    sky[:, hits == 0] = hp.UNSEEN  # what the map-maker writes where nothing was observed
    offset, dipole = -2944e-6, np.array([0.5e-3, -1.0e-3, 1.5e-3])
    polluted = sky.copy()
    seen = hits > 0
    polluted[0, seen] += offset + dipole @ np.array(hp.pix2vec(nside, np.flatnonzero(seen)))

    mask = spectra.campaign_mask(spec, polluted, hits)
    assert 0.2 < np.mean(mask > 0) < 0.8
    coupling = bandpowers.build_coupling(mask, spectra.campaign_binning(spec), purify_b=spec.products.purify_b)
    measured = spectra.for_campaign(spec, polluted, coupling)
    clean = spectra.for_campaign(spec, sky, coupling)
    record = BinnedSpectra.model_validate(
        spectra.result_record(spec, measured, coupling_source="built", coupling_build_s=1.0)
    )

    assert record.monopole_k == pytest.approx(offset, rel=0.01), f"CMB's own monopole {clean.monopole} K"
    assert record.monopole_k - clean.monopole == pytest.approx(offset, rel=1e-9)
    np.testing.assert_allclose(np.array(record.dipole_k) - clean.dipole, dipole, rtol=1e-9)
    tt = spectra.SPECTRA.index("TT")
    np.testing.assert_allclose(measured.binned[tt], clean.binned[tt], rtol=1e-8)
    np.testing.assert_allclose(measured.bandpowers.cb[tt], clean.bandpowers.cb[tt], rtol=1e-8)
    np.testing.assert_allclose(record.bandpowers.cb["TT"], measured.bandpowers.cb[tt], rtol=1e-15)
    unremoved = bandpowers.decoupled_bandpowers(polluted, coupling).cb[tt]
    assert np.all(np.abs(unremoved[:3] / clean.bandpowers.cb[tt][:3]) > 10), "the offset must dominate TT if left in"


def test_record_carries_the_bandpowers_their_model_and_the_coupling_source():
    """A CMB campaign's record: six decoupled spectra per bin, the model through the windows, purify_b, the mask id."""
    nside = 16
    spec = ground_spec(nside=nside, apodization_deg=15.0, ell_bin_width=8, purify_b=False)
    npix = hp.nside2npix(nside)
    hits = np.where(polar_cap_mask(nside, 60.0), 10, 0)
    sky = synthesize_cmb(load_fiducial_cls(), nside, 3 * nside - 1, math.radians(1.0), np.random.default_rng(2))
    mask = spectra.campaign_mask(spec, sky, hits)
    coupling = bandpowers.build_coupling(mask, spectra.campaign_binning(spec), purify_b=False)
    measured = spectra.for_campaign(spec, sky, coupling)
    record = BinnedSpectra.model_validate(
        spectra.result_record(spec, measured, coupling_source="file", coupling_build_s=None)
    )
    assert record.bandpowers is not None and not record.bandpowers.purify_b
    assert record.bandpowers.coupling_source == "file" and record.bandpowers.mask_sha256 == coupling.mask_sha256
    n_bins = coupling.binning.n_bins
    assert set(record.bandpowers.cb) == set(spectra.SPECTRA) and all(len(v) == n_bins for v in record.bandpowers.cb.values())
    expected_model = bandpowers.model_bandpowers(coupling, load_fiducial_cls()[: 3 * nside].T, beam_fwhm_arcmin=60.0)
    np.testing.assert_allclose(measured.model_bandpowers, expected_model, rtol=1e-12)
    assert record.bandpowers.ell_hi[-1] == 3 * nside - 2 and npix == mask.size
