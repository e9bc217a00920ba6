"""Observing from a TOAST satellite schedule: the scans become chunks, the boresight is TOAST's, the sky is covered.

The schedule is written at test time by TOAST 3 (``SatelliteSchedule.write`` to ECSV), and TOAST's own
``SimSatellite`` on the same file gives the reference boresight. The coverage test takes the anti-Sun
direction from astropy's Sun (geocentric), not from the map-maker's ephemeris.
"""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime, timedelta

import healpy as hp
import numpy as np
import pytest
from mapmaker_cases import BASE

from campaignlib.instrument import resolve_files
from mapmaker.model.decomposition import chunk_layout
from mapmaker.model.scan import ChunkPointing
from schemas.spec import CampaignSpec, ScheduleNotRead, scan_key
from tests.support.toast_files import assert_schedule_refused, write_satellite_schedule

ARCSEC = math.pi / (180 * 3600)
# TOAST's SimSatellite runs the spin and precession phases at the rate it recovers from its float64 timestamps
# (the median step); near 1.8e9 s a 0.2 s step comes back as 4.9999988 Hz, a clock 2.4e-7 fast that turns the
# spin by 15 arcsec in an hour. At 4 Hz from a start on a binary fraction of a second the timestamps are exact,
# so TOAST's clock is the schedule's, and the comparison is of the pointing, not of TOAST's rounding.
RATE_HZ = 4.0
SPIN_ANGLE_DEG, PRECESSION_ANGLE_DEG = 50.0, 45.0
START = datetime(2027, 3, 1, 0, 0, 0, 125_000, tzinfo=UTC)
# Three 20-minute scans, gaps of 5 min 3.3 s (off the sample grid: TOAST starts each scan at the next sample
# on the grid of the first scan's start), the last one with other periods.
SCANS = [
    {"name": "day1_a", "start": START, "stop": START + timedelta(minutes=20, seconds=40), "prec_period": 10.0, "spin_period": 2.0},
    {"name": "day1_b", "start": START + timedelta(minutes=25, seconds=43.3), "stop": START + timedelta(minutes=45, seconds=48.3), "prec_period": 10.0, "spin_period": 2.0},
    {"name": "day1_c", "start": START + timedelta(minutes=50, seconds=46.6), "stop": START + timedelta(minutes=71, seconds=0), "prec_period": 7.0, "spin_period": 1.5},
]  # fmt: skip


def schedule_spec(file: str, sha256: str, **scan) -> CampaignSpec:
    data = copy.deepcopy(BASE)
    data["scan"] = {
        "kind": "satellite-schedule",
        "file": file,
        "sha256": sha256,
        "chunk_s": 300.0,
        "spin_angle_deg": SPIN_ANGLE_DEG,
        "precession_angle_deg": PRECESSION_ANGLE_DEG,
        **scan,
    }
    data["focal_plane"] = {"sample_rate_hz": RATE_HZ, "detectors": [{"name": f"D{a}", "pol_angle_deg": a} for a in (0.0, 45.0, 90.0, 135.0)]}
    data["pixelization"] = {"nside": 32}
    return CampaignSpec.model_validate(data)


@pytest.fixture
def schedule(tmp_path):
    sha = write_satellite_schedule(tmp_path / "satellite.ecsv", SCANS)
    return tmp_path, sha


def test_each_scan_holds_whole_chunks_back_to_back(schedule):
    root, sha = schedule
    spec = resolve_files(schedule_spec("satellite.ecsv", sha), root)
    scans = spec.scan.scans
    assert [s.name for s in scans] == ["day1_a", "day1_b", "day1_c"]
    assert [s.chunks for s in scans] == [4, 4, 4]  # 20 min 40 s, 20 min 5 s, 20 min 13 s: four whole 300 s chunks each
    assert [s.offset_s for s in scans] == [0.0, 1200.0, 2400.0]
    assert [s.precession_period_s for s in scans] == [600.0, 600.0, 420.0]
    assert spec.scan.duration_s == 3600.0 and chunk_layout(spec).n_time_chunks == 12
    with pytest.raises(ScheduleNotRead):
        _ = schedule_spec("satellite.ecsv", sha).scan.duration_s
    assert scan_key(spec) == scan_key(schedule_spec("moved/satellite.ecsv", sha))
    assert scan_key(spec) != scan_key(schedule_spec("satellite.ecsv", sha, first_scans=2))
    assert scan_key(spec) != scan_key(schedule_spec("satellite.ecsv", sha, spin_angle_deg=40.0))


