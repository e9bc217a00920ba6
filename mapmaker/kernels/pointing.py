"""Detector pointing: line of sight, polarisation angle, HEALPix pixel, IQU weights.

A detector sits in the boresight frame (line of sight +z) at an offset and
with a polarisation-sensitive direction; :func:`detector_quaternion` turns
those into one fixed rotation ``D`` so that the detector's line of sight in
the map frame is ``R(t) D z`` and its polarisation direction ``R(t) D x``.

The polarisation angle ``psi`` is measured from the local meridian, the
``e_theta`` direction (towards increasing colatitude, i.e. south), towards
``e_phi`` (east). This is HEALPix's COSMO convention for Q and U, so a
synfast sky and the TOD model ``d = I + Q cos 2psi + U sin 2psi`` agree.
"""
from __future__ import annotations

import healpy as hp
import numpy as np

from mapmaker.kernels import quaternion as quat


def detector_quaternion(offset_x: float, offset_y: float, pol_angle: float) -> np.ndarray:
    """Fixed rotation of one detector in the boresight frame, ``[4]``.

    ``D = Ry(offset_x) Rx(-offset_y) Rz(pol_angle)``: the line of sight is
    ``(sin x cos y, sin y, cos x cos y)``, i.e. moved by ``offset_x`` along
    the focal-plane x axis and by ``offset_y`` along y; the polarisation
    direction is the focal-plane x axis turned by ``pol_angle`` towards y.
    All radians.
    """
    q = quat.mult(quat.about_axis("x", -offset_y), quat.about_axis("z", pol_angle))
    return quat.mult(quat.about_axis("y", offset_x), q)


def _direction_and_meridian_components(q_boresight: np.ndarray, q_detector: np.ndarray):
    """Line of sight ``v [n, 3]`` and ``(a, b) = rho (e . e_theta, e . e_phi)``, rho = sin(theta)."""
    q = quat.mult(q_boresight, q_detector)
    v = quat.z_axis(q)
    e = quat.x_axis(q)
    vx, vy, vz = v[:, 0], v[:, 1], v[:, 2]
    ex, ey, ez = e[:, 0], e[:, 1], e[:, 2]
    # rho e_theta = (vz vx, vz vy, -rho^2) and rho e_phi = (-vy, vx, 0); no trig, no division.
    a = vz * (ex * vx + ey * vy) - ez * (vx * vx + vy * vy)
    b = ey * vx - ex * vy
    return v, a, b


def detector_angles(q_boresight: np.ndarray, q_detector: np.ndarray):
    """Colatitude theta, longitude phi and polarisation angle psi (radians), each ``[n]``.

    q_boresight [n, 4], q_detector [4]. The reference the fast paths are tested against.
    """
    v, a, b = _direction_and_meridian_components(q_boresight, q_detector)
    theta, phi = hp.vec2ang(v)
    return theta, phi, np.arctan2(b, a)


def detector_pointing(q_boresight: np.ndarray, q_detector: np.ndarray, nside: int):
    """Pixels and IQU weights of one detector over a stretch of samples.

    q_boresight [n_samp, 4] float64 (boresight frame -> map frame),
    q_detector [4] float64 (from :func:`detector_quaternion`), nside int.
    Returns ``pixels [n_samp] int64`` (HEALPix RING) and
    ``weights [n_samp, 3] float64`` = ``(1, cos 2psi, sin 2psi)``.
    """
    v, a, b = _direction_and_meridian_components(q_boresight, q_detector)
    pixels = hp.vec2pix(nside, v[:, 0], v[:, 1], v[:, 2]).astype(np.int64, copy=False)
    # a^2 + b^2 = rho^2 = sin^2(theta); only exactly at a pole is the angle undefined.
    norm = a * a + b * b
    norm[norm == 0.0] = 1.0
    weights = np.empty((len(pixels), 3), dtype=np.float64)
    weights[:, 0] = 1.0
    weights[:, 1] = (a * a - b * b) / norm
    weights[:, 2] = 2.0 * a * b / norm
    return pixels, weights
