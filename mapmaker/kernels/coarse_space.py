"""``Z^T v`` and ``Z y`` of the two-level preconditioner's aggregation coarse space (the numpy reference).

The coarse space of :mod:`mapmaker.solve.coarse` has one column per (coarse pixel, Stokes parameter): the
flat map row ``j`` (pixel ``j // 3``, Stokes ``j % 3``) of a [n_local, 3] map is 1 in column ``column[j]``,
and in none when ``column[j] == K`` (a cut pixel, or Q and U of an I-only space). Every A-DEF2 iteration
restricts the residual to the coarse space over this rank's held rows, gathers the smoothed residual at
those rows in single precision for ``(A Z)^T`` (held as float32), and prolongs the coarse solution onto the
map. :mod:`.coarse_space_fast` makes the first two one pass over the held rows.
"""
from __future__ import annotations

import numpy as np


def restrict(values: np.ndarray, held_rows: np.ndarray, held_columns: np.ndarray, n_columns: int) -> np.ndarray:
    """This rank's share of ``Z^T v``: [K] float64, each held row's value summed into its column in row order.

    values [n_local, 3] float64; held_rows [m] int32/int64, the flat rows this rank holds, increasing;
    held_columns [m] of the same type, the column of each (``n_columns``: none).
    """
    return np.bincount(held_columns, weights=values.reshape(-1)[held_rows], minlength=n_columns + 1)[:n_columns]


def restrict_and_gather(
    residual: np.ndarray, smoothed: np.ndarray, held_rows: np.ndarray, held_columns: np.ndarray, n_columns: int,
    gathered: np.ndarray,
) -> np.ndarray:
    """:func:`restrict` of ``residual``, and ``gathered[i] = smoothed.flat[held_rows[i]]`` (gathered [m] float32)."""
    gathered[:] = smoothed.reshape(-1)[held_rows]
    return restrict(residual, held_rows, held_columns, n_columns)


def prolong_add(y: np.ndarray, column: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out += Z y``: y [K] float64, column [3 n_local] int32/int64, out [n_local, 3] float64 (C-contiguous)."""
    if not out.flags.c_contiguous:  # reshape would add into a copy
        raise ValueError("out must be C-contiguous (the sums go into it in place)")
    flat = out.reshape(-1)
    flat += np.append(y, 0.0)[column]
    return out
