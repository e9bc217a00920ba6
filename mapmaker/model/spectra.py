"""Pseudo power spectra of one realisation's map: the analysis mask, anafast, ell bins, the sky model.

Pure functions on full-sky HEALPix arrays (RING); nothing here sees ``comm``.
Root calls :func:`realization_spectra` after the map is gathered.

Definitions (all spectra in K^2, HEALPix RING, ``npix = 12 nside^2``):

* **Binary mask**: a pixel is in when it has ``hits >= products.min_hits`` and
  was solved (not cut by ``solver.rcond_min``). It depends on the pointing
  only, so every realisation of a campaign has the same one.
* **Apodisation**: inside the binary mask the weight rises from the edge
  with the C2 taper of Grain et al. (2009) (NaMaster's "C2")::

      x = sqrt((1 - cos d) / (1 - cos d_apo)),   w = (1 - cos(pi x)) / 2  for x < 1, else 1

  where ``d`` is the angle from the pixel centre to the nearest pixel
  centre outside the binary mask and ``d_apo = products.apodization_deg``.
  Pixels outside the binary mask are 0; ``apodization_deg = 0`` (or a
  mask with nothing outside it, a full-sky scan) leaves the binary mask.
* **w2** ``= mean over the sphere of mask^2`` (``fsky`` is the fraction of
  pixels in the binary mask). For a field whose full-sky spectrum is C_l,
  the pseudo-spectrum of the masked field is about ``w2 C_l``.
* **Pseudo-spectra** ``C~_l``: ``healpy.anafast`` of (I, Q, U) x mask,
  giving TT, EE, BB, TE, EB, TB. The a_lm are computed up to
  ``max(3 nside - 1, lmax)`` (with healpy's default 3 Jacobi iterations)
  and the spectra kept up to ``products.lmax`` (default 2 nside): cutting the
  a_lm at lmax itself would alias the map's power between lmax and 3 nside
  into the kept multipoles, which on a pixelised sky leaks E into B by 15-20 %
  of the lensing BB at ell ~ 2 nside (nside 16-32), against 2-3 % this way.
* **Bins**: ``[2, 2 + w - 1], [2 + w, 2 + 2w - 1], ...`` up to ``lmax``
  (the last bin may be narrower), ``w = products.ell_bin_width``; a binned
  value is the plain mean of C_l over the bin's multipoles.
* **Sky model** (CMB skies only): ``C_l^in B_l^2`` per spectrum, the
  fiducial C_l times the Gaussian beam the sky was smoothed with (T, E, B
  beams of ``healpy.gauss_beam(pol=True)``; TE takes B_T B_E), zero above the
  sky's band limit, binned the same way. No pixel window: the simulated sky
  is the band-limited field evaluated at pixel centres (:mod:`mapmaker.model.sky`),
  and each TOD sample reads its pixel's value, so the map holds point samples
  of the beam-smoothed field, not pixel averages. Its spectrum is that of the
  ``synfast``-at-nside sky, whose window is 1; dividing by the HEALPix pixel
  window would be wrong here (and healpy would fetch it over the network).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import healpy as hp
import numpy as np
from scipy.spatial import cKDTree

from mapmaker.model.sky import ARCMIN, load_fiducial_cls
from schemas.spec import CampaignSpec, CmbSky, MapSky

SPECTRA = ("TT", "EE", "BB", "TE", "EB", "TB")  # healpy.anafast order for (I, Q, U)
FIRST_ELL = 2  # monopole and dipole are left out of every bin
ANAFAST_ITERATIONS = 3


# --------------------------------------------------------------------------- mask


def binary_mask(hits: np.ndarray, solved: np.ndarray, min_hits: int) -> np.ndarray:
    """``hits [npix] >= min_hits`` and ``solved [npix] bool`` -> bool [npix]."""
    return (np.asarray(hits) >= min_hits) & np.asarray(solved, dtype=bool)


def distance_to_edge(inside: np.ndarray, max_angle_rad: float) -> np.ndarray:
    """Angle (radians) [npix] from each pixel centre inside the mask to the nearest centre outside it.

    ``inside`` is bool [npix] (RING). Outside pixels get 0; inside pixels
    farther than ``max_angle_rad`` from the edge get ``inf``. The nearest
    outside pixel is searched among the outside pixels that touch the mask
    (8-neighbours), with a k-d tree on unit vectors (chord -> angle).
    """
    inside = np.asarray(inside, dtype=bool)
    nside = hp.npix2nside(inside.size)
    distance = np.zeros(inside.size)
    outside_pixels = np.flatnonzero(~inside)
    inside_pixels = np.flatnonzero(inside)
    if outside_pixels.size == 0:
        distance[:] = np.inf
        return distance
    if inside_pixels.size == 0:
        return distance
    neighbours = hp.get_all_neighbours(nside, outside_pixels)  # [8, n], -1 where a pixel has 7 neighbours
    touches = np.any(np.where(neighbours >= 0, inside[np.maximum(neighbours, 0)], False), axis=0)
    edge = outside_pixels[touches]
    tree = cKDTree(np.column_stack(hp.pix2vec(nside, edge)))
    chord_limit = 2.0 * math.sin(min(max_angle_rad, math.pi) / 2.0)
    chord, _ = tree.query(np.column_stack(hp.pix2vec(nside, inside_pixels)), distance_upper_bound=chord_limit * 1.000001)
    angle = np.where(np.isfinite(chord), 2.0 * np.arcsin(np.clip(chord / 2.0, 0.0, 1.0)), np.inf)
    distance[inside_pixels] = angle
    return distance


def c2_taper(angle_rad: np.ndarray, apodization_rad: float) -> np.ndarray:
    """C2 taper of the angle from the edge: 0 at the edge, 1 from ``apodization_rad`` on (see module doc)."""
    angle = np.asarray(angle_rad, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        x = np.sqrt((1.0 - np.cos(np.minimum(angle, math.pi))) / (1.0 - math.cos(apodization_rad)))
    return np.where(x < 1.0, 0.5 * (1.0 - np.cos(math.pi * np.minimum(x, 1.0))), 1.0)


def apodized_mask(inside: np.ndarray, apodization_deg: float) -> np.ndarray:
    """The analysis mask [npix] float in [0, 1]: ``inside`` (bool) with its edge tapered over ``apodization_deg``."""
    inside = np.asarray(inside, dtype=bool)
    if apodization_deg <= 0 or inside.all() or not inside.any():
        return inside.astype(np.float64)
    apodization = math.radians(apodization_deg)
    distance = distance_to_edge(inside, apodization)
    mask = np.where(inside, c2_taper(distance, apodization), 0.0)
    return mask


def mask_moments(mask: np.ndarray) -> tuple[float, float]:
    """``(w2, fsky)``: mean of mask^2 over the sphere, and the fraction of pixels with mask > 0."""
    mask = np.asarray(mask, dtype=np.float64)
    return float(np.mean(mask * mask)), float(np.count_nonzero(mask > 0) / mask.size)


# --------------------------------------------------------------------------- spectra and bins


def pseudo_spectra(iqu: np.ndarray, mask: np.ndarray, lmax: int) -> np.ndarray:
    """Pseudo-spectra [6, lmax + 1] (K^2; TT, EE, BB, TE, EB, TB) of ``iqu [3, npix]`` (K) times ``mask [npix]``.

    Pixels where the mask is 0 may hold anything (UNSEEN): they are zeroed
    first. a_lm up to ``max(3 nside - 1, lmax)`` (see the module doc).
    """
    iqu = np.asarray(iqu, dtype=np.float64)
    mask = np.asarray(mask, dtype=np.float64)
    nside = hp.npix2nside(mask.size)
    weighted = np.where(mask > 0, iqu, 0.0) * mask
    alm_lmax = max(3 * nside - 1, lmax)
    cl = hp.anafast(weighted, lmax=alm_lmax, pol=True, iter=ANAFAST_ITERATIONS)
    return np.asarray(cl)[:, : lmax + 1]


def ell_bins(lmax: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last multipole (inclusive) of each bin: ``[2, 1 + w], [2 + w, 1 + 2w], ...`` up to ``lmax``."""
    if lmax < FIRST_ELL or width < 1:
        raise ValueError(f"need lmax >= {FIRST_ELL} and width >= 1, got lmax={lmax}, width={width}")
    ell_min = np.arange(FIRST_ELL, lmax + 1, width, dtype=np.int64)
    ell_max = np.minimum(ell_min + width - 1, lmax)
    return ell_min, ell_max


