"""Observing from a TOAST ground schedule: the scans become chunks, and the hit map covers the named fields.

The schedule is written at test time by TOAST 3 (``GroundSchedule.write`` to ECSV); where each field is
comes from ``ephem`` (TOAST's own dependency), not from the map-maker: the sky position of the middle of
each scan's azimuth range at the middle of the scan, for the site in the file.
"""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime, timedelta

import healpy as hp
import numpy as np
import pytest
from mapmaker_cases import BASE
from mpi4py import MPI

from campaignlib.instrument import local_sidereal_time_deg, resolve_files
from mapmaker.model.decomposition import chunk_layout
from mapmaker.solve.realization import run_realization
from schemas.spec import CampaignSpec, ScheduleNotRead, scan_key
from tests.support.toast_files import assert_schedule_refused, write_ground_schedule

LATITUDE, LONGITUDE = -22.96, -67.79
START = datetime(2026, 6, 1, 3, 0, 0, tzinfo=UTC)
# Two fields, south-east and south-west (away from the meridian, where a constant-elevation scan reaches its
# extreme declination and sweeps no area); 40 minutes each (10 degrees of sky drift), two hours apart.
SCANS = [
    {"name": "south_field", "start": START, "stop": START + timedelta(minutes=40, seconds=50), "az_min": 125.0, "az_max": 155.0, "el": 50.0},
    {"name": "north_field", "start": START + timedelta(hours=2), "stop": START + timedelta(hours=2, minutes=40), "az_min": 205.0, "az_max": 235.0, "el": 55.0},
]  # fmt: skip


def schedule_spec(file: str, sha256: str, **scan) -> CampaignSpec:
    data = copy.deepcopy(BASE)
    data["scan"] = {"kind": "ground-schedule", "file": file, "sha256": sha256, "chunk_s": 300.0, "azimuth_rate_deg_s": 1.0, **scan}
    data["focal_plane"] = {"sample_rate_hz": 5.0, "detectors": [{"name": f"D{a}", "pol_angle_deg": a} for a in (0.0, 45.0, 90.0, 135.0)]}
    data["pixelization"] = {"nside": 64}
    return CampaignSpec.model_validate(data)


def field_centre(scan: dict) -> tuple[float, float]:
    """RA, Dec (degrees, of date) of the middle of the scan's azimuth range at the middle of the scan (ephem)."""
    import ephem

    observer = ephem.Observer()
    observer.lat, observer.lon = str(LATITUDE), str(LONGITUDE)
    observer.pressure = 0  # no refraction
    observer.date = ephem.Date(scan["start"] + (scan["stop"] - scan["start"]) / 2)
    azimuth = math.radians(0.5 * (scan["az_min"] + scan["az_max"]) % 360.0)
    ra, dec = observer.radec_of(azimuth, math.radians(scan["el"]))
    return math.degrees(ra), math.degrees(dec)


@pytest.fixture
def schedule(tmp_path):
    sha = write_ground_schedule(tmp_path / "schedule.ecsv", SCANS, LATITUDE, LONGITUDE)
    return tmp_path, sha


def test_each_scan_holds_whole_chunks_back_to_back(schedule):
    root, sha = schedule
    spec = resolve_files(schedule_spec("schedule.ecsv", sha), root)
    scans = spec.scan.scans
    assert [s.name for s in scans] == ["south_field", "north_field"]
    assert [s.chunks for s in scans] == [8, 8]  # 40 min 50 s and 40 min: eight whole 300 s chunks each
    assert [s.offset_s for s in scans] == [0.0, 2400.0]
    assert spec.scan.duration_s == 4800.0 and chunk_layout(spec).n_time_chunks == 16
    assert spec.scan.site_latitude_deg == pytest.approx(LATITUDE)
    with pytest.raises(ScheduleNotRead):
        _ = schedule_spec("schedule.ecsv", sha).scan.duration_s
    assert scan_key(spec) == scan_key(schedule_spec("moved/schedule.ecsv", sha))
    assert scan_key(spec) != scan_key(schedule_spec("schedule.ecsv", sha, first_scans=1))


