"""Compiled twins of :mod:`.quaternion`, :mod:`.boresight` and :mod:`.pointing` (numba).

Same conventions, shapes and units as the numpy kernels, which stay the
reference: the tests check that these give the same pixels exactly and the
same weights to 1e-10. Every floating-point expression is written in the
same order as its numpy twin and compiled without fast-math (no FMA
contraction, no reassociation), so for the same input vectors the results
agree to the last bit; only ``sin``/``cos`` of the scan angles may differ
by an ulp between numpy's SIMD routines and the C library.

``vec2pix_ring`` follows HEALPix C++ ``T_Healpix_Base::vec2pix`` /
``loc2pix`` (RING) operation for operation, so that it returns healpy's
pixel for every vector, including the poles, the cap/equator boundary
``|z| = 2/3``, the polar switch ``|z| > 0.99`` and ``phi = 0 / 2 pi``.

All loops are ``prange`` loops (numba threads, see :mod:`mapmaker.kernels.threads`)
and release the GIL.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_INV_HALFPI = 0.6366197723675813430755350534900574
_TWOTHIRD = 2.0 / 3.0


@njit(inline="always", cache=True)
def _fmodulo(v1: float, v2: float) -> float:
    # HEALPix ``fmodulo``: v1 mod v2 in [0, v2).
    if v1 >= 0.0:
        return v1 if v1 < v2 else np.fmod(v1, v2)
    tmp = np.fmod(v1, v2) + v2
    return 0.0 if tmp == v2 else tmp


@njit(inline="always", cache=True)
def vec2pix_ring(nside: int, x: float, y: float, z: float) -> int:
    """HEALPix RING pixel of the direction ``(x, y, z)`` (need not be normalised)."""
    xl = 1.0 / math.sqrt(x * x + y * y + z * z)
    phi = 0.0 if (x == 0.0 and y == 0.0) else math.atan2(y, x)
    nz = z * xl
    have_sth = abs(nz) > 0.99
    sth = math.sqrt(x * x + y * y) * xl if have_sth else 0.0
    za = abs(nz)
    tt = _fmodulo(phi * _INV_HALFPI, 4.0)
    fnside = float(nside)
    if za <= _TWOTHIRD:  # equatorial region
        nl4 = 4 * nside
        temp1 = fnside * (0.5 + tt)
        temp2 = fnside * nz * 0.75
        jp = int(temp1 - temp2)  # index of the ascending edge line
        jm = int(temp1 + temp2)  # index of the descending edge line
        ir = nside + 1 + jp - jm  # ring number counted from z = 2/3, in 1 .. 2 nside + 1
        kshift = 1 - (ir & 1)
        t1 = jp + jm - nside + kshift + 1 + nl4 + nl4
        ip = (t1 >> 1) % nl4
        ncap = 2 * nside * (nside - 1)
        return ncap + (ir - 1) * nl4 + ip
    # polar caps
    tp = tt - int(tt)
    if za < 0.99 or not have_sth:
        tmp = fnside * math.sqrt(3.0 * (1.0 - za))
    else:
        tmp = fnside * sth / math.sqrt((1.0 + za) / 3.0)
    jp = int(tp * tmp)
    jm = int((1.0 - tp) * tmp)
    ir = jp + jm + 1  # ring number counted from the closest pole
    ip = int(tt * ir)
    if nz > 0.0:
        return 2 * ir * (ir - 1) + ip
    npix = 12 * nside * nside
    return npix - 2 * ir * (ir + 1) + ip


@njit(parallel=True, nogil=True, cache=True)
def vec2pix(nside: int, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``healpy.vec2pix(nside, x, y, z)`` (RING): x, y, z [n] float64 -> pixels [n] int64."""
    n = len(x)
    pixels = np.empty(n, dtype=np.int64)
    for t in prange(n):
        pixels[t] = vec2pix_ring(nside, x[t], y[t], z[t])
    return pixels


@njit(inline="always", cache=True)
def _numpy_mod(a: float, b: float) -> float:
    # np.mod for floats (npy_divmod): fmod, moved to the sign of the divisor.
    mod = np.fmod(a, b)
    if mod != 0.0:
        if (b < 0.0) != (mod < 0.0):
            mod += b
    else:
        mod = math.copysign(0.0, b)
    return mod


@njit(inline="always", cache=True)
def _mult(pw, px, py, pz, qw, qx, qy, qz):
    # Hamilton product p q, the expression order of quaternion.mult.
    return (
        pw * qw - px * qx - py * qy - pz * qz,
        pw * qx + px * qw + py * qz - pz * qy,
        pw * qy - px * qz + py * qw + pz * qx,
        pw * qz + px * qy - py * qx + pz * qw,
    )


