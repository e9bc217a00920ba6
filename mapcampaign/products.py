"""A campaign's Monte Carlo products with the per-bin figures as numpy arrays (``Client.products(id)``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.products import BandpowerEstimate, BandpowerProducts, CorrectionStats, ProductsSummary
from schemas.result import SPECTRA


def as_array(values: Sequence[float | None] | None, n_bins: int = 0) -> np.ndarray:
    """float64 [n_bins]; a value the service reports as null (undefined) is NaN, and so is every value of a
    figure it reports as null as a whole (``n_bins`` of them)."""
    if values is None:
        return np.full(n_bins, np.nan)
    return np.array([np.nan if value is None else value for value in values], dtype=np.float64)


@dataclass(frozen=True)
class BinnedEstimate:
    """One spectrum's per-bin estimate: ``value`` and the scatter of one realisation ``std`` and the
    uncertainty of the value ``error`` (both NaN where undefined), each float64 [n_bins]."""

    value: np.ndarray
    std: np.ndarray
    error: np.ndarray

    @classmethod
    def from_stats(cls, stats: CorrectionStats) -> BinnedEstimate:
        n_bins = len(stats.value)
        return cls(value=as_array(stats.value), std=as_array(stats.std, n_bins), error=as_array(stats.error, n_bins))


def _rows(estimates: Mapping[Any, BandpowerEstimate] | None, n_bins: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(value, error)`` float64 [6, n_bins] (rows TT EE BB TE EB TB; NaN where undefined), or None."""
    if estimates is None:
        return None
    value = np.array([as_array(estimates[name].value, n_bins) for name in SPECTRA])
    error = np.array([as_array(estimates[name].error, n_bins) for name in SPECTRA])
    return value, error


@dataclass(frozen=True)
class Bandpowers:
    """A campaign's decoupled (MASTER) bandpowers as numpy: rows ``spectra`` (TT EE BB TE EB TB), K^2, C_b.

    ``mean`` and ``error`` (its Monte Carlo error) [6, n_bins]; ``model`` the input C_l with the beam
    through the bandpower windows (or None); ``transfer`` / ``transfer_error`` F_b (signal-only),
    ``noise_bias`` / ``noise_bias_error`` N_b (noise-only), ``covariance_std`` (one realisation's
    scatter, signal+noise) with ``covariance_n`` and ``hartlap``; None where the campaign has none.
    The covariance matrix itself: ``Client.bandpower_covariance(id)``.
    """

    block: BandpowerProducts
    ell_lo: np.ndarray
    ell_hi: np.ndarray
    ell: np.ndarray
    reliable: np.ndarray
    mean: np.ndarray
    error: np.ndarray
    model: np.ndarray | None
    transfer: np.ndarray | None
    transfer_error: np.ndarray | None
    noise_bias: np.ndarray | None
    noise_bias_error: np.ndarray | None
    covariance_std: np.ndarray | None
    covariance_n: int | None
    hartlap: float | None
    spectra: tuple[str, ...] = SPECTRA

    @classmethod
    def from_block(cls, block: BandpowerProducts) -> Bandpowers:
        n_bins = len(block.bins.ell_lo)
        mean = _rows(block.mean, n_bins)
        assert mean is not None
        transfer = _rows(block.transfer_function, n_bins)
        noise = _rows(block.noise_bias, n_bins)
        covariance = block.covariance
        return cls(
            block=block,
            ell_lo=np.array(block.bins.ell_lo, dtype=np.int64),
            ell_hi=np.array(block.bins.ell_hi, dtype=np.int64),
            ell=as_array(block.bins.ell_center),
            reliable=np.array(block.bins.reliable, dtype=bool),
            mean=mean[0],
            error=mean[1],
            model=None if block.model is None else np.array([block.model[name] for name in SPECTRA]),
            transfer=None if transfer is None else transfer[0],
            transfer_error=None if transfer is None else transfer[1],
            noise_bias=None if noise is None else noise[0],
            noise_bias_error=None if noise is None else noise[1],
            covariance_std=None if covariance is None else np.array([covariance.std[name] for name in SPECTRA]),
            covariance_n=None if covariance is None else covariance.n,
            hartlap=None if covariance is None else covariance.hartlap,
        )


