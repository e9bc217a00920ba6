"""A campaign whose focal plane is a TOAST file: read and checked at submit, refused with a 422 naming the file
and the column, nothing stored; a good file's checksum and selection in the scan key the queue hands out."""

from __future__ import annotations

import hashlib
import re

import astropy.units as u
import numpy as np
import pytest
from astropy.table import QTable

from tests.support.service_helpers import spec_data
from tests.support.toast_files import detector_quat, focal_plane_table, write_focal_plane


@pytest.fixture
def instruments(tmp_path):
    root = tmp_path / "instruments"
    root.mkdir()
    return root


def quad(root, name="fp.h5", **columns):
    quats = np.array([detector_quat(0.5, 0.0, angle) for angle in (0.0, 45.0, 90.0, 135.0)])
    table = focal_plane_table([f"D{i}" for i in range(4)], quats, net=[50e-6, 50e-6, 80e-6, 80e-6], **columns)
    return table, write_focal_plane(root / name, table)


def file_spec(file, sha256, **select):
    data = spec_data()
    data["focal_plane"] = {"sample_rate_hz": 5.0, "file": file, "sha256": sha256, "select": select}
    return data


def test_a_good_file_is_accepted_and_its_checksum_names_the_scan(make_api, instruments):
    api = make_api(instrument_root=instruments)
    _, sha = quad(instruments)
    first = api.post("/campaigns", json=file_spec("fp.h5", sha))
    assert first.status_code == 201, first.text
    again = api.post("/campaigns", json=file_spec("fp.h5", sha))
    part = api.post("/campaigns", json=file_spec("fp.h5", sha, first=2))
    assert again.status_code == part.status_code == 201
    assert first.json()["scan_key"] == again.json()["scan_key"] != part.json()["scan_key"]
    stored = api.campaign(first.json()["id"])
    assert stored["spec"]["focal_plane"]["file"] == "fp.h5" and stored["spec"]["focal_plane"]["detectors"] is None


def damaged(root, damage):
    """A file with one fault; returns (name, sha256, the column the answer must name)."""
    table, _ = quad(root, "bad.h5")
    path = root / "bad.h5"
    column = {"no net": "psd_net", "nan fmin": "psd_fmin", "bad unit": "psd_fknee", "corrupt": ""}[damage]
    if damage == "no net":
        table.remove_column("psd_net")
        write_focal_plane(path, QTable(table))
    elif damage == "nan fmin":
        table["psd_fmin"][1] = np.nan * u.Hz
        write_focal_plane(path, table)
    elif damage == "bad unit":
        table["psd_fknee"] = table["psd_fknee"].value * u.m
        write_focal_plane(path, table)
    else:
        path.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 200)
    return "bad.h5", hashlib.sha256(path.read_bytes()).hexdigest(), column


@pytest.mark.parametrize("damage", ["no net", "nan fmin", "bad unit", "corrupt"])
def test_a_malformed_file_is_a_422_naming_the_file_and_the_column_and_nothing_is_stored(make_api, instruments, damage):
    api = make_api(instrument_root=instruments)
    name, sha, column = damaged(instruments, damage)
    answer = api.post("/campaigns", json=file_spec(name, sha))
    assert answer.status_code == 422, answer.text
    [problem] = answer.json()["detail"]
    assert problem["loc"] == ["body", "focal_plane", "file"]
    assert "'bad.h5'" in problem["msg"]
    if column:
        assert f"column {column!r}" in problem["msg"]
    assert api.get("/campaigns").json()["items"] == []  # nothing stored


def test_a_wrong_checksum_or_no_instrument_root_is_refused(make_api, instruments):
    _, sha = quad(instruments)
    api = make_api(instrument_root=instruments)
    answer = api.post("/campaigns", json=file_spec("fp.h5", "f" * 64))
    assert answer.status_code == 422 and "sha256" in answer.text
    missing = api.post("/campaigns", json=file_spec("other.h5", sha))
    assert missing.status_code == 422 and "no such file" in missing.text
    without_root = make_api()
    answer = without_root.post("/campaigns", json=file_spec("fp.h5", sha))
    assert answer.status_code == 422 and "instrument_root" in answer.text
    assert api.get("/campaigns").json()["items"] == []


