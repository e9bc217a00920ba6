"""The input sky: a Gaussian CMB drawn from the fiducial C_l, or a user IQU FITS map.

Pixelisation. The sky is the band-limited field (``lmax``, default
``3 nside - 1``) smoothed by the Gaussian beam and evaluated at the HEALPix
pixel centres; the synthesis stops where the beam falls below 1e-16
(:func:`beam_band_limit`), whose terms no float64 map could hold. The TOD samples that pixelised map (each sample reads the
value of the pixel it falls in), so the pixelised map *is* the truth a
noiseless solve must return. No pixel window function is applied: it would
only describe averaging a continuous sky over pixels, which the simulation
does not do, and healpy fetches the window tables over the network, which a
compute node may not have.

Which sky a realisation sees (``CampaignKind``):

* ``signal-only`` and ``signal+noise``: a new CMB realisation per
  realisation index, keyed by (campaign seed, sky seed, realisation). For
  ``signal+noise`` this makes each realisation an independent draw of sky
  and noise, which is what Monte Carlo error bars of pseudo-spectra need;
  a fixed sky would hide cosmic variance.
* ``noise-only``: no sky.
* A user map (``sky.kind = "map"``) is the same in every realisation.

Pure-E and pure-B skies (``sky.polarization``): :func:`sky_input_cls` zeroes the
spectra of the modes left out (BB for "E-only"; EE and TE for "B-only"), so
their a_lm are exactly 0 and T is drawn as usual; with ``sky.power_law`` the
kept spectrum (EE or BB) is the power law. The deviates are the same as the
"both" sky's, so a pure-E sky of a seed holds that sky's E modes (with the
fiducial spectrum).

A CMB draw uses its own Philox stream (:func:`mapmaker.model.rng.sky_key`):
``3 * n_alm * 2`` standard normals in the order (T, E, B) x (healpy a_lm
index) x (real, imaginary); for m = 0 the imaginary deviate is unused.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import healpy as hp
import numpy as np

from mapmaker.model import rng
from schemas.spec import CampaignSpec, CmbSky, MapSky

FIDUCIAL_CLS = Path(__file__).parent.parent / "data" / "fiducial_cls.txt"
ARCMIN = math.pi / (180.0 * 60.0)


class SkyError(ValueError):
    """The sky named by a spec cannot be used (missing or unsafe path, unreadable map)."""


def load_fiducial_cls() -> np.ndarray:
    """Fiducial spectra [lmax + 1, 4]: columns TT, EE, BB, TE in K^2, row = ell."""
    table = np.loadtxt(FIDUCIAL_CLS)
    return table[:, 1:5]


def power_law_cls(amplitude_k2: float, ell_pivot: float, index: float, n_ell: int) -> np.ndarray:
    """``C_l = amplitude_k2 (ell / ell_pivot)^index`` [n_ell] K^2 for ell >= 2, 0 for ell 0 and 1."""
    ell = np.arange(n_ell, dtype=np.float64)
    cl = np.zeros(n_ell)
    cl[2:] = amplitude_k2 * (ell[2:] / ell_pivot) ** index
    return cl


def sky_input_cls(sky: CmbSky) -> np.ndarray:
    """The spectra [n_ell, 4] (TT, EE, BB, TE; K^2, row = ell) a CMB sky is drawn from: the fiducial ones
    with the modes ``sky.polarization`` leaves out set to 0, and ``sky.power_law`` as the kept EE or BB."""
    cls = load_fiducial_cls().copy()
    if sky.polarization == "E-only":
        cls[:, 2] = 0.0
    elif sky.polarization == "B-only":
        cls[:, 1] = 0.0
        cls[:, 3] = 0.0
    if sky.power_law is not None:
        kept = 1 if sky.polarization == "E-only" else 2
        law = sky.power_law
        cls[:, kept] = power_law_cls(law.amplitude_k2, law.ell_pivot, law.index, cls.shape[0])
    return cls


def sky_varies_with_realization(spec: CampaignSpec) -> bool:
    return isinstance(spec.sky, CmbSky) and spec.simulates_signal


def sky_stream_key(spec: CampaignSpec, realization: int) -> tuple[int, int] | None:
    """Philox key of the CMB draw of a realisation, or None when no CMB is drawn."""
    if not (spec.simulates_signal and isinstance(spec.sky, CmbSky)):
        return None
    index = realization if sky_varies_with_realization(spec) else -1
    return rng.sky_key(spec.seed, spec.sky.seed, index)


# Beam factor below which a multipole is left out of the synthesis: a Gaussian beam falls as
# exp(-l^2 sigma^2 / 2), so past this l every term is under float64's resolution of the map (2.2e-16 of it).
BEAM_FLOOR = 1e-16
# Normal deviates drawn at a time for the multipoles above the band limit (32 MiB).
DISCARDED_NORMALS_PER_DRAW = 1 << 22


def beam_band_limit(fwhm_rad: float, lmax: int) -> int:
    """The largest ell <= ``lmax`` at which the Gaussian beam of FWHM ``fwhm_rad`` (radians; T, E or B) is
    still above BEAM_FLOOR: ``lmax`` itself without a beam. 578 for a 2-degree beam, 2,315 for 30 arcmin."""
    if fwhm_rad <= 0:
        return lmax
    beam = hp.gauss_beam(fwhm_rad, lmax=lmax, pol=True)[:, :3].max(axis=1)
    below = np.flatnonzero(beam < BEAM_FLOOR)
    return lmax if len(below) == 0 else max(int(below[0]) - 1, 0)


def synthesize_cmb(cls: np.ndarray, nside: int, lmax: int, fwhm_rad: float, generator: np.random.Generator) -> np.ndarray:
    """A Gaussian IQU sky [3, npix] (K, RING) from spectra ``cls`` [>= lmax + 1, 4] (TT, EE, BB, TE; K^2).

    The a_lm of :func:`cmb_alms`, transformed by pixell's ducc0 synthesis (T spin 0, Q U spin 2):
    healpy's ``alm2map(pol=True)`` to round-off (tested), in half its time, on ``OMP_NUM_THREADS``
    threads (:mod:`mapmaker.parallel.rootwork` gives it root's node). The synthesis runs to the beam's
    band limit (:func:`beam_band_limit`), not to ``lmax``: at nside 2048 with the bundled examples'
    2-degree beam, ell 578 instead of 6,143, a hundredth of the transform, the same map to round-off.
    """
    from pixell import curvedsky  # deferred: ducc0 loads only where a CMB sky is made (the numpy path stays numpy)

    alms = cmb_alms(cls, lmax, fwhm_rad, generator)
    return curvedsky.alm2map_healpix(alms, np.empty((3, hp.nside2npix(nside))), spin=[0, 2])


def cmb_alms(cls: np.ndarray, lmax: int, fwhm_rad: float, generator: np.random.Generator) -> np.ndarray:
    """Gaussian T, E, B a_lm [3, n_alm(band)] complex128 (K, healpy's order) of spectra ``cls`` [>= lmax + 1, 4].

    T and E are correlated through the Cholesky factor of the 2x2 (TT, TE;
    TE, EE) matrix per ell; B is independent. The a_lm are multiplied by the
    Gaussian beam of FWHM ``fwhm_rad`` (radians) and returned to
    ``band = beam_band_limit(fwhm_rad, lmax)``: the multipoles above it are
    drawn all the same (and dropped), so that every a_lm kept is the one a
    draw to ``lmax`` gives, from the same deviates.

    The deviates are the generator's ``(3, n_alm(lmax), 2)`` standard normals
    (field, a_lm in healpy's m-major order, real and imaginary part), drawn
    an m at a time: the same stream, without the 48 bytes per a_lm of a
    single draw (900 MB at lmax 6,143).
    """
    band = beam_band_limit(fwhm_rad, lmax)
    cls = cls[: band + 1]
    tt, ee, bb, te = (cls[:, i] for i in range(4))
    ell, m = hp.Alm.getlm(band)
    normals = np.empty((3, len(ell), 2))
    discarded = (lmax - band) * (lmax - band + 1)  # normals of the a_lm with m > band, per field
    for field in range(3):
        first = 0
        for order in range(band + 1):  # m-major: ell = m .. lmax, of which m .. band are kept
            kept = band - order + 1
            normals[field, first : first + kept] = generator.standard_normal((kept, 2))
            if lmax > band:
                generator.standard_normal((lmax - band, 2))
            first += kept
        for start in range(0, discarded, DISCARDED_NORMALS_PER_DRAW):
            generator.standard_normal(min(DISCARDED_NORMALS_PER_DRAW, discarded - start))
    z = np.where(m == 0, normals[..., 0], (normals[..., 0] + 1j * normals[..., 1]) * math.sqrt(0.5))
    with np.errstate(divide="ignore", invalid="ignore"):
        sqrt_tt = np.sqrt(tt)
        te_over = np.where(tt > 0, te / sqrt_tt, 0.0)
        e_rest = np.sqrt(np.clip(ee - np.where(tt > 0, te * te / tt, 0.0), 0.0, None))
    beam = hp.gauss_beam(fwhm_rad, lmax=band, pol=True) if fwhm_rad > 0 else np.ones((band + 1, 4))
    alm_t = sqrt_tt[ell] * z[0] * beam[ell, 0]
    alm_e = (te_over[ell] * z[0] + e_rest[ell] * z[1]) * beam[ell, 1]
    alm_b = np.sqrt(bb)[ell] * z[2] * beam[ell, 2]
    return np.array([alm_t, alm_e, alm_b], dtype=np.complex128)


def resolve_sky_path(sky_root: str | Path | None, relative: str) -> Path:
    """The file ``relative`` under ``sky_root``, refusing anything that leaves it (``..``, symlinks)."""
    if sky_root is None:
        raise SkyError(f"the spec names the sky map {relative!r}; pass --sky-root DIR, the folder it is relative to")
    root = Path(sky_root)
    if not root.is_dir():
        raise SkyError(f"--sky-root {str(root)!r} is not a folder")
    root = root.resolve()
    candidate = root / relative
    if not candidate.is_file():
        raise SkyError(f"sky map {relative!r} not found under {str(root)!r}")
    resolved = candidate.resolve()
    if not resolved.is_relative_to(root):
        raise SkyError(f"sky map {relative!r} resolves outside the sky root {str(root)!r}; refused")
    return resolved


def read_sky_map(path: Path, nside: int, fwhm_rad: float) -> np.ndarray:
    """A user IQU map [3, npix] at ``nside`` (RING), re-gridded with ud_grade and smoothed if asked."""
    try:
        maps = np.asarray(hp.read_map(path, field=(0, 1, 2), dtype=np.float64))
    except Exception as error:  # noqa: BLE001 - healpy/astropy raise many kinds for a bad file
        raise SkyError(f"cannot read an IQU map (3 columns) from {path.name!r}: {error}") from None
    if maps.ndim != 2 or maps.shape[0] != 3:
        raise SkyError(f"{path.name!r} is not an IQU map (3 columns)")
    if np.any(~np.isfinite(maps)) or np.any(maps == hp.UNSEEN):
        raise SkyError(f"{path.name!r} has UNSEEN or non-finite pixels; the sky must be defined everywhere")
    if hp.get_nside(maps[0]) != nside:
        maps = np.asarray(hp.ud_grade(maps, nside_out=nside, order_in="RING", order_out="RING"))
    if fwhm_rad > 0:
        maps = np.asarray(hp.smoothing(maps, fwhm=fwhm_rad, pol=True, lmax=3 * nside - 1))
    return maps


def build_sky(spec: CampaignSpec, realization: int, sky_root: str | Path | None) -> np.ndarray | None:
    """The IQU sky [3, npix] (K, RING) a realisation observes, or None when it observes none."""
    if not spec.simulates_signal:
        return None
    nside = spec.pixelization.nside
    if isinstance(spec.sky, MapSky):
        return read_sky_map(resolve_sky_path(sky_root, spec.sky.path), nside, spec.sky.fwhm_arcmin * ARCMIN)
    sky = cast(CmbSky, spec.sky)  # simulates_signal is False for NoSky, and MapSky returned above
    cls = sky_input_cls(sky)
    lmax = min(sky.lmax or 3 * nside - 1, len(cls) - 1)
    key = sky_stream_key(spec, realization)
    assert key is not None  # a simulated CmbSky is drawn, so it has a key
    return synthesize_cmb(cls, nside, lmax, sky.fwhm_arcmin * ARCMIN, rng.generator(key))
