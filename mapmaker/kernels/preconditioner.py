"""3x3 IQU blocks per pixel: hit matrices, their condition, inverse and product.

A symmetric 3x3 block is packed as its upper triangle, 6 numbers in the order
``(II, IQ, IU, QQ, QU, UU)``, so that summing blocks over ranks sends 6
values per pixel, not 9.
"""
from __future__ import annotations

import numpy as np

PACKED = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))


def accumulate_blocks(
    local_index: np.ndarray, weights: np.ndarray, n_local: int, sample_weight: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``sum_t sample_weight[t] w_t w_t^T`` per pixel, packed.

    local_index [n_samp] int64, weights [n_samp, 3] float32/float64 (products in float64),
    sample_weight [n_samp] float64 or None (unit weight: the *geometric*
    hit matrix, whose II entry is the hit count; the diagonal of N^-1 in
    K^-2: the white-noise approximation of P^T N^-1 P).
    Returns packed blocks [n_local, 6] float64: ``out``, the sums added into it, when given.
    """
    blocks = np.zeros((n_local, 6), dtype=np.float64) if out is None else out
    for column, (i, j) in enumerate(PACKED):
        product = weights[:, i].astype(np.float64) * weights[:, j]  # float64 whatever the weights' type
        if sample_weight is not None:
            product *= sample_weight
        blocks[:, column] += np.bincount(local_index, weights=product, minlength=n_local)
    return blocks


def unpack(packed: np.ndarray) -> np.ndarray:
    """Packed blocks [n, 6] -> symmetric matrices [n, 3, 3]."""
    matrices = np.empty((len(packed), 3, 3), dtype=np.float64)
    for column, (i, j) in enumerate(PACKED):
        matrices[:, i, j] = packed[:, column]
        matrices[:, j, i] = packed[:, column]
    return matrices


def rcond(packed: np.ndarray) -> np.ndarray:
    """Reciprocal 2-norm condition number ``lambda_min / lambda_max`` of each block, [n] in [0, 1].

    Empty blocks (no hits) give 0.
    """
    if len(packed) == 0:
        return np.zeros(0)
    eigenvalues = np.linalg.eigvalsh(unpack(packed))
    largest = eigenvalues[:, -1]
    safe = np.where(largest > 0, largest, 1.0)
    return np.where(largest > 0, np.clip(eigenvalues[:, 0], 0.0, None) / safe, 0.0)


def invert(packed: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Inverse of each block where ``keep`` [n] bool, zero elsewhere: [n, 3, 3]."""
    inverse = np.zeros((len(packed), 3, 3), dtype=np.float64)
    if np.any(keep):
        inverse[keep] = np.linalg.inv(unpack(packed[keep]))
    return inverse


def apply(matrices: np.ndarray, vectors: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``out[p] = matrices[p] @ vectors[p]``: matrices [n, 3, 3], vectors [n, 3] -> [n, 3]."""
    return np.einsum("pij,pj->pi", matrices, vectors, out=out)


def solve(packed: np.ndarray, vectors: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Solve ``block[p] x[p] = vectors[p]`` where ``keep``; zero elsewhere. [n, 6], [n, 3] -> [n, 3]."""
    solution = np.zeros_like(vectors)
    if np.any(keep):
        solution[keep] = np.linalg.solve(unpack(packed[keep]), vectors[keep][..., None])[..., 0]
    return solution
