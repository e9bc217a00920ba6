"""The shared rows of a pixel reduction: packed for the exchange, and the received sums added (the numpy reference).

The plan-driven reductions (:class:`mapmaker.parallel.reduction.AlltoallvReduction` and its variants) send
each neighbour the rows of the pixels they share and add what comes back into the same rows. Both are
map-sized passes of every PCG iteration when ranks share most of their pixels (a satellite's sky on every
rank): 1.0 M of 1.9 M rows a rank at nside 512 on 2 ranks. :mod:`.exchange_fast` makes them compiled loops.
"""
from __future__ import annotations

import numpy as np


def gather_rows(values: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[i] = values[rows[i]]``: values [n, k] float64, rows [m] int64, out [m, k] float64 (returned)."""
    return np.take(values, rows, axis=0, out=out)


def add_rows(values: np.ndarray, rows: np.ndarray, received: np.ndarray) -> np.ndarray:
    """``values[rows[i]] += received[i]`` for i = 0, 1, ... in that order (a row may repeat), in place; returns values.

    values [n, k] float64, rows [m] int64, received [m, k] float64.
    """
    np.add.at(values, rows, received)
    return values