def test_the_boresight_matches_toast_simsatellite_for_the_same_schedule(schedule):
    """TOAST's SimSatellite (ecliptic) on the same file: every sample's boresight rotation within 1 arcsec.

    The rotation angle between two unit quaternions is ``4 asin(|q1 - q2| / 2)`` for the closer sign,
    which covers the line of sight and the orientation about it (so the polarisation angle) at once.
    """
    import astropy.units as u
    import toast
    import toast.ops
    from toast.instrument import Focalplane, SpaceSite, Telescope

    root, sha = schedule
    spec = resolve_files(schedule_spec("satellite.ecsv", sha), root)
    layout = chunk_layout(spec)
    pointing = ChunkPointing(spec, layout)

    from astropy.table import QTable

    detectors = QTable({"name": ["D0"], "quat": [[0.0, 0.0, 0.0, 1.0]]})
    focal_plane = Focalplane(detector_data=detectors, sample_rate=RATE_HZ * u.Hz)
    data = toast.Data(toast.Comm(world=None))
    toast.ops.SimSatellite(
        telescope=Telescope("satellite", focalplane=focal_plane, site=SpaceSite("space")),
        schedule_file=str(root / "satellite.ecsv"),
        coord="E",
        spin_angle=SPIN_ANGLE_DEG * u.deg,
        prec_angle=PRECESSION_ANGLE_DEG * u.deg,
    ).apply(data)
    assert len(data.obs) == len(SCANS)

    worst = 0.0
    time_chunk = 0
    for scan, observation in zip(spec.scan.scans, data.obs, strict=True):
        assert observation.shared["times"][0] == pytest.approx(scan.start_unix_s, abs=1e-6)
        ours = np.concatenate([pointing.boresight(time_chunk + c) for c in range(scan.chunks)])  # [n, 4] w first
        time_chunk += scan.chunks
        theirs = np.asarray(observation.shared["boresight_radec"][: len(ours)])[:, [3, 0, 1, 2]]
        distance = np.minimum(np.linalg.norm(ours - theirs, axis=1), np.linalg.norm(ours + theirs, axis=1))
        worst = max(worst, float(np.max(4.0 * np.arcsin(0.5 * distance))))
    assert worst < 1.0 * ARCSEC, worst / ARCSEC


def test_the_hit_map_covers_the_ring_around_the_anti_sun_direction(schedule):
    """The hit map of the map-maker's pointing: every hit lies between |precession - spin| and precession + spin
    angle of the anti-Sun direction (a degree of margin for the Sun's wobble about the barycentre and the hour's
    drift, plus a pixel), the hits reach both edges of that ring (within 3 degrees) and every 30-degree sector
    around the anti-Sun direction."""
    from astropy.coordinates import GeocentricTrueEcliptic, get_sun
    from astropy.time import Time

    root, sha = schedule
    spec = resolve_files(schedule_spec("satellite.ecsv", sha), root)
    layout = chunk_layout(spec)
    pointing = ChunkPointing(spec, layout)
    nside = spec.pixelization.nside
    hits = np.zeros(hp.nside2npix(nside), dtype=np.int64)
    for time_chunk in range(layout.n_time_chunks):
        for detector in range(len(spec.focal_plane.detector_rows)):
            pixels, _ = pointing(time_chunk, detector)
            hits += np.bincount(pixels, minlength=hits.size)
    assert hits.sum() == spec.total_samples

    middle = Time(START + timedelta(minutes=35))
    sun = get_sun(middle).transform_to(GeocentricTrueEcliptic(equinox=middle))
    anti_sun = hp.ang2vec(sun.lon.deg + 180.0, sun.lat.deg, lonlat=True)
    vectors = np.array(hp.pix2vec(nside, np.arange(hits.size))).T  # [n_pix, 3]
    distance = np.degrees(np.arccos(np.clip(vectors @ anti_sun, -1, 1)))
    inner, outer = abs(PRECESSION_ANGLE_DEG - SPIN_ANGLE_DEG), PRECESSION_ANGLE_DEG + SPIN_ANGLE_DEG
    margin = 1.0 + np.degrees(hp.max_pixrad(nside))
    assert hits[(distance < inner - margin) | (distance > outer + margin)].sum() == 0
    seen = hits > 0
    assert distance[seen].min() < inner + 3.0 and distance[seen].max() > outer - 3.0
    # The direction of each hit pixel around the anti-Sun axis, from an arbitrary reference perpendicular to it.
    reference = np.cross(anti_sun, [0.0, 0.0, 1.0])
    reference /= np.linalg.norm(reference)
    around = np.degrees(np.arctan2(vectors[seen] @ np.cross(anti_sun, reference), vectors[seen] @ reference)) % 360.0
    assert set(np.floor(around / 30.0).astype(int)) == set(range(12))


@pytest.mark.parametrize(
    "damage, column",
    [
        ("no spin_period", "spin_period"),
        ("zero precession", "prec_period"),
        ("bad start", "start"),
        ("short scan", "stop"),
        ("not ecsv", ""),
    ],
)
def test_a_malformed_satellite_schedule_is_refused_naming_the_file_and_the_column(tmp_path, damage, column):
    path = tmp_path / "bad.ecsv"
    scans = copy.deepcopy(SCANS)
    if damage == "short scan":
        scans[1]["stop"] = scans[1]["start"] + timedelta(seconds=100)
    if damage == "zero precession":
        scans[2]["prec_period"] = 0.0
    write_satellite_schedule(path, scans)
    text = path.read_text()
    if damage == "no spin_period":
        path.write_text(text.replace("spin_period", "spin_rate"))
    elif damage == "bad start":
        path.write_text(text.replace(SCANS[0]["start"].isoformat(sep="T"), "2027-13-01T00:00:00"))
    elif damage == "not ecsv":
        path.write_text("# Site | Telescope\nnot a table\n")
    assert_schedule_refused(path, schedule_spec, column)


