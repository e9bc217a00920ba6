"""The input sky: synfast draws, their keys per campaign kind, user maps under a sky root."""
import os

import healpy as hp
import numpy as np
import pytest
from mapmaker_cases import make_spec

from mapmaker.model import sky


def test_cmb_draw_is_deterministic_and_varies_with_the_realisation():
    spec = make_spec(kind="signal-only", noise="off")
    first, again = sky.build_sky(spec, 0, None), sky.build_sky(spec, 0, None)
    assert first.shape == (3, 12 * 16**2)
    assert first.tobytes() == again.tobytes()
    assert not np.allclose(sky.build_sky(spec, 1, None), first)
    plus_noise = make_spec(kind="signal+noise")
    assert sky.sky_stream_key(plus_noise, 0) == sky.sky_stream_key(spec, 0)
    assert sky.sky_stream_key(plus_noise, 0) != sky.sky_stream_key(plus_noise, 1)
    assert sky.sky_stream_key(make_spec({"sky.seed": 2}), 0) != sky.sky_stream_key(plus_noise, 0)
    assert sky.build_sky(make_spec(kind="noise-only"), 0, None) is None
    assert sky.sky_stream_key(make_spec(kind="noise-only"), 0) is None


def test_cmb_draw_has_the_fiducial_spectrum():
    """anafast of one draw at nside 128 against C_l, summed with weight (2l + 1) over 20 <= l <= 150.

    Each of TT, EE is then a chi^2 sum over ~22,600 modes: relative sd
    sqrt(2 / 22,600) = 0.9 %; 5 % is above 5 sd and leaves room for the
    quadrature error of map2alm. TE is checked through the correlation
    coefficient, at 0.05 absolute.
    """
    cls = sky.load_fiducial_cls()
    generator = sky.rng.generator(sky.rng.sky_key(0, 0, 0))
    maps = sky.synthesize_cmb(cls, 128, 3 * 128 - 1, 0.0, generator)
    measured = hp.anafast(maps, lmax=200)  # TT EE BB TE EB TB
    ell = np.arange(20, 151)
    weight = 2 * ell + 1
    for measured_row, column in ((0, 0), (1, 1), (3, 3)):
        ratio = np.sum(weight * measured[measured_row][ell]) / np.sum(weight * cls[ell, column])
        assert ratio == pytest.approx(1.0, abs=0.05), (measured_row, ratio)


def test_cmb_synthesis_is_healpys_alm2map_of_its_alms():
    """pixell's ducc0 synthesis gives healpy's alm2map(pol=True) of the same a_lm to 1e-12 of each map's
    largest value (Q and U in healpy's sign convention), with and without a beam."""
    cls = sky.load_fiducial_cls()
    for nside, fwhm_rad in ((32, 0.0), (64, np.radians(1.0))):
        lmax = 3 * nside - 1
        maps = sky.synthesize_cmb(cls, nside, lmax, fwhm_rad, sky.rng.generator((3, 4)))
        alms = sky.cmb_alms(cls, lmax, fwhm_rad, sky.rng.generator((3, 4)))
        expected = hp.alm2map(list(alms), nside, lmax=lmax, pol=True)
        for got, want in zip(maps, expected, strict=True):
            assert np.max(np.abs(got - want)) <= 1e-12 * np.max(np.abs(want))


