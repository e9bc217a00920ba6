"""A campaign's Monte Carlo products with the per-bin figures as numpy arrays (``Client.products(id)``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from schemas.products import CorrectionStats, ProductsSummary


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


@dataclass(frozen=True)
class Products:
    """The products summary of a campaign, and its arrays as numpy.

    ``summary`` is the service's answer as it is (counts, mask, downloads, warnings). Arrays are float64
    [n_bins] over the ell bins ``ell_min .. ell_max`` (inclusive, int64) centred on ``ell_center``:
    ``spectra_mean`` and ``spectra_std`` per spectrum (TT, EE, ...; K^2; std NaN below 2 realisations),
    ``noise_bias`` N_l (K^2; noise-only campaigns) and ``transfer_function`` F_l (dimensionless;
    signal-only campaigns). A product the campaign does not have yet is an empty dict or array.
    """

    summary: ProductsSummary
    ell_min: np.ndarray
    ell_max: np.ndarray
    ell_center: np.ndarray
    spectra_mean: dict[str, np.ndarray] = field(default_factory=dict)
    spectra_std: dict[str, np.ndarray] = field(default_factory=dict)
    noise_bias: dict[str, BinnedEstimate] = field(default_factory=dict)
    transfer_function: dict[str, BinnedEstimate] = field(default_factory=dict)

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
        )
