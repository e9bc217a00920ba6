"""Boresight orientation of the two scan families, as rotation quaternions.

The boresight frame has the line of sight along +z; a detector's offset and
polarisation angle are rotations in that frame (see :mod:`.pointing`). Each
function returns ``[n, 4]`` quaternions that rotate the boresight frame into
the map frame at the given times. Times are seconds from the start of the
observation, angles radians, rates radians per second.
"""
from __future__ import annotations

import numpy as np

from mapmaker.kernels import quaternion as quat

SIDEREAL_DAY_S = 86_164.0905


def satellite(
    times_s: np.ndarray,
    *,
    start_longitude: float,
    drift_rate: float,
    precession_rate: float,
    precession_angle: float,
    spin_rate: float,
    spin_angle: float,
) -> np.ndarray:
    """Spin + precession + drift in ecliptic coordinates.

    ``R(t) = Rz(lambda(t)) Ry(pi/2) Rz(precession_rate t) Ry(precession_angle) Rz(spin_rate t) Ry(spin_angle)``
    read right to left: tilt the boresight by ``spin_angle`` from the spin
    axis (+z), spin it about that axis, tilt the spin axis by
    ``precession_angle`` from the precession axis, precess, turn the
    precession axis from the pole to the ecliptic (``Ry(pi/2)`` maps +z to
    +x), and point it at the anti-Sun longitude ``lambda(t) = start_longitude
    + drift_rate t``.

    times_s [n] float64 (s) -> quaternions [n, 4].
    """
    t = np.asarray(times_s, dtype=np.float64)
    q = quat.mult(quat.about_axis("z", spin_rate * t), quat.about_axis("y", spin_angle))
    q = quat.mult(quat.about_axis("y", precession_angle), q)
    q = quat.mult(quat.about_axis("z", precession_rate * t), q)
    q = quat.mult(quat.about_axis("y", 0.5 * np.pi), q)
    return quat.mult(quat.about_axis("z", start_longitude + drift_rate * t), q)


def triangle_azimuth(times_s: np.ndarray, *, azimuth_min: float, azimuth_max: float, azimuth_rate: float) -> np.ndarray:
    """Azimuth of a constant-speed back-and-forth sweep starting at ``azimuth_min`` at t = 0.

    times_s [n] (s) -> azimuth [n] (rad), a triangle wave of period ``2 (max - min) / rate``.
    """
    span = azimuth_max - azimuth_min
    travel = np.mod(azimuth_rate * np.asarray(times_s, dtype=np.float64), 2.0 * span)
    return azimuth_min + np.where(travel < span, travel, 2.0 * span - travel)


def ground(
    times_s: np.ndarray,
    *,
    site_latitude: float,
    elevation: float,
    azimuth_min: float,
    azimuth_max: float,
    azimuth_rate: float,
    start_lst: float,
    earth_rotation: bool,
) -> np.ndarray:
    """Constant-elevation scan, map frame equatorial (RA, Dec).

    Horizon frame: x north, y west, z zenith; azimuth from north through east.
    ``R(t) = Rz(LST(t) + pi) Ry(latitude - pi/2) Rz(-A(t)) Ry(pi/2 - elevation)``:
    ``Ry(pi/2 - el)`` tilts the boresight from the zenith to the north horizon
    at elevation ``el``; ``Rz(-A)`` turns it to azimuth ``A``; ``Ry(lat - pi/2)``
    brings the celestial pole (north at elevation ``lat``) to +z, which leaves
    the meridian point of the equator on -x; ``Rz(pi)`` turns that into the
    hour-angle frame and ``Rz(LST)`` into right ascension (RA = LST - HA).
    ``LST(t) = start_lst + 2 pi t / SIDEREAL_DAY_S`` when ``earth_rotation``.
    In the boresight frame, +x points to decreasing elevation and +y along
    the azimuth sweep (west at azimuth 0).

    times_s [n] float64 (s) -> quaternions [n, 4].
    """
    t = np.asarray(times_s, dtype=np.float64)
    azimuth = triangle_azimuth(t, azimuth_min=azimuth_min, azimuth_max=azimuth_max, azimuth_rate=azimuth_rate)
    lst = start_lst + (2.0 * np.pi / SIDEREAL_DAY_S) * t if earth_rotation else np.full_like(t, start_lst)
    q = quat.mult(quat.about_axis("z", -azimuth), quat.about_axis("y", 0.5 * np.pi - elevation))
    q = quat.mult(quat.about_axis("y", site_latitude - 0.5 * np.pi), q)
    return quat.mult(quat.about_axis("z", lst + np.pi), q)


def from_z_to(vectors: np.ndarray) -> np.ndarray:
    """The smallest rotation taking +z to each unit vector of ``vectors [n, 3]``: quaternions [n, 4].

    Axis ``z x v``, angle ``atan2(|z x v|, z . v)`` (TOAST's ``qarray.from_vectors`` from +z); for ``v = -z``,
    where every axis in the xy plane is smallest, the half turn about +x.
    """
    v = np.asarray(vectors, dtype=np.float64)
    axis = np.stack([-v[:, 1], v[:, 0], np.zeros(len(v))], axis=-1)
    sine = np.linalg.norm(axis, axis=1)
    half = 0.5 * np.arctan2(sine, v[:, 2])
    unit = np.divide(axis, sine[:, None], out=np.tile([1.0, 0.0, 0.0], (len(v), 1)), where=sine[:, None] > 0)
    return np.concatenate([np.cos(half)[:, None], np.sin(half)[:, None] * unit], axis=1)


def satellite_precessing(
    phase_time_s: np.ndarray,
    precession_axis: np.ndarray,
    *,
    precession_period_s: float,
    precession_angle: float,
    spin_period_s: float,
    spin_angle: float,
) -> np.ndarray:
    """Spin + precession about a moving precession axis, in TOAST's convention (``toast.ops.SimSatellite``).

    ``R = Q(axis) Rz(2 pi phase(t / P_prec)) Rx(precession_angle) Rz(2 pi phase(t / P_spin)) Rx(spin_angle)
    Rz(pi / 2)`` read right to left: turn the focal plane by pi/2 about the line of sight (TOAST's focal-plane
    frame has +y along the scan), tilt it by ``spin_angle`` from the spin axis (+z), spin, tilt the spin axis by
    ``precession_angle``, precess, and bring +z onto the precession axis by the smallest rotation ``Q``.
    ``phase(x) = x - floor(x)``: the angles are taken from the fractional turn, as TOAST does.

    phase_time_s [n] float64 (s, the clock of the spin and precession phases), precession_axis [n, 3] unit
    vectors in the map frame -> quaternions [n, 4].
    """
    t = np.asarray(phase_time_s, dtype=np.float64)
    precession_turns = t / precession_period_s
    spin_turns = t / spin_period_s
    precession = 2.0 * np.pi * (precession_turns - np.floor(precession_turns))
    spin = 2.0 * np.pi * (spin_turns - np.floor(spin_turns))
    q = quat.mult(quat.about_axis("x", spin_angle), quat.about_axis("z", 0.5 * np.pi))
    q = quat.mult(quat.about_axis("z", spin), q)
    q = quat.mult(quat.about_axis("x", precession_angle), q)
    q = quat.mult(quat.about_axis("z", precession), q)
    return quat.mult(from_z_to(precession_axis), q)
