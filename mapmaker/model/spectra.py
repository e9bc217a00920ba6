"""Spectra of one realisation's map: the analysis mask, pseudo-spectra in ell bins, decoupled bandpowers, the sky model.

Pure functions on full-sky HEALPix arrays (RING); nothing here sees ``comm`` or a file.
Root calls :func:`for_campaign` after the map is gathered, with the mode coupling of the
campaign's mask (:mod:`mapmaker.model.bandpowers`; the program reads or builds it).

Definitions (all spectra in K^2, HEALPix RING, ``npix = 12 nside^2``):

* **Analysis mask**: :func:`mapmaker.model.bandpowers.analysis_mask`, the one
  apodisation of the project: a pixel is in when it has ``hits >= products.min_hits``
  and was solved (not cut by ``solver.rcond_min``), and its weight rises from 0 at
  the edge to 1 at ``products.apodization_deg`` with pspy's C2 taper (smooth enough
  for pure B). It depends on the pointing only, so every realisation of a campaign
  has the same one; ``apodization_deg = 0`` or a full-sky scan leave the binary mask.
* **Monopole and dipole**: fitted to the I map over the mask and removed before any
  transform (:func:`mapmaker.model.bandpowers.remove_monopole_dipole`); an
  unconstrained offset of a ground scan would otherwise dominate TT through the mask.
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
  Those a_lm are the bandpowers' plain T and spin-2 a_lm (the pure estimator
  computes them), so a realisation takes the pseudo-spectra from them (equal to
  ``anafast`` to round-off) when the bandpowers' band limit is the same.
* **Bins**: ``[2, 2 + w - 1], [2 + w, 2 + 2w - 1], ...`` up to ``lmax``
  (the last bin may be narrower), ``w = products.ell_bin_width``; a binned
  value is the plain mean of C_l over the bin's multipoles.
* **Bandpowers**: :func:`mapmaker.model.bandpowers.decoupled_bandpowers` of the
  cleaned map on the same mask, pure B when ``products.purify_b``, bins of
  ``products.ell_bin_width`` up to ``3 nside - 2``; their model is
  :func:`mapmaker.model.bandpowers.model_bandpowers` of the sky model below.
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
import time
from dataclasses import dataclass

import healpy as hp
import numpy as np

from mapmaker.model import bandpowers
from mapmaker.model.sky import ARCMIN, sky_input_cls
from schemas.spec import CampaignSpec, CmbSky, MapSky

SPECTRA = bandpowers.SPECTRA  # TT EE BB TE EB TB: healpy.anafast order for (I, Q, U)
FIRST_ELL = 2  # monopole and dipole are left out of every bin
ANAFAST_ITERATIONS = bandpowers.HARMONIC_ITERATIONS  # the same as the bandpowers', whose plain a_lm give the pseudo-spectra


# --------------------------------------------------------------------------- mask


def campaign_mask(
    spec: CampaignSpec, iqu: np.ndarray, hits: np.ndarray, known: bandpowers.Coupling | None = None
) -> np.ndarray:
    """The analysis mask [npix] of a campaign's map ``iqu [3, npix]`` (UNSEEN where not solved) and ``hits [npix]``.

    :func:`mapmaker.model.bandpowers.analysis_mask` (pspy's C2 taper) of the pixels with
    ``hits >= products.min_hits`` that the solver kept, tapered over ``products.apodization_deg``;
    ``known`` a coupling whose mask it may be (taken from it, not tapered again).
    """
    solved = np.asarray(iqu)[0] != hp.UNSEEN
    return bandpowers.analysis_mask(
        hits, apodisation_deg=spec.products.apodization_deg, min_hits=spec.products.min_hits, solved=solved,
        known=known,
    )


def campaign_binning(spec: CampaignSpec) -> bandpowers.Binning:
    """The bandpowers' bins: ``products.ell_bin_width`` wide from ell = 2, transforms to 3 nside - 1."""
    return bandpowers.Binning.for_nside(spec.pixelization.nside, spec.products.ell_bin_width)


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
    weighted = np.where(mask > 0, iqu, 0.0) * mask
    cl = hp.anafast(weighted, lmax=pseudo_alm_lmax(mask.size, lmax), pol=True, iter=ANAFAST_ITERATIONS)
    return np.asarray(cl)[:, : lmax + 1]


def pseudo_alm_lmax(npix: int, lmax: int) -> int:
    """The band limit of the pseudo-spectra's a_lm for maps of ``npix`` pixels: ``max(3 nside - 1, lmax)``."""
    return max(3 * hp.npix2nside(npix) - 1, lmax)


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
    :func:`mapmaker.model.sky.sky_input_cls` gives them; multipoles above the
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
class SkyModel:
    """The simulated CMB's input spectra and how the map-maker smoothed and band-limited them."""

    cls_in: np.ndarray  # [n_ell, 4] K^2, TT EE BB TE from ell = 0
    fwhm_rad: float
    sky_lmax: int

    def band_limited_cls(self) -> np.ndarray:
        """``[4, sky_lmax + 1]`` K^2, rows TT EE BB TE: the input spectra up to the sky's band limit."""
        return np.asarray(self.cls_in, dtype=np.float64)[: self.sky_lmax + 1].T


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
    monopole: float  # K, of the I map over the mask (removed)
    dipole: np.ndarray  # [3] K, of the I map over the mask (removed)
    coupling: bandpowers.Coupling
    bandpowers: bandpowers.Bandpowers  # decoupled, K^2
    model_bandpowers: np.ndarray | None  # [6, n_bandpower_bins] K^2, the sky model through the windows
    bandpowers_s: float  # seconds for the bandpowers given the coupling


def realization_spectra(
    iqu: np.ndarray,
    coupling: bandpowers.Coupling,
    *,
    lmax: int,
    ell_bin_width: int,
    sky_model: SkyModel | None = None,
) -> RealizationSpectra:
    """Pseudo-spectra and decoupled bandpowers of one map ``iqu [3, npix]`` (K, UNSEEN where not solved).

    The mask is the coupling's (:func:`campaign_mask`); the I map's monopole and dipole over it
    are removed first. The pseudo-spectra are those of the bandpowers' plain a_lm
    (:func:`mapmaker.model.bandpowers.masked_alms`: :func:`pseudo_spectra` to round-off) when both run
    to the same band limit, else :func:`pseudo_spectra`. ``sky_model`` gives the binned model and the model bandpowers; None skips them.
    """
    iqu = np.asarray(iqu, dtype=np.float64)
    mask = coupling.mask
    w2, fsky = mask_moments(mask)
    cleaned = iqu.copy()
    cleaned[0], monopole, dipole = bandpowers.remove_monopole_dipole(iqu[0], mask)
    started = time.perf_counter()
    alms, plain = bandpowers.masked_alms(cleaned, coupling)
    measured_bandpowers = bandpowers.bandpowers_of_alms(alms, coupling)
    bandpowers_s = time.perf_counter() - started
    if pseudo_alm_lmax(mask.size, lmax) == coupling.binning.lmax:  # the bandpowers' plain a_lm are anafast's
        cl = np.asarray(hp.alm2cl(plain))[:, : lmax + 1]
    else:
        cl = pseudo_spectra(cleaned, mask, lmax)
    ell_min, ell_max = ell_bins(lmax, ell_bin_width)
    model = model_binned = model_cb = None
    if sky_model is not None:
        model = sky_model_spectra(sky_model.cls_in, sky_model.fwhm_rad, sky_model.sky_lmax, lmax)
        model_binned = bin_spectra(model, ell_min, ell_max)
        model_cb = bandpowers.model_bandpowers(
            coupling, sky_model.band_limited_cls(), beam_fwhm_arcmin=math.degrees(sky_model.fwhm_rad) * 60.0
        )
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
        monopole=monopole,
        dipole=dipole,
        coupling=coupling,
        bandpowers=measured_bandpowers,
        model_bandpowers=model_cb,
        bandpowers_s=bandpowers_s,
    )