def bin_spectra(cl: np.ndarray, ell_min: np.ndarray, ell_max: np.ndarray) -> np.ndarray:
    """Bin means [k, n_bins] of ``cl [k, >= ell_max[-1] + 1]`` (uniform weight over each bin's multipoles)."""
    cl = np.atleast_2d(np.asarray(cl, dtype=np.float64))
    cumulative = np.concatenate([np.zeros((cl.shape[0], 1)), np.cumsum(cl, axis=1)], axis=1)
    sums = cumulative[:, ell_max + 1] - cumulative[:, ell_min]
    return sums / (ell_max - ell_min + 1)


def sky_model_spectra(cls_in: np.ndarray, fwhm_rad: float, sky_lmax: int, lmax: int) -> np.ndarray:
    """Expected full-sky spectra [6, lmax + 1] of the simulated sky: ``C_l^in B_l^2`` (TT, EE, BB, TE; EB = TB = 0).

    ``cls_in [>= sky_lmax + 1, 4]`` holds TT, EE, BB, TE (K^2) per ell, as
    :func:`mapmaker.model.sky.load_fiducial_cls` gives them; multipoles above the
    sky's band limit ``sky_lmax`` are 0. The beams are those
    :func:`mapmaker.model.sky.synthesize_cmb` applies. No pixel window (module doc).
    """
    model = np.zeros((6, lmax + 1))
    top = min(sky_lmax, lmax)
    beam = hp.gauss_beam(fwhm_rad, lmax=top, pol=True) if fwhm_rad > 0 else np.ones((top + 1, 4))
    cls_in = np.asarray(cls_in, dtype=np.float64)[: top + 1]
    model[0, : top + 1] = cls_in[:, 0] * beam[:, 0] ** 2
    model[1, : top + 1] = cls_in[:, 1] * beam[:, 1] ** 2
    model[2, : top + 1] = cls_in[:, 2] * beam[:, 2] ** 2
    model[3, : top + 1] = cls_in[:, 3] * beam[:, 0] * beam[:, 1]
    return model