def test_the_campaign_page_shows_the_focal_plane(make_api, instruments):
    """Inline detectors: their count and one mark per detector in the plot; a file: its name, checksum, selection."""
    api = make_api(instrument_root=instruments)
    inline = api.create()
    _, sha = quad(instruments, band=["f150", "f150", "f090", "f090"])
    answer = api.post("/campaigns", json=file_spec("fp.h5", sha, band="f150", first=2))
    assert answer.status_code == 201, answer.text
    from_file = answer.json()
    answer = api.client.post("/login", data={"token": api.alice, "next": "/"}, follow_redirects=False)
    assert answer.status_code == 303, answer.text

    page = api.client.get(f"/campaigns/{inline['id']}").text
    detectors = inline["spec"]["focal_plane"]["detectors"]
    assert f"<b>{len(detectors)}</b> detectors" in page
    assert page.count('<g class="detector">') == len(detectors)
    for detector in detectors:
        assert f"<title>{detector['name']}:" in page

    page = api.client.get(f"/campaigns/{from_file['id']}").text
    assert "TOAST focal-plane file <code>fp.h5</code>" in page and sha[:12] in page
    assert "band = <code>f150</code>" in page and "first = <code>2</code>" in page
    # What the service read from the file at submit: the count, one mark per selected detector, the NETs.
    assert "<b>2</b> detectors of the file's 4" in page
    assert page.count('<g class="detector">') == 2
    # The polarisation angles drawn are the quaternions' (the file's pol_angle column says 0 here), to 0.01 degree
    # (the angle in the focal plane of a detector 0.5 degree off the boresight differs from its own by 0.001).
    angles = dict(re.findall(r"<title>(D\d): \(0\.500, 0\.000\)°, ([-0-9.]+)°</title>", page))
    assert angles.keys() == {"D0", "D1"}
    assert float(angles["D0"]) == pytest.approx(0.0, abs=0.01) and float(angles["D1"]) == pytest.approx(45.0, abs=0.01)
    assert "NET 50–50 µK√s" in page


def test_a_ground_schedule_is_read_at_submit(make_api, instruments):
    """A TOAST schedule under the instrument_root: accepted when whole, a 422 naming it and the column when not."""
    from datetime import UTC, datetime, timedelta

    from tests.support.toast_files import write_ground_schedule

    api = make_api(instrument_root=instruments)
    start = datetime(2026, 6, 1, 3, tzinfo=UTC)
    scans = [{"name": "field", "start": start, "stop": start + timedelta(hours=1), "az_min": 120.0, "az_max": 150.0, "el": 50.0}]
    sha = write_ground_schedule(instruments / "good.ecsv", scans, -22.96, -67.79)
    data = spec_data()
    data["scan"] = {"kind": "ground-schedule", "file": "good.ecsv", "sha256": sha, "chunk_s": 600.0}
    answer = api.post("/campaigns", json=data)
    assert answer.status_code == 201, answer.text
    api.client.post("/login", data={"token": api.alice, "next": "/"}, follow_redirects=False)
    page = api.client.get(f"/campaigns/{answer.json()['id']}").text
    assert "TOAST ground schedule <code>good.ecsv</code>" in page and sha[:12] in page
    assert "<b>1</b> scans, 1.0 h observed" in page
    assert "<td>field</td><td>2026-06-01T03:00:00+00:00</td><td>3600 s</td>" in page
    assert page.count('<g class="field">') == 1

    short = [{**scans[0], "stop": start + timedelta(seconds=60)}]
    data["scan"] = {**data["scan"], "file": "short.ecsv", "sha256": write_ground_schedule(instruments / "short.ecsv", short, -22.96, -67.79)}
    answer = api.post("/campaigns", json=data)
    assert answer.status_code == 422, answer.text
    [problem] = answer.json()["detail"]
    assert problem["loc"] == ["body", "scan", "file"]
    assert "column 'stop_time' of schedule file 'short.ecsv'" in problem["msg"]
    assert len(api.get("/campaigns").json()["items"]) == 1  # only the good one


def test_a_satellite_schedule_is_read_at_submit(make_api, instruments):
    """A TOAST satellite schedule: accepted when whole; a 422 naming it and the column when not, nothing stored."""
    from datetime import UTC, datetime, timedelta

    from tests.support.toast_files import write_satellite_schedule

    api = make_api(instrument_root=instruments)
    start = datetime(2027, 3, 1, tzinfo=UTC)
    scans = [{"name": "day1", "start": start, "stop": start + timedelta(hours=1), "prec_period": 10.0, "spin_period": 2.0}]
    sha = write_satellite_schedule(instruments / "good.ecsv", scans)
    data = spec_data()
    data["scan"] = {"kind": "satellite-schedule", "file": "good.ecsv", "sha256": sha, "chunk_s": 600.0}
    answer = api.post("/campaigns", json=data)
    assert answer.status_code == 201, answer.text
    api.client.post("/login", data={"token": api.alice, "next": "/"}, follow_redirects=False)
    page = api.client.get(f"/campaigns/{answer.json()['id']}").text
    assert "TOAST satellite schedule <code>good.ecsv</code>" in page and sha[:12] in page
    assert "<td>day1</td><td>2027-03-01T00:00:00+00:00</td><td>3600 s</td>" in page
    assert "<td>10.0 min</td><td>2.00 min</td>" in page and "anti-Sun longitude" in page

    bad = [{**scans[0], "spin_period": -2.0}]
    data["scan"] = {**data["scan"], "file": "bad.ecsv", "sha256": write_satellite_schedule(instruments / "bad.ecsv", bad)}
    answer = api.post("/campaigns", json=data)
    assert answer.status_code == 422, answer.text
    [problem] = answer.json()["detail"]
    assert problem["loc"] == ["body", "scan", "file"]
    assert "column 'spin_period' of schedule file 'bad.ecsv'" in problem["msg"]
    assert len(api.get("/campaigns").json()["items"]) == 1  # only the good one
