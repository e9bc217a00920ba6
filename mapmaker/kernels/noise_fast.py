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
- long even n (from :data:`FOUR_STEP_MIN_SAMPLES` = 2^18): the half-length complex
  FFT as a four-step transform (:class:`FourStepSplit`): the n/2 points seen
  as an n1 x n2 array, ducc0 FFTs down the columns, a twiddle pass, FFTs
  along the rows, the pair mixing done in that transposed order
  (:func:`mix_transposed_spectrum`), and the same steps backwards. Every
  FFT is short enough to stay in L1/L2; a single FFT of 180,000 points
  makes each of its passes over a 2.9 MB array that does not fit in L2.
- odd n: FFTPACK's halfcomplex order with ``ducc0.fft.r2r_fftpack`` in
  place, multiplied by the filter laid out in that order
  (:func:`halfcomplex_filter`).

Either way the same circulant filter in double precision: results agree
with the reference to ~1e-15 of the TOD's norm. ducc0 releases the GIL,
so intervals run concurrently in the thread pool of :mod:`mapmaker.kernels.threads`
(contiguous groups of intervals balanced by sample count, one per thread).
"""
from __future__ import annotations

import functools
import math

import ducc0
import numpy as np
from numba import njit

from mapmaker.kernels import noise as reference
from mapmaker.kernels import threads as threading

# Even intervals this long (and longer) filter through the four-step transform. `benchmarks/bench_fft.py`
# (12M samples of intervals fresh from memory, medians of 5 interleaved rounds), four-step against one
# ducc0 FFT: on an Intel Xeon with 2 MiB of L2 per core, 0.66-0.73x at 36,000 samples (seven calls into
# ducc0 instead of two), 0.77-0.84x at 72,000, 1.02-1.05x at 131,072, 1.28-1.41x at 262,144, 1.92-2.02x
# at 720,000; on the AMD EPYC of docs/results/fft.md (1 MiB L2), 0.82x at 72,000, 1.01x at 131,072,
# 1.43x at 262,144 and 1.71x at 720,000. 2^18 keeps the four-step where it wins on both.
FOUR_STEP_MIN_SAMPLES = 1 << 18


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


def pair_factors(inverse_psd: np.ndarray, m: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``s_k = (H_k + H_{m-k}) / 2m``, ``d_k = (H_k - H_{m-k}) / 2m`` of :func:`filter_packed_spectrum`; k of any shape.

    inverse_psd [m + 1] (H, the real FFT's filter of n = 2m samples); k integers in [0, m].
    """
    return (inverse_psd[k] + inverse_psd[m - k]) / (2.0 * m), (inverse_psd[k] - inverse_psd[m - k]) / (2.0 * m)