def test_a_bad_field_of_a_schedule_scan_is_named_without_the_kind():
    from schemas.io import SpecError, spec_from_data

    data = copy.deepcopy(BASE)
    data["scan"] = {"kind": "satellite-schedule", "file": "s.ecsv", "sha256": "0" * 64, "spin_angle_deg": -1.0}
    with pytest.raises(SpecError) as caught:
        spec_from_data(data)
    assert [location for location, _ in caught.value.problems] == ["scan.spin_angle_deg"]


def test_the_precession_axis_rotation_takes_z_to_each_direction_even_opposite():
    """from_z_to against TOAST's qarray.from_vectors, and the poles (+z: no turn; -z: a half turn, not zero)."""
    import toast.qarray as qa

    from mapmaker.kernels import quaternion
    from mapmaker.kernels.boresight import from_z_to

    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(50, 3))
    vectors = np.concatenate([vectors / np.linalg.norm(vectors, axis=1, keepdims=True), [[0, 0, 1.0], [0, 0, -1.0]]])
    ours = from_z_to(vectors)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(quaternion.z_axis(ours), vectors, atol=1e-12)
    theirs = np.asarray(qa.from_vectors(np.tile([0.0, 0.0, 1.0], (50, 1)), vectors[:50]))[:, [3, 0, 1, 2]]
    np.testing.assert_allclose(ours[:50], theirs, atol=1e-12)


def test_the_instrument_summary_lists_each_scan_with_its_anti_sun_longitude(schedule):
    """The dashboard's scan list: start, observed time, periods, and the anti-Sun ecliptic longitude at the middle
    of each scan within 1 degree of the direction away from astropy's Sun in the J2000 ecliptic (the precession
    axis points away from the barycentre, which is up to 0.01 AU, 0.6 degree seen from the Earth, from the Sun)."""
    from astropy.coordinates import GeocentricMeanEcliptic, get_sun
    from astropy.time import Time

    from campaignlib.instrument import instrument_summary

    root, sha = schedule
    spec = resolve_files(schedule_spec("satellite.ecsv", sha), root)
    listed = instrument_summary(spec)["schedule"]
    assert listed["kind"] == "satellite-schedule" and listed["scans"] == 3 and listed["observed_s"] == 3600.0
    for scan, item in zip(spec.scan.scans, listed["shown"], strict=True):
        assert item["observed_s"] == 1200.0 and item["spin_period_s"] == scan.spin_period_s
        middle = Time(scan.start_unix_s + 600.0, format="unix")
        sun = get_sun(middle).transform_to(GeocentricMeanEcliptic(equinox="J2000"))
        difference = (item["anti_sun_longitude_deg"] - (sun.lon.deg + 180.0) + 180.0) % 360.0 - 180.0
        assert abs(difference) < 1.0, (item, difference)


def test_the_summary_coverage_holds_every_hit_and_the_ring_area(schedule):
    """The dashboard's coverage of a satellite schedule: every pixel the map-maker's pointing hits lies in a
    covered 5-degree ecliptic cell, and the covered fraction of the sky is the ring's between |precession - spin|
    and precession + spin (solid angle), widened by the cells' margin, within 10%; a far cell is not covered."""
    from campaignlib.instrument import instrument_summary

    root, sha = schedule
    spec = resolve_files(schedule_spec("satellite.ecsv", sha), root)
    coverage = instrument_summary(spec)["schedule"]["coverage"]
    cell = coverage["cell_deg"]
    covered = set(coverage["cells"])
    layout = chunk_layout(spec)
    pointing = ChunkPointing(spec, layout)
    nside = spec.pixelization.nside
    hit = np.zeros(hp.nside2npix(nside), dtype=bool)
    for time_chunk in range(layout.n_time_chunks):
        pixels, _ = pointing(time_chunk, 0)
        hit[pixels] = True
    lon, lat = hp.pix2ang(nside, np.flatnonzero(hit), lonlat=True)
    cells = np.floor((lat + 90.0) / cell).astype(int) * int(360 / cell) + np.floor((lon % 360.0) / cell).astype(int)
    assert set(cells.tolist()) <= covered
    inner = math.radians(abs(PRECESSION_ANGLE_DEG - SPIN_ANGLE_DEG))
    outer = math.radians(PRECESSION_ANGLE_DEG + SPIN_ANGLE_DEG)
    ring = (math.cos(inner) - math.cos(outer)) / 2  # one axis; the hour moves it by 0.04 degree
    widened = (math.cos(max(0.0, inner - math.radians(3.54))) - math.cos(outer + math.radians(3.54))) / 2
    assert ring < coverage["sky_fraction"] <= 1.1 * widened
    assert len(covered) < 72 * 36
