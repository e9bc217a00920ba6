"""Compiled twins of :mod:`.projection`: P and P^T (numba, threads).

Same arguments and results as the numpy kernels; ``local_index`` may be
int32 or int64. P is an embarrassingly parallel gather (one contiguous
block of samples per thread). P^T scatters into the map, so threads would race on shared
pixels: each of the T numba threads sums a contiguous block of samples
into a *private* map, and the T partial maps are added afterwards in a
parallel loop over pixels (T x n_local x 3 x 8 bytes of scratch). With one
thread the sums go straight into the result, in sample order -- the same
order as the numpy kernel's ``bincount``, hence the same bits.

The sample loops (:func:`gather_samples`, :func:`scatter_samples`) work on
a row at a time with :mod:`mapmaker.kernels.rows` and request the map row
``PREFETCH_DISTANCE`` samples ahead in a loop of their own, two samples an
iteration: the first element of sample ``t``'s row and the last of sample
``t + 1``'s (one request a sample; see :mod:`mapmaker.kernels.prefetch`).
The last samples, with nothing ahead, run in a second loop without the
request: no per-sample test of the distance to the end.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from mapmaker.kernels.prefetch import (
    PREFETCH_DISTANCE,
    prefetch_first_for_read,
    prefetch_first_for_write,
    prefetch_last_for_read,
    prefetch_last_for_write,
)
from mapmaker.kernels.rows import add_to_row, add_to_row_reading_ahead, dot_row
from mapmaker.kernels.streaming import store_fence, store_streaming

# Below this many samples per thread, P^T runs on one thread (the private maps would cost more).
SERIAL_SAMPLES_PER_THREAD = 1 << 16
# From this many samples (32 MiB of TOD, the L3 of the project's machines) P writes its TOD with streaming
# stores (mapmaker.kernels.streaming): a TOD that size leaves the caches before it is read anyway.
STREAMING_SAMPLES = 1 << 22


@njit(nogil=True, cache=True)
def gather_samples(local_map, local_index, weights, out):
    """``out[t] = weights[t] . local_map[local_index[t]]`` (P on a slice of samples; arrays of equal length).

    local_map [n_local, 3] float64 and weights [n, 3] C-contiguous (see :mod:`mapmaker.kernels.rows`).
    """
    n = len(out)
    ahead = max(n - PREFETCH_DISTANCE - 1, 0) & ~1  # an even count of samples with a row to request
    for t in range(0, ahead, 2):
        prefetch_first_for_read(local_map, local_index[t + PREFETCH_DISTANCE])
        out[t] = dot_row(local_map, local_index[t], weights, t)
        prefetch_last_for_read(local_map, local_index[t + 1 + PREFETCH_DISTANCE])
        out[t + 1] = dot_row(local_map, local_index[t + 1], weights, t + 1)
    for t in range(ahead, n):
        out[t] = dot_row(local_map, local_index[t], weights, t)


@njit(nogil=True, cache=True)
def stream_samples(local_map, local_index, weights, out):
    """:func:`gather_samples` writing ``out`` with streaming stores (see :mod:`mapmaker.kernels.streaming`)."""
    n = len(out)
    ahead = max(n - PREFETCH_DISTANCE - 1, 0) & ~1
    for t in range(0, ahead, 2):
        prefetch_first_for_read(local_map, local_index[t + PREFETCH_DISTANCE])
        store_streaming(out, t, dot_row(local_map, local_index[t], weights, t))
        prefetch_last_for_read(local_map, local_index[t + 1 + PREFETCH_DISTANCE])
        store_streaming(out, t + 1, dot_row(local_map, local_index[t + 1], weights, t + 1))
    for t in range(ahead, n):
        out[t] = dot_row(local_map, local_index[t], weights, t)
    store_fence()


@njit(parallel=True, nogil=True, cache=True)
def _project(local_map, local_index, weights, out, blocks, streaming):
    n = len(out)
    for b in prange(blocks):
        first, stop = b * n // blocks, (b + 1) * n // blocks
        if streaming:
            stream_samples(local_map, local_index[first:stop], weights[first:stop], out[first:stop])
        else:
            gather_samples(local_map, local_index[first:stop], weights[first:stop], out[first:stop])


def iqu_rows(array: np.ndarray, name: str) -> np.ndarray:
    """``array`` as the C-contiguous [n, 3] rows the compiled loops address as ``data + 3 row``."""
    if array.ndim != 2 or array.shape[1] != 3:
        raise ValueError(f"{name} must be [n, 3], got shape {array.shape}")
    return np.ascontiguousarray(array)


def iqu_target(out: np.ndarray) -> np.ndarray:
    """A map the sums are added into: [n_local, 3] float64 and C-contiguous already (a copy would lose them)."""
    if out.shape[1:] != (3,) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous [n_local, 3] float64 array, got {out.dtype} {out.shape}")
    return out


def project_map_to_tod(local_map: np.ndarray, local_index: np.ndarray, weights: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """P: ``tod[t] = sum_k weights[t, k] * local_map[local_index[t], k]``.

    local_map [n_local, 3] float64 (K), local_index [n_samp] int32/int64,
    weights [n_samp, 3] float32/float64 -> tod [n_samp] float64 (K), written into ``out`` if given.
    """
    if out is None:
        out = np.empty(len(local_index), dtype=np.float64)
    blocks = max(1, min(numba.get_num_threads(), len(out) // SERIAL_SAMPLES_PER_THREAD))
    _project(iqu_rows(np.asarray(local_map, dtype=np.float64), "local_map"), local_index, iqu_rows(weights, "weights"), out,
             blocks, len(out) >= STREAMING_SAMPLES)
    return out


@njit(inline="always", cache=True)
def scatter_samples(tod, local_index, weights, out):
    """``out[local_index[t], k] += weights[t, k] * tod[t]`` for every t, in order (arrays of equal length).

    Callers pass slices rather than an offset: a plain ``range(len)`` loop compiles to faster code.
    out [n_local, 3] float64 and weights [n, 3] C-contiguous (see :mod:`mapmaker.kernels.rows`).
    """
    n = len(tod)
    ahead = max(n - PREFETCH_DISTANCE - 1, 0) & ~1  # an even count of samples with a row to request
    for t in range(0, ahead, 2):
        prefetch_first_for_write(out, local_index[t + PREFETCH_DISTANCE])
        add_to_row_reading_ahead(out, local_index[t], weights, t, tod[t])
        prefetch_last_for_write(out, local_index[t + 1 + PREFETCH_DISTANCE])
        add_to_row_reading_ahead(out, local_index[t + 1], weights, t + 1, tod[t + 1])
    for t in range(ahead, n):
        add_to_row(out, local_index[t], weights, t, tod[t])


@njit(parallel=True, nogil=True, cache=True)
def add_partial_maps(partial, out):
    """``out += partial.sum(axis=0)``: partial [T, n_local, 3], out [n_local, 3], threads over pixels."""
    for p in prange(out.shape[0]):
        for k in range(3):
            total = out[p, k]
            for b in range(partial.shape[0]):
                total += partial[b, p, k]
            out[p, k] = total


@njit(parallel=True, nogil=True, cache=True)
def _accumulate(tod, local_index, weights, out, blocks):
    n = len(tod)
    if blocks == 1:
        scatter_samples(tod, local_index, weights, out)
        return
    partial = np.zeros((blocks, out.shape[0], 3))
    for b in prange(blocks):
        first, stop = b * n // blocks, (b + 1) * n // blocks
        scatter_samples(tod[first:stop], local_index[first:stop], weights[first:stop], partial[b])
    add_partial_maps(partial, out)


def accumulate_tod_to_map(
    tod: np.ndarray, local_index: np.ndarray, weights: np.ndarray, n_local: int, out: np.ndarray | None = None
) -> np.ndarray:
    """P^T: ``map[p, k] = sum over samples t with local_index[t] = p of weights[t, k] * tod[t]``.

    tod [n_samp] float64, local_index [n_samp] int32/int64, weights [n_samp, 3] float64
    -> map [n_local, 3] float64. With ``out`` the sums are *added* to it.
    """
    if out is None:
        out = np.zeros((n_local, 3), dtype=np.float64)
    blocks = max(1, min(numba.get_num_threads(), len(tod) // SERIAL_SAMPLES_PER_THREAD))
    _accumulate(tod, local_index, iqu_rows(weights, "weights"), iqu_target(out), blocks)
    return out


@njit(inline="always", cache=True)
def scatter_samples_in_rows(tod, local_index, weights, rows, keep, out):
    """:func:`scatter_samples` of the samples whose pixel row has ``rows[row] == keep`` alone."""
    n = len(tod)
    ahead = max(n - PREFETCH_DISTANCE - 1, 0) & ~1
    for t in range(0, ahead, 2):
        prefetch_first_for_write(out, local_index[t + PREFETCH_DISTANCE])
        p = local_index[t]
        if rows[p] == keep:
            add_to_row_reading_ahead(out, p, weights, t, tod[t])
        prefetch_last_for_write(out, local_index[t + 1 + PREFETCH_DISTANCE])
        p = local_index[t + 1]
        if rows[p] == keep:
            add_to_row_reading_ahead(out, p, weights, t + 1, tod[t + 1])
    for t in range(ahead, n):
        p = local_index[t]
        if rows[p] == keep:
            add_to_row(out, p, weights, t, tod[t])


@njit(parallel=True, nogil=True, cache=True)
def _accumulate_in_rows(tod, local_index, weights, rows, keep, out, blocks):
    n = len(tod)
    if blocks == 1:
        scatter_samples_in_rows(tod, local_index, weights, rows, keep, out)
        return
    partial = np.zeros((blocks, out.shape[0], 3))
    for b in prange(blocks):
        first, stop = b * n // blocks, (b + 1) * n // blocks
        scatter_samples_in_rows(tod[first:stop], local_index[first:stop], weights[first:stop], rows, keep, partial[b])
    add_partial_maps(partial, out)


def accumulate_tod_to_rows(
    tod: np.ndarray, local_index: np.ndarray, weights: np.ndarray, rows: np.ndarray, keep: bool, out: np.ndarray
) -> np.ndarray:
    """P^T of the samples whose pixel row ``p`` has ``rows[p] == keep``, *added* to out [n_local, 3].

    rows [n_local] bool (a per-pixel mask: no per-sample array); the other samples add nothing.
    """
    blocks = max(1, min(numba.get_num_threads(), len(tod) // SERIAL_SAMPLES_PER_THREAD))
    _accumulate_in_rows(tod, local_index, iqu_rows(weights, "weights"), rows, keep, iqu_target(out), blocks)
    return out


@njit(nogil=True, cache=True)
def _permute_float_rows(rows, order, out):
    n, width = len(order), rows.shape[1]
    ahead = max(n - PREFETCH_DISTANCE, 0)
    for i in range(ahead):
        prefetch_first_for_read(rows, order[i + PREFETCH_DISTANCE])
        prefetch_last_for_read(rows, order[i + PREFETCH_DISTANCE])
        q = order[i]
        for k in range(width):
            out[i, k] = rows[q, k]
    for i in range(ahead, n):
        q = order[i]
        for k in range(width):
            out[i, k] = rows[q, k]


def permute_rows(rows: np.ndarray, order: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``rows[order]``: pixel rows [n_local, ...] in another order (order [n_local] int32/int64), into ``out`` if given.

    Rows of float64 [n_local, k] -- the IQU maps of every PCG iteration (two permutations between sorted
    and visit-order rows), the set-up's packed 3x3 blocks (k = 6, 12) -- go through a compiled gather that
    requests row ``order[i + PREFETCH_DISTANCE]`` ahead: ~3 ns a row of 3 on the nside-256 bench map
    (550,000 rows, 13 MiB), where numpy's ``rows[order]`` took 25-60 ns a row (every row a cache miss, a
    few in flight). ``out`` [n, k] float64 may be a strided view (a half of a wider array). Other shapes
    and types take ``np.take``. Copies only: the same bits.
    """
    if rows.ndim != 2 or rows.dtype != np.float64:
        return np.take(rows, order, axis=0, out=out)
    if out is None:
        out = np.empty((len(order), rows.shape[1]))
    elif out.shape != (len(order), rows.shape[1]) or out.dtype != np.float64:
        raise ValueError(f"out must be a [{len(order)}, {rows.shape[1]}] float64 array, got {out.dtype} {out.shape}")
    _permute_float_rows(np.ascontiguousarray(rows), order, out)
    return out