def test_a_beam_band_limits_the_draw_and_the_synthesis_to_round_off():
    """A 10-degree beam at nside 128 is under BEAM_FLOOR from ell 116: the a_lm are returned to ell 115 only,
    each the very number (bits) of a draw to 3 nside - 1 times the beam, and the sky is the synthesis of the
    whole draw to 1e-14 of each map's largest value (the dropped a_lm are 1e-17 of the largest)."""
    from pixell import curvedsky

    cls, nside, fwhm_rad = sky.load_fiducial_cls(), 128, np.radians(10.0)
    lmax = 3 * nside - 1
    band = sky.beam_band_limit(fwhm_rad, lmax)
    assert band == 115
    beam = hp.gauss_beam(fwhm_rad, lmax=lmax, pol=True)
    assert beam[band, :3].max() >= sky.BEAM_FLOOR > beam[band + 1, :3].max()

    unsmoothed = sky.cmb_alms(cls, lmax, 0.0, sky.rng.generator((6, 7)))  # every ell, beam 1
    ell, m = hp.Alm.getlm(band)
    kept = hp.Alm.getidx(lmax, ell, m)
    alms = sky.cmb_alms(cls, lmax, fwhm_rad, sky.rng.generator((6, 7)))
    assert alms.shape == (3, len(ell))
    for field in range(3):
        np.testing.assert_array_equal(alms[field], unsmoothed[field, kept] * beam[ell, field])

    whole = np.array([hp.almxfl(unsmoothed[field], beam[:, field]) for field in range(3)])
    expected = curvedsky.alm2map_healpix(whole, np.empty((3, hp.nside2npix(nside))), spin=[0, 2])
    maps = sky.synthesize_cmb(cls, nside, lmax, fwhm_rad, sky.rng.generator((6, 7)))
    for got, want in zip(maps, expected, strict=True):
        assert np.max(np.abs(got - want)) <= 1e-14 * np.max(np.abs(want))


def test_beam_band_limit():
    assert sky.beam_band_limit(0.0, 6143) == 6143
    assert sky.beam_band_limit(np.radians(2.0), 6143) == 578  # the bundled examples' beam
    assert sky.beam_band_limit(np.radians(30 / 60), 6143) == 2315
    assert sky.beam_band_limit(np.radians(5 / 60), 6143) == 6143  # still above the floor at 3 nside - 1


def test_beam_smoothing_lowers_small_scale_power():
    cls = sky.load_fiducial_cls()
    sharp = sky.synthesize_cmb(cls, 32, 95, 0.0, sky.rng.generator((1, 2)))
    smooth = sky.synthesize_cmb(cls, 32, 95, np.radians(3.0), sky.rng.generator((1, 2)))
    assert np.std(smooth[0]) < np.std(sharp[0])


def write_iqu(path, nside=16, seed=0):
    maps = np.random.default_rng(seed).standard_normal((3, 12 * nside**2)) * 1e-5
    hp.write_map(path, maps, dtype=np.float64)
    return maps


def test_user_map_is_read_under_the_sky_root(tmp_path):
    (tmp_path / "maps").mkdir()
    maps = write_iqu(tmp_path / "maps" / "sky.fits")
    spec = make_spec(sky={"kind": "map", "path": "maps/sky.fits"})
    np.testing.assert_array_equal(sky.build_sky(spec, 0, tmp_path), maps)
    assert sky.sky_stream_key(spec, 0) is None
    lower = sky.build_sky(make_spec(sky={"kind": "map", "path": "maps/sky.fits"}, pixelization={"nside": 8}), 0, tmp_path)
    assert lower.shape == (3, 12 * 64)


def test_user_map_paths_cannot_escape_the_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_iqu(tmp_path / "outside.fits")
    os.symlink(tmp_path / "outside.fits", root / "link.fits")
    with pytest.raises(sky.SkyError, match="outside the sky root"):
        sky.resolve_sky_path(root, "link.fits")
    with pytest.raises(sky.SkyError, match="--sky-root"):
        sky.resolve_sky_path(None, "link.fits")
    with pytest.raises(sky.SkyError, match="not found"):
        sky.resolve_sky_path(root, "missing.fits")


def test_user_map_with_holes_is_refused(tmp_path):
    maps = write_iqu(tmp_path / "holes.fits")
    maps[1, 5] = hp.UNSEEN
    hp.write_map(tmp_path / "holes.fits", maps, dtype=np.float64, overwrite=True)
    with pytest.raises(sky.SkyError, match="UNSEEN"):
        sky.build_sky(make_spec(sky={"kind": "map", "path": "holes.fits"}), 0, tmp_path)
    hp.write_map(tmp_path / "t_only.fits", maps[0], dtype=np.float64)
    with pytest.raises(sky.SkyError, match="IQU"):
        sky.build_sky(make_spec(sky={"kind": "map", "path": "t_only.fits"}), 0, tmp_path)
