"""The definitions of the Monte Carlo bandpower products, as numpy functions on bandpower arrays.

The transfer function, the noise bias, the bandpower covariance with its Hartlap factor and the
debiased bandpowers of a data map are defined once, here, because two programs that may not import
each other compute them: the map-maker's tests and benchmarks (``mapmaker.model.bandpowers``
re-exports these functions) on batches of realisations, and the service's running aggregates
(``service.products.aggregates``) one realisation at a time. The import rules
(``tests/unit/test_architecture.py``) let both import ``schemas`` and neither import the other, so the
shared definition lives here. numpy only: no pspy, no healpy (the harmonic transforms that make
bandpowers out of maps stay in ``mapmaker``).

Shapes: bandpowers are ``[6, n_bins]`` K^2 (rows TT EE BB TE EB TB, :data:`schemas.result.SPECTRA`);
a stack of realisations ``[n_sims, 6, n_bins]``; the covariance is over the flattened ``[6 n_bins]``
(spectrum-major: index ``s * n_bins + b``).
"""

from __future__ import annotations

import math

import numpy as np


def mean_and_error(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over axis 0 and its Monte Carlo error ``std(ddof=1) / sqrt(n)`` (NaN for fewer than 2 samples)."""
    samples = np.asarray(samples, dtype=np.float64)
    n = samples.shape[0]
    mean = samples.mean(axis=0)
    if n < 2:
        return mean, np.full_like(mean, np.nan)
    return mean, samples.std(axis=0, ddof=1) / math.sqrt(n)


def transfer_ratio(mean_cb: np.ndarray, error_cb: np.ndarray, model_cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(F_b, sigma_F_b) = (mean / model, error / |model|)``; NaN where the model is 0 (EB, TB)."""
    model_cb = np.asarray(model_cb, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        transfer = np.where(model_cb != 0, np.asarray(mean_cb) / model_cb, np.nan)
        sigma = np.where(model_cb != 0, np.asarray(error_cb) / np.abs(model_cb), np.nan)
    return transfer, sigma


def transfer_function(signal_cb: np.ndarray, model_cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MASTER's transfer function per bandpower from signal-only realisations: ``(F_b, sigma_F_b)``.

    ``signal_cb [n_sims, 6, n_bins]`` decoupled bandpowers of the campaign's maps; ``model_cb
    [6, n_bins]`` the input sky through the bandpower windows with its beam
    (``mapmaker.model.bandpowers.model_bandpowers``): ``<C_b> = F_b B_b^2 C_b^in``, so
    ``F_b = mean / model`` and its Monte Carlo error ``std / sqrt(n_sims) / model``
    (``std`` with n - 1; NaN where the model is 0, e.g. EB and TB, or n_sims < 2).
    """
    mean, error = mean_and_error(signal_cb)
    return transfer_ratio(mean, error, model_cb)


# F_b is "poorly determined" where its Monte Carlo error exceeds this fraction of |F_b|.
POORLY_DETERMINED = 0.2


def transfer_unreliable(transfer: np.ndarray, sigma: np.ndarray, reliable_bins: np.ndarray) -> np.ndarray:
    """Bins of F_b not to be trusted, bool [..., n_bins] like ``transfer``: bins above 2 nside
    (``reliable_bins`` [n_bins] False, where HEALPix transforms are inaccurate), bins where F_b is undefined,
    and bins where it is poorly determined: its Monte Carlo error ``sigma`` exceeds :data:`POORLY_DETERMINED`
    times |F_b|. The last happen where the model through the beam is negligible against what the mask and
    the map-maker put into the bin (BB at low ell on a masked sky, where E leaks into B; a beam-suppressed
    tail). A NaN ``sigma`` (fewer than 2 realisations) judges nothing."""
    transfer = np.asarray(transfer, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        poorly = np.isfinite(sigma) & (sigma > POORLY_DETERMINED * np.abs(transfer))
    return ~np.asarray(reliable_bins, dtype=bool) | ~np.isfinite(transfer) | poorly


def noise_bias(noise_cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The noise bias per bandpower from noise-only realisations ``[n_sims, 6, n_bins]``: ``(N_b, sigma_N_b)`` K^2."""
    return mean_and_error(noise_cb)


def hartlap_factor(n: int, p: int) -> float:
    """``(n - p - 2) / (n - 1)`` (Hartlap et al. 2007): multiplies the inverse of a sample covariance of ``p``
    quantities from ``n`` realisations to make it unbiased; NaN when ``n <= p + 2`` (no usable inverse)."""
    return (n - p - 2) / (n - 1) if n > p + 2 else math.nan


def bandpower_covariance(samples: np.ndarray) -> tuple[np.ndarray, int, float]:
    """Sample covariance of bandpowers ``samples [n_sims, ...]`` flattened to ``[n_sims, p]``: ``(cov [p, p], n, hartlap)``.

    ``hartlap`` (:func:`hartlap_factor`) multiplies ``inv(cov)``; slice the spectra and bins wanted
    before calling: p counts every bandpower given.
    """
    samples = np.asarray(samples, dtype=np.float64)
    n = samples.shape[0]
    flat = samples.reshape(n, -1)
    p = flat.shape[1]
    if n < 2:
        raise ValueError(f"{n} realisation(s): a covariance needs at least 2")
    covariance = np.cov(flat, rowvar=False, ddof=1).reshape(p, p)
    return covariance, n, hartlap_factor(n, p)


def moments_add(count: int, mean: np.ndarray, comoment: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Add one sample ``value [p]`` to the running ``mean [p]`` and co-moment ``comoment [p, p]`` of ``count``
    samples (Welford's update, which stays accurate where the scatter is small against the mean).

    ``comoment`` is ``sum_i (x_i - mean)(x_i - mean)^T``; :func:`covariance_from_moments` turns it into
    the sample covariance, equal to :func:`bandpower_covariance` on the same samples.
    """
    value = np.asarray(value, dtype=np.float64).reshape(-1)
    delta = value - mean
    mean = mean + delta / (count + 1)
    comoment = comoment + np.outer(delta, value - mean)
    return mean, comoment


def covariance_from_moments(count: int, comoment: np.ndarray) -> tuple[np.ndarray, int, float]:
    """``(cov [p, p], n, hartlap)`` from a running co-moment of ``count`` samples (ddof 1), as :func:`bandpower_covariance`."""
    if count < 2:
        raise ValueError(f"{count} realisation(s): a covariance needs at least 2")
    covariance = np.asarray(comoment, dtype=np.float64) / (count - 1)
    covariance = 0.5 * (covariance + covariance.T)  # the update's rounding is not exactly symmetric
    return covariance, count, hartlap_factor(count, covariance.shape[0])


def debiased_bandpowers(
    data_cb: np.ndarray,
    *,
    noise_bias_cb: np.ndarray,
    transfer_b: np.ndarray,
    covariance: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Unbiased bandpowers of a data map: ``((C_b - N_b) / F_b, sigma_b)``, all ``[6, n_bins]`` K^2.

    ``data_cb`` the data map's decoupled bandpowers, ``noise_bias_cb`` and ``transfer_b`` from the
    campaigns. The result estimates the sky's bandpowers with the beam (MASTER's ``B_b^2 C_b``).
    ``sigma_b = sqrt(diag covariance) / |F_b|`` with ``covariance [6 n_bins, 6 n_bins]`` of
    signal+noise realisations (:func:`bandpower_covariance`); None without it. The Monte Carlo
    errors of N_b and F_b are not included.
    """
    data_cb = np.asarray(data_cb, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        cb = (data_cb - np.asarray(noise_bias_cb)) / np.asarray(transfer_b)
        if covariance is None:
            return cb, None
        variance = np.diag(np.asarray(covariance, dtype=np.float64)).reshape(data_cb.shape)
        return cb, np.sqrt(variance) / np.abs(transfer_b)
