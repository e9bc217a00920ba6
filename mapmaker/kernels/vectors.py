"""PCG's map-sized vector work: dot products over owned rows, the step and the new direction (the numpy reference).

Every PCG iteration makes passes over the local map besides the operator and the preconditioner: the
inner products (each pixel counted once: weighted by the rank's ownership of the row), the update of the
map and the residual, and the new search direction. At nside 512 on 2 ranks that is 1.9 M rows a rank, and
numpy's ``einsum`` of three operands and its temporaries made these passes 0.06-0.07 s of each iteration
(:mod:`.vectors_fast` makes them compiled loops, fused where they read the same arrays).

All arrays are C-contiguous [n, k] float64 pixel rows (k = 3 for I, Q, U; 1-D arrays count as k = 1);
``weight`` [n] float64 or None (every row counts once).
"""
from __future__ import annotations

import numpy as np


def _rows(array: np.ndarray) -> np.ndarray:
    return array[:, None] if array.ndim == 1 else array


def dot(a: np.ndarray, b: np.ndarray, weight: np.ndarray | None = None) -> float:
    """``sum_i weight[i] sum_j a[i, j] b[i, j]`` (this rank's share of a global inner product)."""
    # einsum, not np.dot/vdot: BLAS would wake its thread pool, whose spinning workers
    # then compete with the ranks for the cores (measured 15 ms per call on 2 loaded cores).
    a, b = _rows(a), _rows(b)
    if weight is None:
        return float(np.einsum("ij,ij->", a, b))
    return float(np.einsum("i,ij,ij->", weight, a, b))


def dot_and_norm(r: np.ndarray, z: np.ndarray, weight: np.ndarray | None = None) -> tuple[float, float]:
    """``(dot(r, z, weight), dot(r, r, weight))``: PCG's (r, M^-1 r) and its residual norm squared."""
    return dot(r, z, weight), dot(r, r, weight)


def step(x: np.ndarray, r: np.ndarray, p: np.ndarray, q: np.ndarray, alpha: float, scratch: np.ndarray) -> None:
    """``x += alpha p`` and ``r -= alpha q``, in place (``scratch`` shaped like x: no temporary per call).

    Each product ``alpha p`` is rounded, then added: the compiled twin does the same, so the same bits.
    """
    x += np.multiply(alpha, p, out=scratch)
    r -= np.multiply(alpha, q, out=scratch)


def conjugate(p: np.ndarray, z: np.ndarray, beta: float) -> None:
    """``p = z + beta p``, in place (PCG's next search direction)."""
    p *= beta
    p += z
