"""Fast twin of :func:`.noise.apply_inverse_noise`: ducc0 real FFTs, in place, intervals in threads.

The numpy kernel (scipy.fft rfft -> multiply -> irfft) stays the reference.
Here each interval is transformed *in place* in FFTPACK's halfcomplex order
with ``ducc0.fft.r2r_fftpack`` (no complex copy, no allocation), multiplied
by its filter laid out in the same order with the ``1/n`` of the inverse
transform folded in (:func:`halfcomplex_filter`), and transformed back. The
same circulant filter, in double precision: results agree with the
reference to ~1e-15 of the TOD's norm.

ducc0's FFTs are 3-5x faster than scipy's pocketfft on this project's
machine for the usual interval lengths (10^4 - 10^6, smooth) and release
the GIL, so intervals run concurrently in the thread pool of
:mod:`mapmaker.threads` (contiguous groups of intervals balanced by sample
count, one per thread).
"""
from __future__ import annotations

import ducc0
import numpy as np
from numba import njit

from mapmaker import threads as threading


def halfcomplex_filter(inverse_psd: np.ndarray, n: int) -> np.ndarray:
    """The rfft filter ``inverse_psd [n // 2 + 1]`` laid out like FFTPACK halfcomplex ``[n]``, divided by n.

    Halfcomplex order is ``r0, r1, i1, r2, i2, ..., (r_{n/2} for even n)``:
    each frequency's factor multiplies both its real and imaginary part.
    """
    if len(inverse_psd) != n // 2 + 1:
        raise ValueError(f"filter has {len(inverse_psd)} frequencies, intervals have {n} samples")
    out = np.empty(n, dtype=np.float64)
    out[0] = inverse_psd[0]
    pairs = (n - 1) // 2
    out[1 : 1 + 2 * pairs : 2] = inverse_psd[1 : 1 + pairs]
    out[2 : 2 + 2 * pairs : 2] = inverse_psd[1 : 1 + pairs]
    if n % 2 == 0 and n > 1:
        out[-1] = inverse_psd[-1]
    out /= n
    return out


@njit(nogil=True, cache=True)
def multiply_in_place(values, factors):
    for j in range(len(values)):
        values[j] *= factors[j]


def filter_in_place(segment: np.ndarray, halfcomplex: np.ndarray) -> None:
    """One interval [n] in place: ``irfft(rfft(segment) * inverse_psd)`` (halfcomplex filter [n])."""
    ducc0.fft.r2r_fftpack(segment, axes=(0,), real2hermitian=True, forward=True, out=segment)
    multiply_in_place(segment, halfcomplex)
    ducc0.fft.r2r_fftpack(segment, axes=(0,), real2hermitian=False, forward=False, out=segment)


def apply_inverse_noise(
    tod: np.ndarray,
    interval_starts: np.ndarray,
    interval_lengths: np.ndarray,
    filter_index: np.ndarray,
    halfcomplex_filters: list[np.ndarray],
    threads: int = 1,
) -> np.ndarray:
    """N^-1 in place, as :func:`.noise.apply_inverse_noise`; filters from :func:`halfcomplex_filter`.

    tod [n_samp] float64 (K), interval_starts / interval_lengths /
    filter_index [n_int] int64 (non-overlapping intervals),
    halfcomplex_filters: [length] float64 per filter (K^-2 / n). Returns ``tod`` (K^-1).
    """
    starts = interval_starts.tolist()
    lengths = interval_lengths.tolist()
    chosen = filter_index.tolist()
    for i, length in enumerate(lengths):
        if len(halfcomplex_filters[chosen[i]]) != length:
            raise ValueError(f"filter {chosen[i]} has length {len(halfcomplex_filters[chosen[i]])}, interval {length}")

    def run(group: range) -> None:
        for i in group:
            filter_in_place(tod[starts[i] : starts[i] + lengths[i]], halfcomplex_filters[chosen[i]])

    groups = threading.balanced_groups(lengths, threads)
    if len(groups) <= 1:
        for group in groups:
            run(group)
    else:
        list(threading.pool(len(groups)).map(run, groups))
    return tod
