"""``P^T N^-1 P`` in batches of intervals: the PCG operator without a TOD-sized array.

The numpy reference writes the TOD ``P x`` for all of a rank's samples
(8 bytes per sample, a scratch array as large as the TOD), transforms it
in place, and reads it again in P^T. Here back-to-back stationary
intervals are taken in batches of up to :func:`batch_samples_for` the
local map -- 256k samples for a map that stays in cache, else 4M -- (never
fewer than one interval), each through a per-thread buffer:

    gather P x for the whole batch -> FFT, multiply, inverse FFT each interval -> scatter P^T for the batch

so the memory stays bounded by the map, not by the number of samples per
rank (and never exceeds 8 bytes per sample). Gathering and scattering a whole batch at a time keeps
one map at a time hot in cache; fusing per single interval (the TOD
buffer then stays in L2/L3) needs both the input and the output map in
cache at once and measured up to 2x slower once the local map outgrows a
third of the L3 (nside 256), and no faster below. What must stream from
memory per sample: the pointing cache twice (``local_index`` 4 bytes +
``weights`` 12 bytes, float32, per pass) and the batch buffer (written, read and
written by the FFTs, read).

Threads: contiguous groups of intervals balanced by sample count, one per
thread of the pool in :mod:`mapmaker.kernels.threads`; each group scatters into its
own private map (the first group straight into the result), added up at the
end -- no two threads ever write the same map entry. The numba parts release
the GIL, and so do ducc0's FFTs.

White noise (no FFT): one numba pass over the samples with the interval's
``1 / sigma^2``, threads over interval groups, private maps likewise.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from mapmaker.kernels import threads as threading
from mapmaker.kernels.noise_fast import CirculantFilter
from mapmaker.kernels.prefetch import PREFETCH_DISTANCE, prefetch_row_for_read, prefetch_row_for_write
from mapmaker.kernels.projection_fast import add_partial_maps, gather_samples, iqu_rows, iqu_target, scatter_samples
from mapmaker.kernels.rows import add_to_row, dot_row

# Samples per batch of back-to-back intervals: BATCH_SAMPLES (32 MiB of buffer per thread), never more than a
# thread's own samples. Every batch brings both maps back into cache (the batch's FFTs and pointing stream evict
# them), which costs in proportion to the map: at nside 256 (550,000 local pixels) ~12 ms a batch, up to 15% of
# the operator with 4M-sample batches against one batch of all 12M samples (0.173 s against 0.148 s, float64
# weights). A batch sized by the map (32 samples per local pixel) would hide that, but its buffer is then 8 bytes
# per sample of the rank up to 32 per pixel -- the largest array of the solve at a collaboration's resolution
# (800 MiB per thread at nside 512) --, so the batch stays fixed: the float32 weights' saved bandwidth pays for
# the reloads (10.4M samples at nside 256: 0.196 s a call in 4M batches with float32 weights against 0.206 s in
# one batch with float64 ones, medians of 9 alternating calls on a loaded 2-core machine).
BATCH_SAMPLES = 1 << 22
# A small local map (both maps, 48 bytes per pixel, at most 6 MiB) stays in L3 whatever the batch, so
# there the batch is short instead (one interval, or several up to 2 MiB of buffer): gather, FFTs and
# scatter then find the TOD in L2/L3 rather than in memory. On the satellite example (49,152 local
# pixels, 72,000-sample intervals; AMD Zen 5, 1 MiB L2, 32 MiB L3) the operator took 0.043-0.049 s in
# batches of 1-4 intervals against 0.051-0.052 s in one batch (medians of 7 alternating calls, two runs).
SMALL_MAP_PIXELS = 1 << 17
SMALL_MAP_BATCH_SAMPLES = 1 << 18


def batch_samples_for(n_local: int) -> int:
    """Samples per operator batch for a local map of ``n_local`` pixels (see BATCH_SAMPLES)."""
    if n_local <= SMALL_MAP_PIXELS:
        return SMALL_MAP_BATCH_SAMPLES
    return BATCH_SAMPLES


@njit(nogil=True, cache=True)
def _scatter(tod, local_index, weights, out):
    scatter_samples(tod, local_index, weights, out)


# One batch buffer per thread slot, kept between calls: a fresh 32 MiB array every PCG iteration would
# be fresh pages, and faulting them in cost as much as the gather itself (measured at 12M samples).
_buffers: dict[int, np.ndarray] = {}


def _buffer(slot: int, samples: int) -> np.ndarray:
    if slot not in _buffers or len(_buffers[slot]) < samples:
        _buffers[slot] = np.empty(samples)
    return _buffers[slot][:samples]


# Likewise the private maps of threads 2..T ([T - 1, n_local, 3], 24 bytes per local pixel each), each
# zeroed by its own thread at the start of a call.
_partial_maps = np.empty((0, 0, 3))


def _private_maps(count: int, n_local: int) -> np.ndarray:
    global _partial_maps
    if _partial_maps.shape != (count, n_local, 3):
        _partial_maps = np.empty((count, n_local, 3))
    return _partial_maps


def batches(starts: list[int], lengths: list[int], group: range, batch_samples: int) -> list[tuple[int, int, range]]:
    """Runs of back-to-back intervals of ``group`` of at most ``batch_samples`` samples (or one interval).

    Returns ``(first sample, samples, intervals)`` per batch.
    """
    out: list[tuple[int, int, range]] = []
    first_interval = None
    for i in group:
        if first_interval is not None:
            begin = starts[first_interval]
            contiguous = starts[i] == starts[i - 1] + lengths[i - 1]
            if contiguous and starts[i] + lengths[i] - begin <= batch_samples:
                continue
            out.append((begin, starts[i - 1] + lengths[i - 1] - begin, range(first_interval, i)))
        first_interval = i
    if first_interval is not None:
        last = group[-1]
        out.append((starts[first_interval], starts[last] + lengths[last] - starts[first_interval], range(first_interval, last + 1)))
    return out


def apply_inverse_noise_operator(
    local_map: np.ndarray,
    local_index: np.ndarray,
    weights: np.ndarray,
    interval_starts: np.ndarray,
    interval_lengths: np.ndarray,
    filter_index: np.ndarray,
    circulant_filters: list[CirculantFilter],
    threads: int = 1,
    out: np.ndarray | None = None,
    batch_samples: int | None = None,
    accumulate: bool = False,
) -> np.ndarray:
    """``P^T N^-1 P x`` for 1/f noise: x = local_map [n_local, 3] -> [n_local, 3] (``out`` overwritten, or
    added to with ``accumulate``).

    local_index [n_samp] int32/int64, weights [n_samp, 3] float32/float64, intervals
    as in :func:`mapmaker.kernels.noise_fast.apply_inverse_noise` (samples
    outside every interval are left out). Back-to-back intervals are taken
    in batches of up to ``batch_samples`` samples (default
    :func:`batch_samples_for` the map; always at least one interval) through
    a per-thread buffer of at most that size.
    """
    n_local = local_map.shape[0]
    if batch_samples is None:
        batch_samples = batch_samples_for(n_local)
    local_map = iqu_rows(np.asarray(local_map, dtype=np.float64), "local_map")
    weights = iqu_rows(weights, "weights")
    if out is None:
        out = np.empty((n_local, 3), dtype=np.float64)
    iqu_target(out)
    starts = interval_starts.tolist()
    lengths = interval_lengths.tolist()
    chosen = filter_index.tolist()
    groups = threading.balanced_groups(lengths, threads)
    partial = _private_maps(max(len(groups) - 1, 0), n_local)
    if not groups and not accumulate:
        out[:] = 0.0

    def run(g: int) -> None:
        target = out if g == 0 else partial[g - 1]
        if g > 0 or not accumulate:
            target[:] = 0.0
        work = batches(starts, lengths, groups[g], batch_samples)
        buffer = _buffer(g, max(samples for _, samples, _ in work))
        for begin, samples, intervals in work:
            tod = buffer[:samples]
            gather_samples(local_map, local_index[begin : begin + samples], weights[begin : begin + samples], tod)
            for i in intervals:
                circulant_filters[chosen[i]].apply(tod[starts[i] - begin : starts[i] - begin + lengths[i]])
            _scatter(tod, local_index[begin : begin + samples], weights[begin : begin + samples], target)

    if len(groups) <= 1:
        for g in range(len(groups)):
            run(g)
    else:
        list(threading.pool(len(groups)).map(run, range(len(groups))))
        add_partial_maps(partial, out)
    return out


@njit(parallel=True, nogil=True, cache=True)
def _white_operator(local_map, local_index, weights, group_bounds, starts, lengths, inverse_variance, out):
    blocks = len(group_bounds) - 1
    partial = np.zeros((max(blocks - 1, 0), out.shape[0], 3))
    for g in prange(blocks):
        target = out if g == 0 else partial[g - 1]
        for i in range(group_bounds[g], group_bounds[g + 1]):
            scale = inverse_variance[i]
            stop = starts[i] + lengths[i]
            ahead = max(stop - PREFETCH_DISTANCE, starts[i])
            for t in range(starts[i], ahead):
                row = local_index[t + PREFETCH_DISTANCE]
                prefetch_row_for_read(local_map, row)
                prefetch_row_for_write(target, row)
                p = local_index[t]
                add_to_row(target, p, weights, t, dot_row(local_map, p, weights, t) * scale)
            for t in range(ahead, stop):
                p = local_index[t]
                add_to_row(target, p, weights, t, dot_row(local_map, p, weights, t) * scale)
    if blocks > 1:
        add_partial_maps(partial, out)


def apply_white_operator(
    local_map: np.ndarray,
    local_index: np.ndarray,
    weights: np.ndarray,
    interval_starts: np.ndarray,
    interval_lengths: np.ndarray,
    inverse_variance: np.ndarray,
    out: np.ndarray | None = None,
    accumulate: bool = False,
) -> np.ndarray:
    """``P^T N^-1 P x`` for white noise: ``N^-1 = 1 / sigma^2`` of each interval [n_int] (K^-2); ``out``
    overwritten, or added to with ``accumulate``."""
    if out is None:
        out = np.zeros((local_map.shape[0], 3), dtype=np.float64)
    elif not accumulate:
        out[:] = 0.0
    iqu_target(out)
    groups = threading.balanced_groups(interval_lengths.tolist(), numba.get_num_threads())
    bounds = np.array([g.start for g in groups] + [groups[-1].stop if groups else 0], dtype=np.int64)
    _white_operator(
        iqu_rows(np.asarray(local_map, dtype=np.float64), "local_map"), local_index, iqu_rows(weights, "weights"), bounds, interval_starts, interval_lengths,
        inverse_variance, out,
    )
    return out