def campaign_sky_model(spec: CampaignSpec) -> SkyModel | None:
    """The input C_l, beam and band limit of the CMB sky a campaign simulates; None if it simulates none."""
    if not (spec.simulates_signal and isinstance(spec.sky, CmbSky)):
        return None
    cls_in = sky_input_cls(spec.sky)  # E-only / B-only skies: the other modes' spectra are 0
    nside = spec.pixelization.nside
    return SkyModel(
        cls_in=cls_in,
        fwhm_rad=spec.sky.fwhm_arcmin * ARCMIN,
        sky_lmax=min(spec.sky.lmax or 3 * nside - 1, len(cls_in) - 1),  # as mapmaker.model.sky.build_sky
    )


def for_campaign(spec: CampaignSpec, iqu: np.ndarray, coupling: bandpowers.Coupling) -> RealizationSpectra:
    """:func:`realization_spectra` with the settings of a :class:`schemas.spec.CampaignSpec`.

    ``coupling`` is that of :func:`campaign_mask` and :func:`campaign_binning` with
    ``products.purify_b``. The pseudo-spectra's ``lmax`` defaults to 2 nside; the sky model
    exists for CMB skies that the campaign simulates (``signal-only`` and ``signal+noise``).
    """
    products = spec.products
    return realization_spectra(
        iqu,
        coupling,
        lmax=products.lmax or 2 * spec.pixelization.nside,
        ell_bin_width=products.ell_bin_width,
        sky_model=campaign_sky_model(spec),
    )


def result_record(
    spec: CampaignSpec,
    measured: RealizationSpectra,
    *,
    coupling_source: str,
    coupling_build_s: float | None,
    coupling_sha256: str | None = None,
    coupling_bytes: int | None = None,
) -> dict:
    """The compact record of :class:`schemas.result.BinnedSpectra` (as plain data).

    ``coupling_source`` is "file" (read from ``realize --coupling``) or "built" (by this run, in
    ``coupling_build_s`` seconds); ``coupling_sha256`` and ``coupling_bytes`` identify the coupling
    file when there is one.
    """
    def by_name(rows: np.ndarray) -> dict[str, list[float]]:
        return {name: [float(value) for value in row] for name, row in zip(SPECTRA, rows, strict=True)}

    fwhm = spec.sky.fwhm_arcmin if spec.simulates_signal and isinstance(spec.sky, CmbSky | MapSky) else None
    binning = measured.coupling.binning
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
        "monopole_k": measured.monopole,
        "dipole_k": [float(value) for value in measured.dipole],
        "bandpowers": {
            "ell_lo": [int(ell) for ell in binning.ell_lo],
            "ell_hi": [int(ell) for ell in binning.ell_hi],
            "lmax": binning.lmax,
            "bin_width": binning.bin_width,
            "reliable": [bool(flag) for flag in binning.reliable_bins],
            "purify_b": measured.coupling.purify_b,
            "cb": by_name(measured.bandpowers.cb),
            "model": None if measured.model_bandpowers is None else by_name(measured.model_bandpowers),
            "mask_sha256": measured.coupling.mask_sha256,
            "coupling_source": coupling_source,
            "coupling_build_s": coupling_build_s,
            "coupling_sha256": coupling_sha256,
            "coupling_bytes": coupling_bytes,
            "bandpowers_s": measured.bandpowers_s,
        },
    }