def test_sidereal_time_agrees_with_ephem():
    """The written-out GMST + longitude against ephem's sidereal time: within 2 arcsec of rotation (UT1 = UTC)."""
    import ephem

    observer = ephem.Observer()
    observer.lon, observer.lat = str(LONGITUDE), str(LATITUDE)
    for moment in (START, START + timedelta(days=200, hours=7)):
        observer.date = ephem.Date(moment)
        ours = local_sidereal_time_deg(moment.timestamp(), LONGITUDE)
        difference = (ours - math.degrees(observer.sidereal_time()) + 180.0) % 360.0 - 180.0
        assert abs(difference) < 2.0 / 3600 * 15  # 2 s of time


def test_the_hit_map_covers_the_fields_the_schedule_names(schedule):
    root, sha = schedule
    spec = resolve_files(schedule_spec("schedule.ecsv", sha, earth_rotation=True), root)
    spec = spec.model_copy(update={"kind": "noise-only", "sky": {"kind": "none"}})
    outcome = run_realization(spec, 0, MPI.COMM_SELF)
    hits = outcome.hits
    nside = spec.pixelization.nside
    assert hits.sum() == spec.total_samples
    seen_in_fields = []
    for scan in SCANS:
        ra, dec = field_centre(scan)
        centre = hp.ang2vec(ra, dec, lonlat=True)
        disc = hp.query_disc(nside, centre, math.radians(1.5))
        assert hits[hp.vec2pix(nside, *centre)] > 0, scan["name"]
        assert np.all(hits[disc] > 0), scan["name"]  # the field is covered, not just touched
        region = hp.query_disc(nside, centre, math.radians(20.0))
        seen = region[hits[region] > 0]
        middle = np.mean(hp.pix2vec(nside, seen), axis=1)  # centre of the hit pixels (each counted once)
        offset = math.degrees(math.acos(np.dot(middle / np.linalg.norm(middle), centre)))
        assert offset < 1.0, (scan["name"], offset)
        seen_in_fields.append(region)
    # Every hit lies in one of the two fields (within the scans' sweep, about 12 degrees, and the sky's drift).
    inside = np.zeros(hits.size, dtype=bool)
    inside[np.concatenate(seen_in_fields)] = True
    assert hits[~inside].sum() == 0


@pytest.mark.parametrize(
    "damage, column",
    [("no el", "el"), ("no site", "site_lat"), ("short scan", "stop_time"), ("not ecsv", "")],
)
def test_a_malformed_schedule_is_refused_naming_the_file_and_the_column(tmp_path, damage, column):
    path = tmp_path / "bad.ecsv"
    scans = copy.deepcopy(SCANS)
    if damage == "short scan":
        scans[1]["stop"] = scans[1]["start"] + timedelta(seconds=100)
    write_ground_schedule(path, scans, LATITUDE, LONGITUDE)
    text = path.read_text()
    if damage == "no el":
        path.write_text(text.replace(" el ", " elevation ").replace("name: el,", "name: elevation,").replace("{name: el}", "{name: elevation}").replace("    el:\n", "    elevation:\n"))
    elif damage == "no site":
        path.write_text(text.replace("site_lat", "site_latitude"))
    elif damage == "not ecsv":
        path.write_text("# Site | Telescope\nnot a table\n")
    assert_schedule_refused(path, schedule_spec, column)


def test_the_instrument_summary_places_each_field_where_ephem_does(schedule):
    """The dashboard's field list: each scan's start, observed time, and its field within 0.5 degree of ephem's
    (the summary takes the middle of the observed chunks, 25 s before the middle of the first scan)."""
    from campaignlib.instrument import instrument_summary

    root, sha = schedule
    spec = resolve_files(schedule_spec("schedule.ecsv", sha), root)
    summary = instrument_summary(spec)
    assert summary is not None and "focal_plane" not in summary  # inline detectors: nothing read
    listed = summary["schedule"]
    assert listed["scans"] == 2 and listed["observed_s"] == 4800.0
    for scan, item in zip(SCANS, listed["shown"], strict=True):
        assert item["name"] == scan["name"] and item["start"] == scan["start"].isoformat(timespec="seconds")
        ra, dec = field_centre(scan)
        ours = hp.ang2vec(item["ra_deg"], item["dec_deg"], lonlat=True)
        assert math.degrees(math.acos(min(1.0, float(np.dot(ours, hp.ang2vec(ra, dec, lonlat=True)))))) < 0.5, item