def _estimates(
    block: BandpowerProducts, estimates: Mapping[Any, BandpowerEstimate] | None
) -> dict[str, BinnedEstimate]:
    """Per spectrum, a bandpower estimate with its Monte Carlo ``error`` and one realisation's scatter
    ``std = error sqrt(n)``; empty without one."""
    if estimates is None:
        return {}
    n_bins = len(block.bins.ell_lo)
    out: dict[str, BinnedEstimate] = {}
    for name in SPECTRA:
        error = as_array(estimates[name].error, n_bins)
        out[name] = BinnedEstimate(
            value=as_array(estimates[name].value, n_bins), std=error * np.sqrt(block.n), error=error
        )
    return out


@dataclass(frozen=True, repr=False)
class Products:
    """The products summary of a campaign, and its arrays as numpy.

    ``summary`` is the service's answer as it is (counts, mask, downloads, warnings).

    The corrections, over the decoupled bandpower bins ``bandpowers.ell_lo .. ell_hi`` (centres
    ``bandpowers.ell``; ``bandpowers.reliable`` False above 2 nside), per spectrum TT EE BB TE EB TB as
    :class:`BinnedEstimate` (``value``, ``error`` the Monte Carlo error, ``std`` one realisation's scatter):

    * ``transfer_function``: F_b, dimensionless (signal-only campaigns with a CMB sky): ``<C_b> = F_b B_b^2
      C_b^in``; EB and TB NaN (no model);
    * ``noise_bias``: N_b, K^2 (noise-only campaigns).

    ``bandpowers``: the decoupled bandpowers themselves as [6, n_bins] arrays (:class:`Bandpowers`), or None.

    Pseudo-C_l figures over the ell bins ``ell_min .. ell_max`` (inclusive, int64) centred on ``ell_center``,
    float64 [n_bins] each: ``spectra_mean`` and ``spectra_std`` per spectrum (K^2; std NaN below 2
    realisations); ``pseudo_noise_bias`` N_l = <C~_l> / w2 (K^2) and ``pseudo_transfer_function`` F_l =
    <C~_l> / (w2 C_l^in B_l^2): full-sky approximations, biased on a masked sky, kept for comparison.
    A product the campaign does not have yet is an empty dict or None.
    """

    summary: ProductsSummary
    ell_min: np.ndarray
    ell_max: np.ndarray
    ell_center: np.ndarray
    spectra_mean: dict[str, np.ndarray] = field(default_factory=dict)
    spectra_std: dict[str, np.ndarray] = field(default_factory=dict)
    transfer_function: dict[str, BinnedEstimate] = field(default_factory=dict)
    noise_bias: dict[str, BinnedEstimate] = field(default_factory=dict)
    pseudo_noise_bias: dict[str, BinnedEstimate] = field(default_factory=dict)
    pseudo_transfer_function: dict[str, BinnedEstimate] = field(default_factory=dict)
    bandpowers: Bandpowers | None = None

    def __repr__(self) -> str:
        summary = self.summary
        has = [
            name
            for name, present in (
                ("spectra", bool(self.spectra_mean)),
                ("bandpowers", self.bandpowers is not None),
                ("transfer_function", bool(self.transfer_function)),
                ("noise_bias", bool(self.noise_bias)),
                ("covariance", self.bandpowers is not None and self.bandpowers.covariance_n is not None),
            )
            if present
        ]
        return (
            f"<Products of campaign {summary.campaign_id} ({summary.kind}, {summary.campaign_state}): "
            f"{summary.included} realisation(s) included; {', '.join(has) or 'nothing yet'}>"
        )

    @classmethod
    def from_summary(cls, summary: ProductsSummary) -> Products:
        bins = summary.bins
        spectra = summary.spectra or {}
        block = summary.bandpowers
        return cls(
            summary=summary,
            ell_min=np.array(bins.ell_min if bins else [], dtype=np.int64),
            ell_max=np.array(bins.ell_max if bins else [], dtype=np.int64),
            ell_center=as_array(bins.ell_center if bins else None),
            spectra_mean={name: as_array(stats.mean) for name, stats in spectra.items()},
            spectra_std={name: as_array(stats.std, len(stats.mean)) for name, stats in spectra.items()},
            transfer_function={} if block is None else _estimates(block, block.transfer_function),
            noise_bias={} if block is None else _estimates(block, block.noise_bias),
            pseudo_noise_bias={
                name: BinnedEstimate.from_stats(stats)
                for name, stats in (summary.noise_bias.spectra if summary.noise_bias else {}).items()
            },
            pseudo_transfer_function={
                name: BinnedEstimate.from_stats(stats)
                for name, stats in (summary.transfer_function.spectra if summary.transfer_function else {}).items()
            },
            bandpowers=None if block is None else Bandpowers.from_block(block),
        )
