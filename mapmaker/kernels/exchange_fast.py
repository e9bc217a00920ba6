"""Compiled twins of :mod:`.exchange` (numba): the same rows, and the same sums in the same order, so the same bits.

On 1.0 M rows of 3 doubles in one process, ``np.take`` took 8 ns a row and ``np.add.at`` 40, these loops
3.5 and 4.5. One thread: the added rows may repeat (a pixel shared with several neighbours).
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _gather_rows(values, rows, out):
    width = values.shape[1]
    for i in range(len(rows)):
        row = rows[i]
        for j in range(width):
            out[i, j] = values[row, j]


@njit(nogil=True, cache=True)
def _add_rows(values, rows, received):
    width = values.shape[1]
    for i in range(len(rows)):
        row = rows[i]
        for j in range(width):
            values[row, j] += received[i, j]


def gather_rows(values: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """See :func:`.exchange.gather_rows`."""
    _gather_rows(values, rows, out)
    return out


def add_rows(values: np.ndarray, rows: np.ndarray, received: np.ndarray) -> np.ndarray:
    """See :func:`.exchange.add_rows`."""
    _add_rows(values, rows, received)
    return values