@njit(inline="always", cache=True)
def _about_z(angle):
    half = 0.5 * angle
    return math.cos(half), 0.0, 0.0, math.sin(half)


@njit(inline="always", cache=True)
def _about_y(angle):
    half = 0.5 * angle
    return math.cos(half), 0.0, math.sin(half), 0.0


@njit(parallel=True, nogil=True, cache=True)
def satellite(
    times_s, start_longitude, drift_rate, precession_rate, precession_angle, spin_rate, spin_angle
) -> np.ndarray:
    """:func:`mapmaker.kernels.boresight.satellite`: times_s [n] (s) -> quaternions [n, 4]."""
    n = len(times_s)
    out = np.empty((n, 4), dtype=np.float64)
    sw, sx, sy, sz = _about_y(spin_angle)
    aw, ax, ay, az = _about_y(precession_angle)
    hw, hx, hy, hz = _about_y(0.5 * np.pi)
    for i in prange(n):
        t = times_s[i]
        q = _about_z(spin_rate * t)
        q = _mult(q[0], q[1], q[2], q[3], sw, sx, sy, sz)
        q = _mult(aw, ax, ay, az, q[0], q[1], q[2], q[3])
        p = _about_z(precession_rate * t)
        q = _mult(p[0], p[1], p[2], p[3], q[0], q[1], q[2], q[3])
        q = _mult(hw, hx, hy, hz, q[0], q[1], q[2], q[3])
        p = _about_z(start_longitude + drift_rate * t)
        q = _mult(p[0], p[1], p[2], p[3], q[0], q[1], q[2], q[3])
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = q
    return out


@njit(parallel=True, nogil=True, cache=True)
def ground(
    times_s, site_latitude, elevation, azimuth_min, azimuth_max, azimuth_rate, start_lst, earth_rotation
) -> np.ndarray:
    """:func:`mapmaker.kernels.boresight.ground`: times_s [n] (s) -> quaternions [n, 4]."""
    n = len(times_s)
    out = np.empty((n, 4), dtype=np.float64)
    span = azimuth_max - azimuth_min
    ew, ex, ey, ez = _about_y(0.5 * np.pi - elevation)
    lw, lx, ly, lz = _about_y(site_latitude - 0.5 * np.pi)
    sidereal = 2.0 * np.pi / 86_164.0905
    for i in prange(n):
        t = times_s[i]
        travel = _numpy_mod(azimuth_rate * t, 2.0 * span)  # triangle_azimuth
        azimuth = azimuth_min + (travel if travel < span else 2.0 * span - travel)
        lst = start_lst + sidereal * t if earth_rotation else start_lst
        a = _about_z(-azimuth)
        q = _mult(a[0], a[1], a[2], a[3], ew, ex, ey, ez)
        q = _mult(lw, lx, ly, lz, q[0], q[1], q[2], q[3])
        p = _about_z(lst + np.pi)
        q = _mult(p[0], p[1], p[2], p[3], q[0], q[1], q[2], q[3])
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = q
    return out


@njit(parallel=True, nogil=True, cache=True)
def detector_pointing(q_boresight: np.ndarray, q_detector: np.ndarray, nside: int):
    """:func:`mapmaker.kernels.pointing.detector_pointing` in one pass over the samples.

    q_boresight [n_samp, 4], q_detector [4] -> pixels [n_samp] int64 (RING),
    weights [n_samp, 3] = (1, cos 2psi, sin 2psi).
    """
    n = q_boresight.shape[0]
    pixels = np.empty(n, dtype=np.int64)
    weights = np.empty((n, 3), dtype=np.float64)
    dw, dx, dy, dz = q_detector[0], q_detector[1], q_detector[2], q_detector[3]
    for t in prange(n):
        w, x, y, z = _mult(q_boresight[t, 0], q_boresight[t, 1], q_boresight[t, 2], q_boresight[t, 3], dw, dx, dy, dz)
        vx = 2 * (x * z + w * y)
        vy = 2 * (y * z - w * x)
        vz = 1 - 2 * (x * x + y * y)
        ex = 1 - 2 * (y * y + z * z)
        ey = 2 * (x * y + w * z)
        ez = 2 * (x * z - w * y)
        a = vz * (ex * vx + ey * vy) - ez * (vx * vx + vy * vy)
        b = ey * vx - ex * vy
        pixels[t] = vec2pix_ring(nside, vx, vy, vz)
        norm = a * a + b * b
        if norm == 0.0:
            norm = 1.0
        weights[t, 0] = 1.0
        weights[t, 1] = (a * a - b * b) / norm
        weights[t, 2] = 2.0 * a * b / norm
    return pixels, weights
