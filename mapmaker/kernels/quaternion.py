"""Rotation quaternions, scalar first: ``q = [w, x, y, z]`` with shape ``[..., 4]``.

``q`` rotates a vector ``v`` as ``q v q*``. The product ``mult(p, q)`` is the
rotation "first q, then p", the same order as the matrix product ``P @ Q``.
All angles are radians.
"""
from __future__ import annotations

import numpy as np

_AXES = {"x": 1, "y": 2, "z": 3}


def about_axis(axis: str, angle: np.ndarray | float) -> np.ndarray:
    """Rotation by ``angle`` (radians, scalar or ``[n]``) about the frame axis ``"x"``, ``"y"`` or ``"z"``.

    Returns ``[4]`` for a scalar angle, ``[n, 4]`` float64 otherwise.
    """
    half = 0.5 * np.asarray(angle, dtype=np.float64)
    q = np.zeros(half.shape + (4,), dtype=np.float64)
    q[..., 0] = np.cos(half)
    q[..., _AXES[axis]] = np.sin(half)
    return q


def mult(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Hamilton product ``p q`` (apply q, then p); broadcasts ``[4]`` against ``[n, 4]``."""
    pw, px, py, pz = (p[..., i] for i in range(4))
    qw, qx, qy, qz = (q[..., i] for i in range(4))
    return np.stack(
        [
            pw * qw - px * qx - py * qy - pz * qz,
            pw * qx + px * qw + py * qz - pz * qy,
            pw * qy - px * qz + py * qw + pz * qx,
            pw * qz + px * qy - py * qx + pz * qw,
        ],
        axis=-1,
    )


def to_matrix(q: np.ndarray) -> np.ndarray:
    """Rotation matrices ``[..., 3, 3]`` of unit quaternions ``[..., 4]``."""
    w, x, y, z = (q[..., i] for i in range(4))
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], axis=-1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], axis=-1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], axis=-1),
        ],
        axis=-2,
    )


def rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate vectors ``v [..., 3]`` by unit quaternions ``q [..., 4]`` (broadcasting)."""
    return np.einsum("...ij,...j->...i", to_matrix(q), v)


def z_axis(q: np.ndarray) -> np.ndarray:
    """``rotate(q, [0, 0, 1])``: the third matrix column, ``[n, 3]``, without building the matrix."""
    w, x, y, z = (q[..., i] for i in range(4))
    return np.stack([2 * (x * z + w * y), 2 * (y * z - w * x), 1 - 2 * (x * x + y * y)], axis=-1)


def x_axis(q: np.ndarray) -> np.ndarray:
    """``rotate(q, [1, 0, 0])``: the first matrix column, ``[n, 3]``."""
    w, x, y, z = (q[..., i] for i in range(4))
    return np.stack([1 - 2 * (y * y + z * z), 2 * (x * y + w * z), 2 * (x * z - w * y)], axis=-1)