# --------------------------------------------------------------------------- one realisation


@dataclass
class RealizationSpectra:
    """The spectra products of one realisation (root only)."""

    mask: np.ndarray  # [npix] float, apodised analysis mask
    w2: float
    fsky: float
    lmax: int
    ell_bin_width: int
    ell_min: np.ndarray  # [n_bins] int
    ell_max: np.ndarray  # [n_bins] int
    cl: np.ndarray  # [6, lmax + 1] K^2, unbinned pseudo-spectra
    binned: np.ndarray  # [6, n_bins] K^2
    model: np.ndarray | None  # [6, lmax + 1] K^2, C_l^in B_l^2; None without a CMB sky
    model_binned: np.ndarray | None  # [6, n_bins]


def realization_spectra(
    iqu: np.ndarray,
    hits: np.ndarray,
    *,
    min_hits: int,
    apodization_deg: float,
    lmax: int,
    ell_bin_width: int,
    model_cls: np.ndarray | None = None,
    model_fwhm_rad: float = 0.0,
    model_sky_lmax: int = 0,
) -> RealizationSpectra:
    """Mask, pseudo-spectra and bins of one map ``iqu [3, npix]`` (K, UNSEEN where not solved), ``hits [npix]``.

    ``model_cls`` (TT, EE, BB, TE per ell, K^2) with the beam FWHM and band
    limit of the simulated CMB gives the binned sky model; None skips it.
    """
    iqu = np.asarray(iqu, dtype=np.float64)
    solved = iqu[0] != hp.UNSEEN
    mask = apodized_mask(binary_mask(hits, solved, min_hits), apodization_deg)
    w2, fsky = mask_moments(mask)
    cl = pseudo_spectra(iqu, mask, lmax)
    ell_min, ell_max = ell_bins(lmax, ell_bin_width)
    model = model_binned = None
    if model_cls is not None:
        model = sky_model_spectra(model_cls, model_fwhm_rad, model_sky_lmax, lmax)
        model_binned = bin_spectra(model, ell_min, ell_max)
    return RealizationSpectra(
        mask=mask,
        w2=w2,
        fsky=fsky,
        lmax=lmax,
        ell_bin_width=ell_bin_width,
        ell_min=ell_min,
        ell_max=ell_max,
        cl=cl,
        binned=bin_spectra(cl, ell_min, ell_max),
        model=model,
        model_binned=model_binned,
    )


def for_campaign(spec: CampaignSpec, iqu: np.ndarray, hits: np.ndarray) -> RealizationSpectra:
    """:func:`realization_spectra` with the settings of a :class:`schemas.spec.CampaignSpec`.

    ``lmax`` defaults to 2 nside; the sky model exists for CMB skies that the
    campaign simulates (``signal-only`` and ``signal+noise``).
    """
    nside = spec.pixelization.nside
    products = spec.products
    lmax = products.lmax or 2 * nside
    model = {}
    if spec.simulates_signal and isinstance(spec.sky, CmbSky):
        cls_in = load_fiducial_cls()
        model = {
            "model_cls": cls_in,
            "model_fwhm_rad": spec.sky.fwhm_arcmin * ARCMIN,
            "model_sky_lmax": min(spec.sky.lmax or 3 * nside - 1, len(cls_in) - 1),  # as mapmaker.model.sky.build_sky
        }
    return realization_spectra(
        iqu,
        hits,
        min_hits=products.min_hits,
        apodization_deg=products.apodization_deg,
        lmax=lmax,
        ell_bin_width=products.ell_bin_width,
        **model,
    )


def result_record(spec: CampaignSpec, measured: RealizationSpectra) -> dict:
    """The compact record of :class:`schemas.result.BinnedSpectra` (as plain data)."""
    def by_name(rows: np.ndarray) -> dict[str, list[float]]:
        return {name: [float(value) for value in row] for name, row in zip(SPECTRA, rows, strict=True)}

    fwhm = spec.sky.fwhm_arcmin if spec.simulates_signal and isinstance(spec.sky, CmbSky | MapSky) else None
    return {
        "ell_min": [int(ell) for ell in measured.ell_min],
        "ell_max": [int(ell) for ell in measured.ell_max],
        "lmax": measured.lmax,
        "ell_bin_width": measured.ell_bin_width,
        "cl": by_name(measured.binned),
        "w2": measured.w2,
        "fsky": measured.fsky,
        "apodization_deg": spec.products.apodization_deg,
        "min_hits": spec.products.min_hits,
        "signal": spec.simulates_signal,
        "noise": spec.simulates_noise,
        "model": by_name(measured.model_binned) if measured.model_binned is not None else None,
        "beam_fwhm_arcmin": fwhm,
    }