@njit(parallel=True, nogil=True, cache=True)
def triad(a, b, c, scalar):
    """STREAM triad ``a = b + scalar c`` [n] float64: the memory-bandwidth yardstick of ``mapmaker bench``."""
    for i in prange(len(a)):
        a[i] = b[i] + scalar * c[i]


def first_visit_order(local_index: np.ndarray, n_local: int) -> tuple[np.ndarray, np.ndarray]:
    """Renumber local pixels in the order the samples first visit them, in place; returns ``(order, position)``.

    local_index [n_samp] int32/int64 (positions in the sorted local pixels,
    every one of ``n_local`` used) becomes positions in visit order;
    order [n_local] gives the sorted row of each visit-order row and
    position [n_local] the inverse, both of ``local_index``'s type (int32
    below 2^31 local pixels: 4 bytes a pixel each, kept for the whole solve).
    Consecutive samples then touch
    neighbouring map rows -- a scan revisits pixels in nearly the order it
    first saw them -- so P and P^T gather and scatter within fewer cache
    lines than with RING-sorted rows (2-3x fewer misses at nside 256).
    """
    position = np.full(n_local, -1, dtype=local_index.dtype)
    order = np.empty(n_local, dtype=local_index.dtype)
    _number_in_visit_order(local_index, order, position)
    return order, position


@njit(nogil=True, cache=True)
def _number_in_visit_order(local_index, order, position):
    count = 0
    for t in range(len(local_index)):
        p = local_index[t]
        q = position[p]
        if q < 0:
            q = count
            position[p] = q
            order[q] = p
            count += 1
        local_index[t] = q


@njit(nogil=True, fastmath=True, cache=True)
def polynomial(values, out, passes):
    """``out = p(values)``, a degree-8 Horner polynomial (8 FMAs, 16 flops per element), ``passes`` times.

    values / out [n] float64, small enough for L1: the in-cache flop-rate yardstick of ``mapmaker bench``.
    """
    for _ in range(passes):
        for i in range(len(values)):
            x = values[i]
            out[i] = ((((((((0.5 * x + 0.25) * x + 0.125) * x + 0.0625) * x + 0.03125) * x + 0.015625) * x
                        + 0.0078125) * x + 0.00390625) * x + 0.001953125)