def balanced_split(m: int) -> tuple[int, int] | None:
    """``(n1, n2)`` with ``n1 * n2 == m``, n2 the largest divisor of m up to sqrt(m); None if n2 < 2 or n1 > 16 n2.

    A lopsided split (m prime, or twice a large prime) would leave one FFT as long as the whole.
    """
    n2 = max((d for d in range(1, math.isqrt(m) + 1) if m % d == 0), default=1)
    n1 = m // n2
    if n2 < 2 or n1 > 16 * n2:
        return None
    return n1, n2


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy", boundscheck=False)
def twiddle_in_place(z, twiddle, inverse):
    """``z [n1, n2] complex128 *= twiddle [n1, n2]`` (its conjugate if ``inverse``): the four-step's middle pass."""
    n1, n2 = z.shape
    for i in range(n1):
        for j in range(n2):
            w = twiddle[i, j]
            if inverse:
                w = w.conjugate()
            z[i, j] *= w


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy", boundscheck=False, inline="always")
def _mix_pair(z, p1, p2, q1, q2, s, d, w):
    """One pair (k, m - k) of :func:`filter_packed_spectrum`'s map, at z[p1, p2] and z[q1, q2], with w = w^k."""
    a = z[p1, p2]
    b = z[q1, q2].conjugate()
    e = 0.5 * (a + b)
    o = -0.5j * (a - b)
    e2 = s * e + d * (w * o)
    o2 = d * (w.conjugate() * e) + s * o
    z[p1, p2] = e2 + 1j * o2
    z[q1, q2] = e2.conjugate() + 1j * o2.conjugate()


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy", boundscheck=False)
def _mix_row_pair(x, p, q, s, d, w_real, w_imag, column_real, column_imag, scratch):
    """:func:`_mix_pair` for every k2 of rows p (forward) and q (backward) of the float view x [n1, 2 n2].

    The rows are split into real and imaginary parts in ``scratch [4, n2]``
    first, so that the arithmetic runs over contiguous arrays and
    vectorizes (2.2x faster than pair by pair, which interleaved and
    reversed loads keep scalar); the copies stay in L1. s, d [n2] are the
    row's factors; ``w^k = (w_real + i w_imag) (column_real + i column_imag)[k2]``.
    """
    n2 = scratch.shape[1]
    a_re, a_im, b_re, b_im = scratch[0], scratch[1], scratch[2], scratch[3]
    for k2 in range(n2):
        a_re[k2] = x[p, 2 * k2]
        a_im[k2] = x[p, 2 * k2 + 1]
    for k2 in range(n2):
        b_re[k2] = x[q, 2 * (n2 - 1 - k2)]
        b_im[k2] = -x[q, 2 * (n2 - 1 - k2) + 1]  # conj(Z_{m-k})
    for k2 in range(n2):
        e_re = 0.5 * (a_re[k2] + b_re[k2])
        e_im = 0.5 * (a_im[k2] + b_im[k2])
        o_re = 0.5 * (a_im[k2] - b_im[k2])
        o_im = -0.5 * (a_re[k2] - b_re[k2])
        c = w_real * column_real[k2] - w_imag * column_imag[k2]
        sn = w_real * column_imag[k2] + w_imag * column_real[k2]
        wo_re = c * o_re - sn * o_im  # w^k O
        wo_im = c * o_im + sn * o_re
        we_re = c * e_re + sn * e_im  # conj(w^k) E
        we_im = c * e_im - sn * e_re
        e2_re = s[k2] * e_re + d[k2] * wo_re
        e2_im = s[k2] * e_im + d[k2] * wo_im
        o2_re = d[k2] * we_re + s[k2] * o_re
        o2_im = d[k2] * we_im + s[k2] * o_im
        a_re[k2] = e2_re - o2_im  # Z'_k = E' + i O'
        a_im[k2] = e2_im + o2_re
        b_re[k2] = e2_re + o2_im  # Z'_{m-k} = conj(E') + i conj(O')
        b_im[k2] = o2_re - e2_im
    for k2 in range(n2):
        x[p, 2 * k2] = a_re[k2]
        x[p, 2 * k2 + 1] = a_im[k2]
    for k2 in range(n2):
        x[q, 2 * (n2 - 1 - k2)] = b_re[k2]
        x[q, 2 * (n2 - 1 - k2) + 1] = b_im[k2]


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy", boundscheck=False)
def mix_transposed_spectrum(z, s, d, w_row, w_column):
    """:func:`filter_packed_spectrum` on the four-step's output order, in place.

    z [n1, n2] complex128 holds ``Z[k1 + n1 k2]`` at ``[k1, k2]`` (m = n1 n2).
    The partner m - k of k is ``[0, n2 - k2]`` in row 0 and
    ``[n1 - k1, n2 - 1 - k2]`` elsewhere, so row k1 mixes with row n1 - k1
    read backwards (:func:`_mix_row_pair`). s, d [n1 // 2 + 1, n2]: s_k and
    d_k at k's place (rows k1 <= n1/2); ``w^k = w_row[k1] w_column[k2]``
    with w_row [n1], w_column [n2] (``w = exp(-2 pi i / n)``, n = 2m).
    """
    n1, n2 = z.shape
    # k = 0 pairs with k = m (the Nyquist frequency): E and O are real there.
    e = z[0, 0].real
    o = z[0, 0].imag
    z[0, 0] = complex(s[0, 0] * e + d[0, 0] * o, d[0, 0] * e + s[0, 0] * o)
    for k2 in range(1, (n2 + 1) // 2):
        _mix_pair(z, 0, k2, 0, n2 - k2, s[0, k2], d[0, k2], w_column[k2])
    if n2 % 2 == 0:  # k = m/2 pairs with itself: d = 0
        z[0, n2 // 2] *= s[0, n2 // 2]
    x = z.view(np.float64)  # [n1, 2 n2]: real and imaginary parts interleaved
    column_real = np.ascontiguousarray(w_column.real)
    column_imag = np.ascontiguousarray(w_column.imag)
    scratch = np.empty((4, n2))
    for k1 in range(1, (n1 + 1) // 2):
        w = w_row[k1]
        _mix_row_pair(x, k1, n1 - k1, s[k1], d[k1], w.real, w.imag, column_real, column_imag, scratch)
    if n1 % 2 == 0:  # row n1/2 is its own partner, read backwards
        k1 = n1 // 2
        for k2 in range(n2 // 2):
            _mix_pair(z, k1, k2, k1, n2 - 1 - k2, s[k1, k2], d[k1, k2], w_row[k1] * w_column[k2])
        if n2 % 2 == 1:  # k = m/2
            z[k1, n2 // 2] *= s[k1, n2 // 2]


@njit(nogil=True, cache=True, boundscheck=False)
def pull_into_cache(values):
    """Read one float64 of every 64-byte line of ``values [n]`` (their sum, so that the loop is kept).

    A sequential read, which the hardware prefetcher streams from memory at
    full bandwidth, before the column FFTs whose strided reads of a cold
    interval wait on DRAM row by row (see :class:`FourStepSplit`).
    """
    total = 0.0
    for i in range(0, values.shape[0], 8):
        total += values[i]
    return total


@functools.lru_cache(maxsize=8)
def _four_step_twiddle(n1: int, n2: int) -> np.ndarray:
    """``exp(-2 pi i k1 j2 / (n1 n2))`` [n1, n2] complex128, shared by every filter of that split (read-only)."""
    twiddle = np.exp(-2j * np.pi * np.outer(np.arange(n1), np.arange(n2)) / (n1 * n2))  # k1 j2 < n1 n2
    twiddle.flags.writeable = False
    return twiddle


class FourStepSplit:
    """The packed-spectrum filter of one even length n as a four-step FFT of its n/2 = n1 x n2 complex points.

    inverse_psd [n // 2 + 1] (K^-2); ``split`` from :func:`balanced_split`.
    """

    def __init__(self, inverse_psd: np.ndarray, n: int, split: tuple[int, int]):
        n1, n2 = split
        m = n // 2
        if n1 * n2 != m:
            raise ValueError(f"split {n1} x {n2} does not make {m} points")
        self.shape = (n1, n2)
        k = np.arange(n1 // 2 + 1)[:, None] + n1 * np.arange(n2)[None, :]  # k < m: both k and m - k in range
        self.s, self.d = pair_factors(inverse_psd, m, k)
        self.w_row = np.exp(-2j * np.pi * np.arange(n1) / n)
        self.w_column = np.exp(-2j * np.pi * n1 * np.arange(n2) / n)
        self.twiddle = _four_step_twiddle(n1, n2)

    def apply(self, segment: np.ndarray) -> None:
        """Filter a contiguous segment [n] float64 (K) in place (K^-1)."""
        # The column FFTs read a cold interval with a stride of n2 complex numbers, which the hardware
        # prefetcher does not follow across pages: read it once in order first (0.07 ms of 0.35-0.57 ms).
        pull_into_cache(segment)
        z = segment.view(np.complex128).reshape(self.shape)
        ducc0.fft.c2c(z, axes=(0,), forward=True, out=z)
        twiddle_in_place(z, self.twiddle, False)
        ducc0.fft.c2c(z, axes=(1,), forward=True, out=z)
        mix_transposed_spectrum(z, self.s, self.d, self.w_row, self.w_column)
        ducc0.fft.c2c(z, axes=(1,), forward=False, out=z)
        twiddle_in_place(z, self.twiddle, True)
        ducc0.fft.c2c(z, axes=(0,), forward=False, out=z)


class CirculantFilter:
    """N^-1 of one interval length n: the circulant with eigenvalues ``inverse_psd [n // 2 + 1]`` (K^-2).

    Made once per filter; :meth:`apply` filters an [n] float64 segment in place.
    Even lengths from ``four_step_from`` samples on, with a balanced split of
    n/2, go through :class:`FourStepSplit` (``four_step`` is then that split).
    """

    def __init__(self, inverse_psd: np.ndarray, n: int, four_step_from: int = FOUR_STEP_MIN_SAMPLES):
        inverse_psd = np.asarray(inverse_psd, dtype=np.float64)
        if len(inverse_psd) != n // 2 + 1:
            raise ValueError(f"filter has {len(inverse_psd)} frequencies, intervals have {n} samples")
        self.length = n
        self.packed = n % 2 == 0 and n >= 2
        split = balanced_split(n // 2) if self.packed and n >= four_step_from else None
        self.four_step = FourStepSplit(inverse_psd, n, split) if split else None
        if self.packed and self.four_step is None:
            m = n // 2
            k = np.arange(m // 2 + 1)
            self.s, self.d = pair_factors(inverse_psd, m, k)
            twiddle = np.exp(-2j * np.pi * k / n)
            self.w_real = np.ascontiguousarray(twiddle.real)
            self.w_imag = np.ascontiguousarray(twiddle.imag)
        elif not self.packed:
            self.halfcomplex = halfcomplex_filter(inverse_psd, n)

    def apply(self, segment: np.ndarray) -> np.ndarray:
        """Filter a contiguous segment [n] float64 (K) in place; returns it (K^-1)."""
        if self.four_step is not None:
            self.four_step.apply(segment)
        elif self.packed:
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


class OverlapSaveFilter:
    """N^-1 of one interval length n with a kernel of finite correlation length (half-width L), by overlap-save.

    ``inverse_spectrum [n // 2 + 1]`` (K^-2) is the truncated kernel's spectrum
    (:func:`mapmaker.kernels.noise.finite_kernel`): the same circulant the reference
    applies with one FFT of n, here with FFTs of :func:`~mapmaker.kernels.noise.overlap_save_block`
    samples (:func:`mapmaker.kernels.noise.overlap_save`).
    """

    def __init__(self, inverse_spectrum: np.ndarray, n: int, half_width: int):
        self.length = n
        self.half_width = half_width
        self.block = reference.overlap_save_block(half_width)
        self.block_spectrum = reference.kernel_block_spectrum(inverse_spectrum, n, half_width, self.block)

    def apply(self, segment: np.ndarray) -> np.ndarray:
        """Filter a contiguous segment [n] float64 (K) in place; returns it (K^-1)."""
        return reference.overlap_save(segment, self.block_spectrum, self.half_width, self.block)


def inverse_noise_filters(
    inverse_psds: list[np.ndarray], lengths: dict[int, int], half_widths: list[int | None] | None = None
) -> list[CirculantFilter | OverlapSaveFilter | None]:
    """One filter per filter in use, planned for its intervals' length ``lengths[f]``; None for the filters
    no interval uses. inverse_psds: [length // 2 + 1] float64 arrays (K^-2). A filter with a half-width
    in ``half_widths`` (finite correlation length) is an :class:`OverlapSaveFilter`, else a :class:`CirculantFilter`."""
    widths = half_widths or [None] * len(inverse_psds)
    return [
        (OverlapSaveFilter(inverse, lengths[f], width) if (width := widths[f]) else CirculantFilter(inverse, lengths[f]))
        if f in lengths else None
        for f, inverse in enumerate(inverse_psds)
    ]


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


def apply_inverse_white(
    tod: np.ndarray, interval_starts: np.ndarray, interval_lengths: np.ndarray, inverse_variance: np.ndarray
) -> np.ndarray:
    """N^-1 of white noise in place, as :func:`.noise.apply_inverse_white`: one scale per interval,
    nothing to transform or compile, so both implementations run the reference loop."""
    return reference.apply_inverse_white(tod, interval_starts, interval_lengths, inverse_variance)
