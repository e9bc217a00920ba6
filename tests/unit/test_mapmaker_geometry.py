"""Pointing geometry against known answers: quaternions, satellite and ground scans, detectors, psi."""
import math

import healpy as hp
import numpy as np
import pytest

from mapmaker.kernels import boresight, pointing
from mapmaker.kernels import quaternion as quat

DEG = math.pi / 180


def rotation_matrix(axis: str, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return {
        "x": np.array([[1, 0, 0], [0, c, -s], [0, s, c]]),
        "y": np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]]),
        "z": np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]),
    }[axis]


def angle_between(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Angle (rad) between rows of two [n, 3] arrays, accurate at small angles."""
    return np.arctan2(np.linalg.norm(np.cross(u, v), axis=-1), np.sum(u * v, axis=-1))


# ----------------------------------------------------------------------------- quaternions


@pytest.mark.parametrize("axis", ["x", "y", "z"])
def test_axis_rotations_match_matrices(axis):
    for angle in (0.3, -1.2, 2.9):
        np.testing.assert_allclose(quat.to_matrix(quat.about_axis(axis, angle)), rotation_matrix(axis, angle), atol=1e-15)


def test_product_order_is_matrix_order():
    p, q = quat.about_axis("x", 0.4), quat.about_axis("z", 1.1)
    np.testing.assert_allclose(quat.to_matrix(quat.mult(p, q)), rotation_matrix("x", 0.4) @ rotation_matrix("z", 1.1), atol=1e-15)
    vector = np.array([0.2, -0.5, 0.8])
    np.testing.assert_allclose(quat.rotate(quat.mult(p, q), vector), quat.rotate(p, quat.rotate(q, vector)), atol=1e-15)


def test_axis_columns_match_rotation():
    q = quat.mult(quat.about_axis("y", np.linspace(0, 3, 7)), quat.about_axis("x", 0.7))
    np.testing.assert_allclose(quat.z_axis(q), quat.rotate(q, np.array([0.0, 0.0, 1.0])), atol=1e-15)
    np.testing.assert_allclose(quat.x_axis(q), quat.rotate(q, np.array([1.0, 0.0, 0.0])), atol=1e-15)


# ----------------------------------------------------------------------------- satellite

SATELLITE = {
    "start_longitude": 0.3, "drift_rate": 2 * math.pi / (365.25 * 86400), "precession_rate": 2 * math.pi / 3600,
    "precession_angle": 45 * DEG, "spin_rate": 2 * math.pi / 60, "spin_angle": 50 * DEG,
}
TIMES = np.linspace(0.0, 86_400.0, 20_001)


def satellite_direction(times, **changes):
    return quat.z_axis(boresight.satellite(times, **{**SATELLITE, **changes}))


def test_boresight_angle_from_spin_axis_is_the_spin_angle():
    spin_axis = satellite_direction(TIMES, spin_angle=0.0)
    np.testing.assert_allclose(angle_between(satellite_direction(TIMES), spin_axis), 50 * DEG, atol=1e-12)


def test_spin_axis_angle_from_anti_sun_is_the_precession_angle():
    spin_axis = satellite_direction(TIMES, spin_angle=0.0)
    longitude = SATELLITE["start_longitude"] + SATELLITE["drift_rate"] * TIMES
    anti_sun = np.column_stack([np.cos(longitude), np.sin(longitude), np.zeros_like(longitude)])
    np.testing.assert_allclose(angle_between(spin_axis, anti_sun), 45 * DEG, atol=1e-12)


def test_without_spin_and_precession_the_boresight_is_the_anti_sun_direction():
    direction = satellite_direction(TIMES, spin_angle=0.0, precession_angle=0.0)
    longitude = SATELLITE["start_longitude"] + SATELLITE["drift_rate"] * TIMES
    np.testing.assert_allclose(direction, np.column_stack([np.cos(longitude), np.sin(longitude), 0 * longitude]), atol=1e-12)


def test_spin_period_brings_the_boresight_back_relative_to_the_spin_axis():
    # With precession and drift frozen, the boresight repeats after one spin period.
    frozen = {"precession_rate": 0.0, "drift_rate": 0.0}
    start, later = satellite_direction(np.array([10.0]), **frozen), satellite_direction(np.array([70.0]), **frozen)
    np.testing.assert_allclose(later, start, atol=1e-12)


# ----------------------------------------------------------------------------- ground

GROUND = {
    "site_latitude": -22.96 * DEG, "elevation": 50 * DEG, "azimuth_min": -30 * DEG, "azimuth_max": 60 * DEG,
    "azimuth_rate": 1.0 * DEG, "start_lst": 40 * DEG, "earth_rotation": True,
}


def horizontal_from_equatorial(ra, dec, lst, latitude):
    """Textbook spherical astronomy, independent of the kernel: (azimuth from north through east, elevation)."""
    hour_angle = lst - ra
    sin_el = np.sin(dec) * np.sin(latitude) + np.cos(dec) * np.cos(latitude) * np.cos(hour_angle)
    azimuth = np.arctan2(
        -np.cos(dec) * np.sin(hour_angle),
        np.sin(dec) * np.cos(latitude) - np.cos(dec) * np.cos(hour_angle) * np.sin(latitude),
    )
    return azimuth, np.arcsin(sin_el)


def ground_radec(times, **changes):
    theta, phi = hp.vec2ang(quat.z_axis(boresight.ground(times, **{**GROUND, **changes})))
    return phi, 0.5 * np.pi - theta


def test_triangle_azimuth_sweeps_between_the_limits():
    times = np.linspace(0, 1000, 100_001)
    azimuth = boresight.triangle_azimuth(times, azimuth_min=-0.5, azimuth_max=1.0, azimuth_rate=0.01)
    assert azimuth.min() == pytest.approx(-0.5) and azimuth.max() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(np.abs(np.diff(azimuth)) / np.diff(times), 0.01, rtol=1e-6, atol=1e-5 * 0.01 * 1e3)
    assert boresight.triangle_azimuth(np.array([150.0]), azimuth_min=-0.5, azimuth_max=1.0, azimuth_rate=0.01)[0] == pytest.approx(1.0)


@pytest.mark.parametrize("latitude_deg, elevation_deg", [(-22.96, 50.0), (45.0, 30.0), (-80.0, 60.0)])
def test_declination_at_azimuth_zero(latitude_deg, elevation_deg):
    # Looking north: the boresight is on the meridian, dec = 90 - |el - lat| (degrees).
    _, dec = ground_radec(
        np.array([0.0]), site_latitude=latitude_deg * DEG, elevation=elevation_deg * DEG, azimuth_min=0.0
    )
    assert dec[0] / DEG == pytest.approx(90.0 - abs(elevation_deg - latitude_deg), abs=1e-9)


def test_elevation_is_constant_and_azimuth_follows_the_sweep():
    times = np.linspace(0.0, 7200.0, 5001)
    ra, dec = ground_radec(times)
    lst = GROUND["start_lst"] + 2 * math.pi * times / boresight.SIDEREAL_DAY_S
    azimuth, elevation = horizontal_from_equatorial(ra, dec, lst, GROUND["site_latitude"])
    np.testing.assert_allclose(elevation, GROUND["elevation"], atol=1e-12)
    expected = boresight.triangle_azimuth(
        times, azimuth_min=GROUND["azimuth_min"], azimuth_max=GROUND["azimuth_max"], azimuth_rate=GROUND["azimuth_rate"]
    )
    np.testing.assert_allclose(np.angle(np.exp(1j * (azimuth - expected))), 0.0, atol=1e-12)


def test_earth_rotation_moves_right_ascension_at_the_sidereal_rate():
    # Fixed azimuth (zero-width sweep is not allowed, so compare times one sweep period apart).
    period = 2 * (GROUND["azimuth_max"] - GROUND["azimuth_min"]) / GROUND["azimuth_rate"]
    times = np.array([0.0, period])
    ra_turning, dec_turning = ground_radec(times)
    ra_fixed, dec_fixed = ground_radec(times, earth_rotation=False)
    np.testing.assert_allclose(dec_turning, dec_fixed[0], atol=1e-12)
    np.testing.assert_allclose(ra_fixed[1] - ra_fixed[0], 0.0, atol=1e-12)
    advance = np.angle(np.exp(1j * (ra_turning[1] - ra_turning[0])))
    assert advance == pytest.approx(2 * math.pi * period / boresight.SIDEREAL_DAY_S, abs=1e-12)


# ----------------------------------------------------------------------------- detectors and psi


def test_detector_offset_angle():
    q_boresight = boresight.satellite(TIMES[:100], **SATELLITE)
    line_of_sight = quat.z_axis(q_boresight)
    for x_deg, y_deg in [(1.0, 0.0), (0.0, -2.0), (1.5, 2.5)]:
        detector = pointing.detector_quaternion(x_deg * DEG, y_deg * DEG, 0.3)
        offset = angle_between(quat.z_axis(quat.mult(q_boresight, detector)), line_of_sight)
        np.testing.assert_allclose(np.cos(offset), math.cos(x_deg * DEG) * math.cos(y_deg * DEG), atol=1e-14)


def test_psi_is_measured_from_the_meridian_towards_east():
    # Boresight on the equator at phi = 0 with the focal-plane x axis pointing north (-z).
    q_boresight = quat.about_axis("y", np.array([0.5 * np.pi]))
    for pol_deg, expected_deg in [(0.0, 0.0), (90.0, 90.0), (45.0, 45.0), (30.0, 30.0)]:
        theta, phi, psi = pointing.detector_angles(q_boresight, pointing.detector_quaternion(0, 0, pol_deg * DEG))
        assert theta[0] == pytest.approx(0.5 * np.pi) and phi[0] == pytest.approx(0.0, abs=1e-15)
        # e_theta points south, so "north" is psi = 0 modulo pi, which is all polarisation sees.
        assert np.cos(2 * (psi[0] - expected_deg * DEG)) == pytest.approx(1.0)


def test_weights_and_pixels_agree_with_angles():
    q_boresight = boresight.satellite(TIMES[:5000], **SATELLITE)
    detector = pointing.detector_quaternion(0.8 * DEG, -0.4 * DEG, 22.5 * DEG)
    pixels, weights = pointing.detector_pointing(q_boresight, detector, 64)
    theta, phi, psi = pointing.detector_angles(q_boresight, detector)
    assert pixels.dtype == np.int64 and weights.shape == (5000, 3)
    np.testing.assert_array_equal(pixels, hp.ang2pix(64, theta, phi))
    np.testing.assert_allclose(weights, np.column_stack([np.ones_like(psi), np.cos(2 * psi), np.sin(2 * psi)]), atol=1e-12)


def test_orthogonal_detectors_have_opposite_polarisation_weights():
    q_boresight = boresight.satellite(TIMES[:1000], **SATELLITE)
    _, a = pointing.detector_pointing(q_boresight, pointing.detector_quaternion(0, 0, 0.1), 32)
    _, b = pointing.detector_pointing(q_boresight, pointing.detector_quaternion(0, 0, 0.1 + 0.5 * np.pi), 32)
    np.testing.assert_allclose(a[:, 1:], -b[:, 1:], atol=1e-12)
