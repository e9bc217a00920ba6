"""``P^T N^-1 P``, the PCG operator, as P, N^-1 and P^T one after the other: the reference of
:mod:`mapmaker.kernels.operator_fast`.

It writes the TOD ``P x`` of all the rank's samples into a temporary (8 bytes
per sample), transforms it in place and reads it back in P^T; the fused
kernel does the same in batches of intervals without a TOD-sized array.
Same arguments, same results to round-off.
"""
from __future__ import annotations

import numpy as np

from mapmaker.kernels import noise, projection


def apply_inverse_noise_operator(
    local_map: np.ndarray,
    local_index: np.ndarray,
    weights: np.ndarray,
    interval_starts: np.ndarray,
    interval_lengths: np.ndarray,
    filter_index: np.ndarray,
    filters: list[np.ndarray],
    threads: int = 1,
    out: np.ndarray | None = None,
    accumulate: bool = False,
) -> np.ndarray:
    """``P^T N^-1 P x`` for 1/f noise: x = local_map [n_local, 3] (K) -> [n_local, 3] (K^-1; ``out`` overwritten,
    or added to with ``accumulate``).

    local_index [n_samp] int32/int64, weights [n_samp, 3] float32/float64; intervals
    and ``filters`` (from :func:`mapmaker.kernels.noise.inverse_noise_filters`)
    as in :func:`mapmaker.kernels.noise.apply_inverse_noise`; ``threads`` FFT workers.
    """
    tod = projection.project_map_to_tod(local_map, local_index, weights)
    noise.apply_inverse_noise(tod, interval_starts, interval_lengths, filter_index, filters, threads=threads)
    return _accumulate(tod, local_index, weights, local_map.shape[0], out, accumulate)


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
    tod = projection.project_map_to_tod(local_map, local_index, weights)
    noise.apply_inverse_white(tod, interval_starts, interval_lengths, inverse_variance)
    return _accumulate(tod, local_index, weights, local_map.shape[0], out, accumulate)


def _accumulate(tod: np.ndarray, local_index: np.ndarray, weights: np.ndarray, n_local: int, out: np.ndarray | None,
                accumulate: bool = False):
    if out is not None and not accumulate:
        out[:] = 0.0
    return projection.accumulate_tod_to_map(tod, local_index, weights, n_local, out=out)
