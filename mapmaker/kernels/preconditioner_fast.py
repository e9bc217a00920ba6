"""Compiled twins of :mod:`.preconditioner`: 3x3 block accumulation, rcond and block apply (numba).

The block inverse goes through each block's Cholesky factor, in registers (:func:`invert`):
the blocks it inverts are symmetric positive definite (their rcond passed the cut), for which
Cholesky is backward stable like LAPACK's pivoted LU, so the two inverses differ by about
``rcond^-1`` times the rounding unit (1e-14 at the default ``rcond_min`` of 1e-2). LAPACK's
batched ``inv`` pays a call and an unpacked [n, 3, 3] copy per block: 0.9 s a rank at nside 512
on 2 ranks, against some 20 ms here. The rcond needs eigenvalues alone, and eigenvalues of a
symmetric matrix are well conditioned (Weyl: each moves by at most the norm of
the error), so :func:`rcond` finds them by cyclic Jacobi rotations on the packed
block, in registers, where LAPACK's ``eigvalsh`` pays a call per 3x3 matrix and
an unpacked [n, 3, 3] copy (the set-up at nside 2048: docs/explanation/scale.md).
Accumulation uses private per-thread block arrays, as
P^T does (see :mod:`.projection_fast`).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from mapmaker.kernels import preconditioner as reference
from mapmaker.kernels.prefetch import PREFETCH_DISTANCE, prefetch_row_for_write
from mapmaker.kernels.projection_fast import SERIAL_SAMPLES_PER_THREAD


@njit(inline="always", cache=True)
def _blocks_range(local_index, weights, sample_weight, use_weight, first, stop, out):
    for t in range(first, stop):
        if t + PREFETCH_DISTANCE < stop:
            prefetch_row_for_write(out, local_index[t + PREFETCH_DISTANCE])
        p = local_index[t]
        # float64 products whatever the weights' type (the pointing cache holds float32 weights)
        w0, w1, w2 = np.float64(weights[t, 0]), np.float64(weights[t, 1]), np.float64(weights[t, 2])
        if use_weight:
            s = sample_weight[t]
            out[p, 0] += w0 * w0 * s
            out[p, 1] += w0 * w1 * s
            out[p, 2] += w0 * w2 * s
            out[p, 3] += w1 * w1 * s
            out[p, 4] += w1 * w2 * s
            out[p, 5] += w2 * w2 * s
        else:
            out[p, 0] += w0 * w0
            out[p, 1] += w0 * w1
            out[p, 2] += w0 * w2
            out[p, 3] += w1 * w1
            out[p, 4] += w1 * w2
            out[p, 5] += w2 * w2


@njit(parallel=True, nogil=True, cache=True)
def _accumulate_blocks(local_index, weights, sample_weight, use_weight, out, blocks):
    n = len(local_index)
    if blocks == 1:
        _blocks_range(local_index, weights, sample_weight, use_weight, 0, n, out)
        return
    partial = np.zeros((blocks, out.shape[0], 6))
    for b in prange(blocks):
        _blocks_range(local_index, weights, sample_weight, use_weight, b * n // blocks, (b + 1) * n // blocks, partial[b])
    for p in prange(out.shape[0]):
        for k in range(6):
            total = 0.0
            for b in range(blocks):
                total += partial[b, p, k]
            out[p, k] += total


def accumulate_blocks(
    local_index: np.ndarray, weights: np.ndarray, n_local: int, sample_weight: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``sum_t sample_weight[t] w_t w_t^T`` per pixel, packed ``(II, IQ, IU, QQ, QU, UU)`` [n_local, 6].

    local_index [n_samp] int32/int64, weights [n_samp, 3] float32/float64 (products in float64),
    sample_weight [n_samp] float64 (K^-2) or None for unit weight; ``out`` [n_local, 6] float64
    (C-contiguous): the sums are added into it, else into zeros.
    """
    if out is None:
        out = np.zeros((n_local, 6), dtype=np.float64)
    elif out.shape != (n_local, 6) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous [{n_local}, 6] float64 array, got {out.dtype} {out.shape}")
    blocks = max(1, min(numba.get_num_threads(), len(local_index) // SERIAL_SAMPLES_PER_THREAD))
    use_weight = sample_weight is not None
    weight_array = sample_weight if use_weight else np.zeros(1)
    _accumulate_blocks(local_index, weights, weight_array, use_weight, out, blocks)
    return out


# Jacobi sweeps before giving up; a 3x3 block converges quadratically, in 3 to 5 sweeps.
JACOBI_SWEEPS = 30


@njit(inline="always", cache=True)
def _rotation(app, aqq, apq):
    """(t, c, s) of the Jacobi rotation that zeroes ``apq`` (Numerical Recipes' stable form): t = tan(angle)."""
    theta = 0.5 * (aqq - app) / apq
    if abs(theta) > 1e150:  # theta^2 would overflow; t -> 1 / (2 theta)
        t = 0.5 / theta
    else:
        t = 1.0 / (abs(theta) + np.sqrt(theta * theta + 1.0))
        if theta < 0.0:
            t = -t
    c = 1.0 / np.sqrt(t * t + 1.0)
    return t, c, t * c


@njit(inline="always", cache=True)
def _extreme_eigenvalues(a00, a01, a02, a11, a12, a22):
    """Smallest and largest eigenvalue of the symmetric [[a00, a01, a02], [., a11, a12], [., ., a22]]."""
    for _ in range(JACOBI_SWEEPS):
        if a01 == 0.0 and a02 == 0.0 and a12 == 0.0:
            break
        scale = a00 * a00 + a11 * a11 + a22 * a22
        if a01 * a01 + a02 * a02 + a12 * a12 <= 1e-36 * scale:  # off-diagonal below 1e-18 of the diagonal
            break
        if a01 != 0.0:  # rotate (0, 1); the third index is 2
            t, c, s = _rotation(a00, a11, a01)
            a00, a11 = a00 - t * a01, a11 + t * a01
            a01 = 0.0
            a02, a12 = c * a02 - s * a12, s * a02 + c * a12
        if a02 != 0.0:  # rotate (0, 2); the third index is 1
            t, c, s = _rotation(a00, a22, a02)
            a00, a22 = a00 - t * a02, a22 + t * a02
            a02 = 0.0
            a01, a12 = c * a01 - s * a12, s * a01 + c * a12
        if a12 != 0.0:  # rotate (1, 2); the third index is 0
            t, c, s = _rotation(a11, a22, a12)
            a11, a22 = a11 - t * a12, a22 + t * a12
            a12 = 0.0
            a01, a02 = c * a01 - s * a02, s * a01 + c * a02
    return min(a00, a11, a22), max(a00, a11, a22)


@njit(parallel=True, nogil=True, cache=True)
def _rcond(packed, out):
    for p in prange(packed.shape[0]):
        smallest, largest = _extreme_eigenvalues(packed[p, 0], packed[p, 1], packed[p, 2], packed[p, 3],
                                                 packed[p, 4], packed[p, 5])
        out[p] = max(smallest, 0.0) / largest if largest > 0.0 else 0.0


def rcond(packed: np.ndarray) -> np.ndarray:
    """Reciprocal 2-norm condition number ``lambda_min / lambda_max`` of each packed block [n, 6], [n] in [0, 1].

    Empty blocks (no hits) give 0, as :func:`.preconditioner.rcond` does; the two agree within 1e-14
    (tests/unit/test_mapmaker_fast_kernels.py).
    """
    out = np.empty(len(packed))
    _rcond(np.asarray(packed, dtype=np.float64), out)  # a strided view as it is: the set-up's half of [n, 12]
    return out


@njit(parallel=True, nogil=True, cache=True)
def _invert(packed, keep, out, failed):
    for p in prange(packed.shape[0]):
        for i in range(3):
            for j in range(3):
                out[p, i, j] = 0.0
        if not keep[p]:
            continue
        a00, a01, a02, a11, a12, a22 = packed[p, 0], packed[p, 1], packed[p, 2], packed[p, 3], packed[p, 4], packed[p, 5]
        # A = L L^T, then A^-1 = M^T M with M = L^-1 (lower triangular)
        if not a00 > 0.0:  # also NaN
            failed[p] = True
            continue
        l00 = np.sqrt(a00)
        l10, l20 = a01 / l00, a02 / l00
        d1 = a11 - l10 * l10
        if not d1 > 0.0:
            failed[p] = True
            continue
        l11 = np.sqrt(d1)
        l21 = (a12 - l20 * l10) / l11
        d2 = a22 - l20 * l20 - l21 * l21
        if not d2 > 0.0:
            failed[p] = True
            continue
        m00, m11, m22 = 1.0 / l00, 1.0 / l11, 1.0 / np.sqrt(d2)
        m10 = -l10 * m00 * m11
        m21 = -l21 * m11 * m22
        m20 = -(l20 * m00 + l21 * m10) * m22
        out[p, 0, 0] = m00 * m00 + m10 * m10 + m20 * m20
        out[p, 0, 1] = out[p, 1, 0] = m10 * m11 + m20 * m21
        out[p, 0, 2] = out[p, 2, 0] = m20 * m22
        out[p, 1, 1] = m11 * m11 + m21 * m21
        out[p, 1, 2] = out[p, 2, 1] = m21 * m22
        out[p, 2, 2] = m22 * m22


def invert(packed: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Inverse of each packed block [n, 6] where ``keep`` [n] bool, zero elsewhere: [n, 3, 3].

    Through the block's Cholesky factor (module doc); a kept block that is not positive definite in
    floating point (rcond near the rounding unit) takes LAPACK's :func:`.preconditioner.invert`.
    """
    out = np.empty((len(packed), 3, 3))
    failed = np.zeros(len(packed), dtype=np.bool_)
    _invert(np.asarray(packed, dtype=np.float64), np.asarray(keep, dtype=np.bool_), out, failed)
    if failed.any():
        out[failed] = reference.invert(packed[failed], np.ones(int(failed.sum()), dtype=bool))
    return out


@njit(parallel=True, nogil=True, cache=True)
def _apply(matrices, vectors, out):
    for p in prange(matrices.shape[0]):
        x0, x1, x2 = vectors[p, 0], vectors[p, 1], vectors[p, 2]
        for i in range(3):
            out[p, i] = matrices[p, i, 0] * x0 + matrices[p, i, 1] * x1 + matrices[p, i, 2] * x2


def apply(matrices: np.ndarray, vectors: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``out[p] = matrices[p] @ vectors[p]``: matrices [n, 3, 3], vectors [n, 3] -> [n, 3]."""
    if out is None:
        out = np.empty_like(vectors)
    _apply(matrices, np.ascontiguousarray(vectors), out)
    return out

