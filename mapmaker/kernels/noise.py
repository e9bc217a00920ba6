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


def inverse_noise_filters(
    inverse_psds: list[np.ndarray], lengths: dict[int, int], half_widths: list[int | None] | None = None
) -> list[np.ndarray]:
    """The N^-1 filters :func:`apply_inverse_noise` takes: the inverse PSDs [length // 2 + 1] (K^-2) themselves.

    ``lengths`` maps each filter in use to its intervals' length (the fast
    kernels' filters are planned for it; here it is not needed), and
    ``half_widths`` gives the finite-correlation-length filters' kernel
    half-widths (the fast kernels apply those by overlap-save; this
    reference applies the same circulant, whose spectrum ``inverse_psds``
    then holds, with one FFT per interval).
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


# --------------------------------------------------------------------------- finite correlation length
#
# N^-1 of an interval is the circulant whose kernel is h = irfft(1 / S) [n]. A filter of finite
# correlation length keeps h(tau) for circular lags |tau| <= L and drops the rest: still a circulant on
# the interval, so it shares the Fourier basis of N^-1 and its eigenvalues are rfft(truncated h). If
# they are within a relative delta of 1 / S at every frequency, (1 - delta) N^-1 <= N'^-1 <= (1 + delta) N^-1,
# and the map m' made with N'^-1 is unbiased with noise covariance (Gauss-Markov with a wrong weight)
#     Cov(m') <= (1 + delta) / (1 - delta) Cov(m),   Cov(m' - m) = Cov(m') - Cov(m) <= 2 delta / (1 - delta) Cov(m)
# (W' N W' <= (1 + delta) W' and P^T W' P >= (1 - delta) P^T W P). That is the stated bound: the
# finite-filter map differs from the exact one by at most sqrt(2 delta / (1 - delta)) of the exact map's
# noise rms in every pixel and mode, and its noise grows by at most sqrt((1 + delta) / (1 - delta)).
# The kernel is then applied by overlap-save (:class:`mapmaker.kernels.noise_fast.OverlapSaveFilter`): FFTs of
# a few times 2 L samples instead of one of the whole interval; this reference applies the same circulant
# with one FFT of the interval.

FINITE_MIN_HALF_WIDTH = 16


def finite_kernel(inverse_psd: np.ndarray, n: int, tolerance: float) -> tuple[int | None, np.ndarray, float]:
    """The shortest finite-correlation-length N^-1 of an n-sample interval within ``tolerance``.

    inverse_psd [n // 2 + 1] (K^-2) = 1 / S(f_k). Tries half-widths L = 16, 32, 64, ... below n / 4
    and returns ``(L, spectrum, delta)``: the truncated kernel's eigenvalues [n // 2 + 1] (K^-2) and
    their largest relative error ``delta`` against ``inverse_psd`` (<= tolerance). When no such L is
    short enough to pay (the 1/f notch below f_knee is as narrow as 1 / f_min, and a kernel must be that
    long to follow it) it returns ``(None, inverse_psd, 0.0)``: the exact filter.
    """
    inverse_psd = np.asarray(inverse_psd, dtype=np.float64)
    kernel = np.fft.irfft(inverse_psd, n)
    half_width = FINITE_MIN_HALF_WIDTH
    while 4 * half_width < n:
        truncated = kernel.copy()
        truncated[half_width + 1 : n - half_width] = 0.0
        spectrum = np.fft.rfft(truncated).real
        delta = float(np.max(np.abs(spectrum - inverse_psd) / inverse_psd))
        if delta <= tolerance:
            return half_width, spectrum, delta
        half_width *= 2
    return None, inverse_psd, 0.0


def overlap_save_block(half_width: int) -> int:
    """FFT length of the overlap-save blocks for a kernel of half-width L: a power of two >= 8 L (75% kept)."""
    return 1 << max(10, (8 * half_width - 1).bit_length())


def kernel_block_spectrum(inverse_spectrum: np.ndarray, n: int, half_width: int, block: int) -> np.ndarray:
    """rfft [block // 2 + 1] of the truncated kernel (lags |tau| <= L) placed circularly in a block of ``block``."""
    kernel = np.fft.irfft(inverse_spectrum, n)
    placed = np.zeros(block)
    placed[: half_width + 1] = kernel[: half_width + 1]
    placed[block - half_width :] = kernel[n - half_width :]
    return np.fft.rfft(placed)


def overlap_save(segment: np.ndarray, block_spectrum: np.ndarray, half_width: int, block: int, workers: int = 1) -> np.ndarray:
    """Circular convolution of segment [n] with a kernel of half-width L, by overlap-save; in place, returns it.

    The segment is padded circularly by L samples on each side (the interval's circulant), cut into
    blocks of ``block`` samples overlapping by 2 L, each block transformed, multiplied by
    ``block_spectrum`` [block // 2 + 1] and transformed back; the middle ``block - 2 L`` samples of each are kept.
    """
    n = len(segment)
    step = block - 2 * half_width
    n_blocks = -(-n // step)
    padded = np.zeros(n_blocks * step + 2 * half_width)
    padded[:half_width] = segment[n - half_width :]
    padded[half_width : half_width + n] = segment
    padded[half_width + n : 2 * half_width + n] = segment[:half_width]
    rows = np.lib.stride_tricks.as_strided(padded, shape=(n_blocks, block), strides=(8 * step, 8))
    spectrum = scipy.fft.rfft(rows, axis=1, workers=workers)
    spectrum *= block_spectrum
    filtered = scipy.fft.irfft(spectrum, n=block, axis=1, workers=workers)
    segment[:] = filtered[:, half_width : half_width + step].reshape(-1)[:n]
    return segment
