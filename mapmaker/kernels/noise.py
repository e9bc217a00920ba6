"""Stationary noise: PSD, synthesis in Fourier space, and N^-1 per interval.

Conventions. A stationary interval of ``n`` samples is treated as periodic
(circulant covariance), so its covariance is diagonal in the discrete
Fourier basis with eigenvalues ``S(f_k)``, ``f_k = k f_s / n``; the PSD is in
units of per-sample variance (K^2), so white noise has ``S = sigma^2``. With
numpy's unnormalised forward ``rfft``, a Fourier coefficient of such noise
has ``E|X_k|^2 = n S(f_k)``. ``N^-1`` of the interval is the circulant with
eigenvalues ``1 / S(f_k)`` -- the exact inverse of the simulated covariance.

Real FFTs come from ``scipy.fft`` so that ``workers`` can use threads.
"""
from __future__ import annotations

import numpy as np
import scipy.fft

# Intervals are filtered in batches of at most this many samples, to bound the scratch memory.
BATCH_SAMPLES = 1 << 21


def rfft_frequencies(n: int, sample_rate_hz: float) -> np.ndarray:
    """Frequencies [n // 2 + 1] (Hz) of the rfft of an n-sample interval."""
    return np.fft.rfftfreq(n, d=1.0 / sample_rate_hz)


def psd(frequencies_hz: np.ndarray, white_variance: float, f_knee_hz: float, alpha: float, f_min_hz: float) -> np.ndarray:
    """``S(f) = sigma^2 (1 + (f_knee / max(f, f_min))^alpha)`` in K^2 (per-sample variance units).

    frequencies_hz [m] -> S [m]; ``white_variance`` = sigma^2 = NET^2 f_s (K^2).
    """
    shape = np.ones_like(frequencies_hz, dtype=np.float64)
    if f_knee_hz > 0:
        shape += (f_knee_hz / np.maximum(frequencies_hz, f_min_hz)) ** alpha
    return white_variance * shape


def noise_from_normals(normals: np.ndarray, psd_values: np.ndarray) -> np.ndarray:
    """One interval of stationary noise from ``n`` standard normal deviates.

    normals [n] float64 (N(0, 1)), psd_values [n // 2 + 1] (K^2) -> noise [n] (K).
    The deviates fill the rfft coefficients in order: ``X_0`` real, then for
    k = 1 .. (n - 1) // 2 the real and imaginary parts of ``X_k`` (variance
    1/2 each), then for even n the real ``X_{n/2}``; scaled by ``sqrt(n S_k)``
    and inverse-transformed. That uses exactly n deviates.
    """
    n = len(normals)
    n_freq = n // 2 + 1
    coefficients = np.empty(n_freq, dtype=np.complex128)
    coefficients[0] = normals[0]
    n_complex = (n - 1) // 2
    pairs = normals[1 : 1 + 2 * n_complex].reshape(n_complex, 2) * np.sqrt(0.5)
    coefficients[1 : 1 + n_complex].real = pairs[:, 0]
    coefficients[1 : 1 + n_complex].imag = pairs[:, 1]
    if n % 2 == 0 and n > 1:
        coefficients[-1] = normals[-1]
    coefficients *= np.sqrt(n * psd_values)
    return scipy.fft.irfft(coefficients, n=n)


def inverse_noise_diagonal(inverse_psd: np.ndarray, n: int) -> float:
    """Diagonal element of the circulant N^-1 of an n-sample interval (K^-2).

    inverse_psd [n // 2 + 1] = 1 / S(f_k). The diagonal is the mean of the
    eigenvalues over all n Fourier modes; the rfft half counts the modes
    1 .. ceil(n/2) - 1 twice.
    """
    total = inverse_psd[0] + 2.0 * inverse_psd[1:].sum()
    if n % 2 == 0 and n > 1:
        total -= inverse_psd[-1]
    return float(total / n)


def inverse_noise_filters(inverse_psds: list[np.ndarray], lengths: dict[int, int]) -> list[np.ndarray]:
    """The N^-1 filters :func:`apply_inverse_noise` takes: the inverse PSDs [length // 2 + 1] (K^-2) themselves.

    ``lengths`` maps each filter in use to its intervals' length (the fast
    kernels' filters are planned for it; here it is not needed).
    """
    return list(inverse_psds)


def apply_inverse_noise(
    tod: np.ndarray,
    interval_starts: np.ndarray,
    interval_lengths: np.ndarray,
    filter_index: np.ndarray,
    inverse_psds: list[np.ndarray],
    threads: int = 1,
) -> np.ndarray:
    """N^-1 in place: each interval filtered by ``1 / S(f_k)`` in Fourier space.

    tod [n_samp] float64 (K), interval_starts / interval_lengths / filter_index
    [n_int] int64 (the intervals must not overlap), inverse_psds: list of
    [length // 2 + 1] float64 arrays (K^-2), one per filter, each used only
    by intervals of one length (:func:`inverse_noise_filters`); ``threads``
    FFT workers. Returns ``tod`` (now K^-1).

    Intervals sharing a filter are transformed together as the rows of a 2D
    block (a reshaped view when they lie back to back, which is the usual
    case), in batches of at most BATCH_SAMPLES samples.
    """
    for index in np.unique(filter_index):
        chosen = np.flatnonzero(filter_index == index)
        length = int(interval_lengths[chosen[0]])
        if np.any(interval_lengths[chosen] != length):
            raise ValueError(f"filter {index} is used by intervals of different lengths")
        inverse = inverse_psds[index]
        if len(inverse) != length // 2 + 1:
            raise ValueError(f"filter {index} has {len(inverse)} frequencies, intervals have {length} samples")
        batch = max(1, BATCH_SAMPLES // length)
        for first in range(0, len(chosen), batch):
            starts = interval_starts[chosen[first : first + batch]]
            if len(starts) == 1 or np.all(np.diff(starts) == length):
                view = tod[starts[0] : starts[0] + length * len(starts)].reshape(len(starts), length)
                view[:] = _filter_rows(view, inverse, length, threads)
            else:
                rows = starts[:, None] + np.arange(length)
                tod[rows] = _filter_rows(tod[rows], inverse, length, threads)
    return tod


def _filter_rows(rows: np.ndarray, inverse: np.ndarray, length: int, workers: int) -> np.ndarray:
    spectrum = scipy.fft.rfft(rows, axis=1, workers=workers)
    spectrum *= inverse
    return scipy.fft.irfft(spectrum, n=length, axis=1, workers=workers)


def apply_inverse_white(
    tod: np.ndarray, interval_starts: np.ndarray, interval_lengths: np.ndarray, inverse_variance: np.ndarray
) -> np.ndarray:
    """N^-1 of white noise in place: ``tod[t] /= sigma^2`` of its interval.

    tod [n_samp] (K), interval_starts / interval_lengths [n_int] int64,
    inverse_variance [n_int] (K^-2). Returns ``tod`` (K^-1).
    """
    rows = zip(interval_starts.tolist(), interval_lengths.tolist(), inverse_variance.tolist(), strict=True)
    for start, length, scale in rows:
        tod[start : start + length] *= scale
    return tod
