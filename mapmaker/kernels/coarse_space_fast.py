"""Compiled twins of :mod:`.coarse_space` (numba): the same sums in the same order, so the same bits.

The numpy reference makes three map-sized passes an A-DEF2 iteration besides ``(A Z)^T u``, each with a
temporary: the held rows' residual, a bincount, the gather and its float32 copy, then the prolongation's
gather. Here the restriction and the gather share one pass over the held rows and the prolongation is a
second, with no temporary. At nside 512 on 2 ranks what an A-DEF2 iteration costs beyond a block-diagonal
one fell from 72 to 38 ms with 12 coarse columns and from 141 to 99 ms with 48, the start included
(docs/results/solvers-nside512.md, docs/explanation/numerics.md). One thread: the restriction sums into K
bins in row order, and the passes are small beside the iteration's P and P^T.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _restrict(values, held_rows, held_columns, sums):
    for i in range(len(held_rows)):
        sums[held_columns[i]] += values[held_rows[i]]


@njit(nogil=True, cache=True)
def _restrict_and_gather(residual, smoothed, held_rows, held_columns, sums, gathered):
    for i in range(len(held_rows)):
        row = held_rows[i]
        sums[held_columns[i]] += residual[row]
        gathered[i] = smoothed[row]


@njit(nogil=True, cache=True)
def _prolong_add(padded_y, column, out):
    for j in range(len(column)):
        out[j] += padded_y[column[j]]  # padded_y[K] = 0: the rows in no column gain 0, as the reference's do


def restrict(values: np.ndarray, held_rows: np.ndarray, held_columns: np.ndarray, n_columns: int) -> np.ndarray:
    """See :func:`.coarse_space.restrict`."""
    sums = np.zeros(n_columns + 1)
    _restrict(values.reshape(-1), held_rows, held_columns, sums)
    return sums[:n_columns]


def restrict_and_gather(
    residual: np.ndarray, smoothed: np.ndarray, held_rows: np.ndarray, held_columns: np.ndarray, n_columns: int,
    gathered: np.ndarray,
) -> np.ndarray:
    """See :func:`.coarse_space.restrict_and_gather`."""
    sums = np.zeros(n_columns + 1)
    _restrict_and_gather(residual.reshape(-1), smoothed.reshape(-1), held_rows, held_columns, sums, gathered)
    return sums[:n_columns]


def prolong_add(y: np.ndarray, column: np.ndarray, out: np.ndarray) -> np.ndarray:
    """See :func:`.coarse_space.prolong_add`."""
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous (the sums go into it in place)")
    _prolong_add(np.append(y, 0.0), column, out.reshape(-1))
    return out
