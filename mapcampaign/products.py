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


@dataclass(frozen=True)
class Products:
    """The products summary of a campaign, and its arrays as numpy.

    ``summary`` is the service's answer as it is (counts, mask, downloads, warnings). Arrays are float64
    [n_bins] over the ell bins ``ell_min .. ell_max`` (inclusive, int64) centred on ``ell_center``:
    ``spectra_mean`` and ``spectra_std`` per spectrum (TT, EE, ...; K^2; std NaN below 2 realisations),
    ``noise_bias`` N_l (K^2; noise-only campaigns) and ``transfer_function`` F_l (dimensionless;
    signal-only campaigns). A product the campaign does not have yet is an empty dict or array.
    ``bandpowers``: the decoupled bandpowers and the corrections made of them (:class:`Bandpowers`), or None.
    """

    summary: ProductsSummary
    ell_min: np.ndarray
    ell_max: np.ndarray
    ell_center: np.ndarray
    spectra_mean: dict[str, np.ndarray] = field(default_factory=dict)
    spectra_std: dict[str, np.ndarray] = field(default_factory=dict)
    noise_bias: dict[str, BinnedEstimate] = field(default_factory=dict)
    transfer_function: dict[str, BinnedEstimate] = field(default_factory=dict)
    bandpowers: Bandpowers | None = None

    @classmethod
    def from_summary(cls, summary: ProductsSummary) -> Products:
        bins = summary.bins
        spectra = summary.spectra or {}
        return cls(
            summary=summary,
            ell_min=np.array(bins.ell_min if bins else [], dtype=np.int64),
            ell_max=np.array(bins.ell_max if bins else [], dtype=np.int64),
            ell_center=as_array(bins.ell_center if bins else None),
            spectra_mean={name: as_array(stats.mean) for name, stats in spectra.items()},
            spectra_std={name: as_array(stats.std, len(stats.mean)) for name, stats in spectra.items()},
            noise_bias={
                name: BinnedEstimate.from_stats(stats)
                for name, stats in (summary.noise_bias.spectra if summary.noise_bias else {}).items()
            },
            transfer_function={
                name: BinnedEstimate.from_stats(stats)
                for name, stats in (summary.transfer_function.spectra if summary.transfer_function else {}).items()
            },
            bandpowers=None if summary.bandpowers is None else Bandpowers.from_block(summary.bandpowers),
        )
