"""Fast twin of :func:`.noise.apply_inverse_noise`: ducc0 FFTs in place, intervals in threads.

The numpy kernel (scipy.fft rfft -> multiply -> irfft) stays the reference.
Each interval length gets a :class:`CirculantFilter`, made once, that
filters an interval *in place* with no allocation:

- even n (the usual case): the n real samples are read as n/2 complex
  numbers ``z_j = x_2j + i x_2j+1`` (a view, no copy), transformed with one
  complex FFT of half the length, and the real spectrum's filter is
  applied to that packed spectrum directly: each pair of frequencies
  (k, n/2 - k) mixes through a 2x2 complex map (:func:`filter_packed_spectrum`,
  derived in its docstring) into the packed spectrum of the filtered
  interval, which one inverse complex FFT unpacks. On this project's
  machines ducc0's complex FFT of n/2 points is 1.3-1.5x faster than its
  real FFT of n points (``r2r_fftpack``), and the mixing pass costs a
  tenth of a transform.
- odd n: FFTPACK's halfcomplex order with ``ducc0.fft.r2r_fftpack`` in
  place, multiplied by the filter laid out in that order
  (:func:`halfcomplex_filter`).

Either way the same circulant filter in double precision: results agree
with the reference to ~1e-15 of the TOD's norm. ducc0 releases the GIL,
so intervals run concurrently in the thread pool of :mod:`mapmaker.threads`
(contiguous groups of intervals balanced by sample count, one per thread).
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


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy", boundscheck=False)
def filter_packed_spectrum(x, s, d, w_real, w_imag):
    """Packed spectrum of an even-length interval -> packed spectrum of the filtered interval, in place.

    x [n] float64: the complex FFT ``Z [m]`` (m = n/2, interleaved real and
    imaginary parts) of ``z_j = x_2j + i x_2j+1``. With ``E_k, O_k`` the
    m-point spectra of the even and odd samples, ``Z_k = E_k + i O_k`` and
    ``conj(Z_{m-k}) = E_k - i O_k``; the real spectrum is ``X_k = E_k + w^k O_k``,
    ``X_{m-k} = conj(E_k - w^k O_k)`` (``w = exp(-2 pi i / n)``). Filtering by
    the real H and packing back gives, per pair (k, m - k),

        E' = s_k E + d_k w^k O,   O' = d_k conj(w^k) E + s_k O,
        Z'_k = E' + i O',         Z'_{m-k} = conj(E') + i conj(O'),

    with ``s_k = (H_k + H_{m-k}) / 2m`` and ``d_k = (H_k - H_{m-k}) / 2m``
    (the 1/m of the inverse FFT folded in). s, d, w_real, w_imag: [m // 2 + 1].
    """
    m = x.shape[0] // 2
    # k = 0 pairs with k = m (the Nyquist frequency): E and O are real there.
    e = x[0]
    o = x[1]
    x[0] = s[0] * e + d[0] * o
    x[1] = d[0] * e + s[0] * o
    if m % 2 == 0 and m > 1:  # k = m/2 pairs with itself: d = 0
        x[m] *= s[m // 2]
        x[m + 1] *= s[m // 2]
    for k in range(1, (m - 1) // 2 + 1):
        p = 2 * k
        q = 2 * (m - k)
        a_re = x[p]
        a_im = x[p + 1]
        b_re = x[q]
        b_im = -x[q + 1]
        e_re = 0.5 * (a_re + b_re)
        e_im = 0.5 * (a_im + b_im)
        o_re = 0.5 * (a_im - b_im)
        o_im = -0.5 * (a_re - b_re)
        c = w_real[k]
        sn = w_imag[k]
        wo_re = c * o_re - sn * o_im
        wo_im = c * o_im + sn * o_re
        we_re = c * e_re + sn * e_im  # conj(w) E
        we_im = c * e_im - sn * e_re
        e2_re = s[k] * e_re + d[k] * wo_re
        e2_im = s[k] * e_im + d[k] * wo_im
        o2_re = d[k] * we_re + s[k] * o_re
        o2_im = d[k] * we_im + s[k] * o_im
        x[p] = e2_re - o2_im
        x[p + 1] = e2_im + o2_re
        x[q] = e2_re + o2_im
        x[q + 1] = o2_re - e2_im


class CirculantFilter:
    """N^-1 of one interval length n: the circulant with eigenvalues ``inverse_psd [n // 2 + 1]`` (K^-2).

    Made once per filter; :meth:`apply` filters an [n] float64 segment in place.
    """

    def __init__(self, inverse_psd: np.ndarray, n: int):
        inverse_psd = np.asarray(inverse_psd, dtype=np.float64)
        if len(inverse_psd) != n // 2 + 1:
            raise ValueError(f"filter has {len(inverse_psd)} frequencies, intervals have {n} samples")
        self.length = n
        self.packed = n % 2 == 0 and n >= 2
        if self.packed:
            m = n // 2
            k = np.arange(m // 2 + 1)
            self.s = (inverse_psd[k] + inverse_psd[m - k]) / (2.0 * m)
            self.d = (inverse_psd[k] - inverse_psd[m - k]) / (2.0 * m)
            twiddle = np.exp(-2j * np.pi * k / n)
            self.w_real = np.ascontiguousarray(twiddle.real)
            self.w_imag = np.ascontiguousarray(twiddle.imag)
        else:
            self.halfcomplex = halfcomplex_filter(inverse_psd, n)

    def apply(self, segment: np.ndarray) -> np.ndarray:
        """Filter a contiguous segment [n] float64 (K) in place; returns it (K^-1)."""
        if self.packed:
            z = segment.view(np.complex128)
            ducc0.fft.c2c(z, axes=(0,), forward=True, out=z)
            filter_packed_spectrum(segment, self.s, self.d, self.w_real, self.w_imag)
            ducc0.fft.c2c(z, axes=(0,), forward=False, out=z)
        else:
            ducc0.fft.r2r_fftpack(segment, axes=(0,), real2hermitian=True, forward=True, out=segment)
            multiply_in_place(segment, self.halfcomplex)
            ducc0.fft.r2r_fftpack(segment, axes=(0,), real2hermitian=False, forward=False, out=segment)
        return segment


def filter_in_place(segment: np.ndarray, circulant: CirculantFilter) -> None:
    """One interval [n] in place: ``irfft(rfft(segment) * inverse_psd)``."""
    circulant.apply(segment)


def apply_inverse_noise(
    tod: np.ndarray,
    interval_starts: np.ndarray,
    interval_lengths: np.ndarray,
    filter_index: np.ndarray,
    circulant_filters: list[CirculantFilter],
    threads: int = 1,
) -> np.ndarray:
    """N^-1 in place, as :func:`.noise.apply_inverse_noise`; one :class:`CirculantFilter` per filter.

    tod [n_samp] float64 (K), interval_starts / interval_lengths /
    filter_index [n_int] int64 (non-overlapping intervals). Returns ``tod`` (K^-1).
    """
    starts = interval_starts.tolist()
    lengths = interval_lengths.tolist()
    chosen = filter_index.tolist()
    for i, length in enumerate(lengths):
        if circulant_filters[chosen[i]].length != length:
            raise ValueError(f"filter {chosen[i]} has length {circulant_filters[chosen[i]].length}, interval {length}")

    def run(group: range) -> None:
        for i in group:
            circulant_filters[chosen[i]].apply(tod[starts[i] : starts[i] + lengths[i]])

    groups = threading.balanced_groups(lengths, threads)
    if len(groups) <= 1:
        for group in groups:
            run(group)
    else:
        list(threading.pool(len(groups)).map(run, groups))
    return tod
