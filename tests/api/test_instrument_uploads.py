"""Uploading a TOAST file: checked like a campaign's, kept once by checksum under the instrument_root, named by
a spec like any file there; a malformed one is a 422 naming the column, and nothing is written."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from tests.support.service_helpers import spec_data
from tests.support.toast_files import detector_quat, focal_plane_table, write_focal_plane, write_satellite_schedule

HDF5 = {"Content-Type": "application/x-hdf5"}
ECSV = {"Content-Type": "text/x-ecsv"}


@pytest.fixture
def instruments(tmp_path):
    root = tmp_path / "instruments"
    root.mkdir()
    return root


def quad_bytes(tmp_path, drop: str | None = None, **columns) -> bytes:
    quats = np.array([detector_quat(0.5, 0.0, angle) for angle in (0.0, 45.0, 90.0, 135.0)])
    table = focal_plane_table([f"D{i}" for i in range(4)], quats, net=[50e-6] * 4, **columns)
    if drop:
        table.remove_column(drop)
    path = tmp_path / "upload.h5"
    write_focal_plane(path, table)
    return path.read_bytes()


def uploads(root) -> list[str]:
    folder = root / "uploads"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_focal_plane_is_stored_once_by_checksum_and_a_spec_names_it(make_api, instruments, tmp_path):
    api = make_api(instrument_root=instruments)
    content = quad_bytes(tmp_path)
    sha = hashlib.sha256(content).hexdigest()
    answer = api.post("/instrument-files", params={"kind": "focal-plane"}, content=content, headers=HDF5)
    assert answer.status_code == 201, answer.text
    record = answer.json()
    assert record == {"sha256": sha, "kind": "focal-plane", "file": f"uploads/{sha}.h5", "size_bytes": len(content),
                      "detectors": 4, "scans": None}  # fmt: skip
    assert (instruments / record["file"]).read_bytes() == content

    again = api.post("/instrument-files", params={"kind": "focal-plane"}, content=content, headers=HDF5)
    assert again.status_code == 200 and again.json() == record
    assert uploads(instruments) == [f"{sha}.h5"]  # once, and no temporary file left

    data = spec_data()
    data["focal_plane"] = {"sample_rate_hz": 5.0, "file": record["file"], "sha256": record["sha256"]}
    campaign = api.post("/campaigns", json=data)
    assert campaign.status_code == 201, campaign.text


def test_a_satellite_schedule_upload_counts_its_scans(make_api, instruments, tmp_path):
    api = make_api(instrument_root=instruments)
    start = datetime(2027, 3, 1, tzinfo=UTC)
    scans = [{"name": f"day{i}", "start": start + timedelta(hours=i), "stop": start + timedelta(hours=i, minutes=50),
              "prec_period": 10.0, "spin_period": 2.0} for i in range(3)]  # fmt: skip
    write_satellite_schedule(tmp_path / "s.ecsv", scans)
    answer = api.post("/instrument-files", params={"kind": "satellite-schedule"}, content=(tmp_path / "s.ecsv").read_bytes(), headers=ECSV)
    assert answer.status_code == 201, answer.text
    assert answer.json()["scans"] == 3 and answer.json()["file"].endswith(".ecsv")


@pytest.mark.parametrize(
    "damage, column",
    [("no net", "psd_net"), ("nan fknee", "psd_fknee"), ("not hdf5", "")],
)
def test_a_malformed_upload_is_a_422_naming_the_column_and_nothing_is_stored(make_api, instruments, tmp_path, damage, column):
    api = make_api(instrument_root=instruments)
    if damage == "not hdf5":
        content = b"name,quat\nD0,1 0 0 0\n"
    else:
        fknee = [0.1, float("nan"), 0.1, 0.1] if damage == "nan fknee" else 0.1
        content = quad_bytes(tmp_path, drop="psd_net" if damage == "no net" else None, fknee=fknee)
    answer = api.post("/instrument-files", params={"kind": "focal-plane"}, content=content, headers=HDF5)
    assert answer.status_code == 422, answer.text
    [problem] = answer.json()["detail"]
    sha = hashlib.sha256(content).hexdigest()
    assert f"focal-plane file 'uploads/{sha}.h5'" in problem["msg"]
    if column:
        assert f"column {column!r}" in problem["msg"]
    assert uploads(instruments) == []  # nothing kept, not even the temporary file


def test_the_media_type_the_kind_and_the_root_are_checked(make_api, instruments, tmp_path):
    content = quad_bytes(tmp_path)
    api = make_api(instrument_root=instruments)
    answer = api.post("/instrument-files", params={"kind": "focal-plane"}, content=content, headers=ECSV)
    assert answer.status_code == 415 and "application/x-hdf5" in answer.text
    answer = api.post("/instrument-files", params={"kind": "beam"}, content=content, headers=HDF5)
    assert answer.status_code == 422 and "kind" in answer.text
    answer = api.post("/instrument-files", params={"kind": "focal-plane"}, content=b"", headers=HDF5)
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body"]
    without = make_api()
    answer = without.post("/instrument-files", params={"kind": "focal-plane"}, content=content, headers=HDF5)
    assert answer.status_code == 409 and "instrument_root" in answer.text
    assert uploads(instruments) == []


def test_a_worker_fetches_an_upload_by_its_checksum(make_api, instruments, tmp_path):
    api = make_api(instrument_root=instruments)
    content = quad_bytes(tmp_path)
    sha = api.post("/instrument-files", params={"kind": "focal-plane"}, content=content, headers=HDF5).json()["sha256"]
    answer = api.get(f"/instrument-files/{sha}", api.alice_worker)
    assert answer.status_code == 200 and answer.content == content
    assert answer.headers["content-type"] == "application/x-hdf5"
    assert api.get(f"/instrument-files/{sha}").status_code == 403  # a user token: uploads go one way
    assert api.get(f"/instrument-files/{'0' * 64}", api.alice_worker).status_code == 404
    assert api.get("/instrument-files/..%2F..%2Fetc%2Fpasswd", api.alice_worker).status_code in (404, 422)


def upload(api, content: bytes, token: str | None = None):
    return api.post("/instrument-files", token, params={"kind": "focal-plane"}, content=content, headers=HDF5)


def upload_rows(api) -> list[tuple[str, str]]:
    """(owner name, sha256) of every instrument_uploads row."""
    from sqlalchemy import select

    from service.auth.models import User
    from service.instruments.models import InstrumentUpload

    with api.database.session(write=False) as session:
        rows = session.execute(
            select(User.name, InstrumentUpload.sha256).join(User, User.id == InstrumentUpload.owner_id)
        ).all()
    return sorted((name, sha) for name, sha in rows)


def test_an_upload_is_new_for_each_uploader_and_reveals_nobody_elses(make_api, instruments, tmp_path):
    api = make_api(instrument_root=instruments)
    content = quad_bytes(tmp_path)
    sha = hashlib.sha256(content).hexdigest()
    first = upload(api, content)
    assert first.status_code == 201, first.text
    # Bob sends the same bytes: new for him (201), the same record; he learns nothing about alice's upload.
    theirs = upload(api, content, api.bob)
    assert theirs.status_code == 201 and theirs.json() == first.json()
    assert upload(api, content).status_code == 200  # alice's own repeat
    assert upload_rows(api) == [("alice", sha), ("bob", sha)]
    assert uploads(instruments) == [f"{sha}.h5"]  # one file for both
    assert [record["sha256"] for record in api.get("/instrument-files").json()] == [sha]
    other = quad_bytes(tmp_path, fknee=0.2)
    assert upload(api, other, api.bob).status_code == 201
    listed = api.get("/instrument-files", api.bob).json()
    assert [record["sha256"] for record in listed] == [hashlib.sha256(other).hexdigest(), sha]  # newest first
    assert [record["sha256"] for record in api.get("/instrument-files").json()] == [sha]  # alice: only hers
    # The site group reads the file (the docs' shared instrument folder), nobody else does.
    assert ((instruments / "uploads" / f"{sha}.h5").stat().st_mode & 0o777) == 0o640
    assert (instruments / "uploads").stat().st_mode & 0o050 == 0o050  # and the group lists the folder


def test_the_upload_file_mode_is_a_setting_read_as_octal(make_api, instruments, tmp_path, monkeypatch):
    from pydantic import ValidationError

    from service.config import Settings

    monkeypatch.setenv("MAPCAMPAIGN_UPLOAD_FILE_MODE", "644")
    assert Settings().upload_file_permissions == 0o644
    monkeypatch.setenv("MAPCAMPAIGN_UPLOAD_FILE_MODE", "0648")
    with pytest.raises(ValidationError, match="upload_file_mode"):
        Settings()
    monkeypatch.delenv("MAPCAMPAIGN_UPLOAD_FILE_MODE")
    api = make_api(instrument_root=instruments, upload_file_mode="0600")
    sha = upload(api, quad_bytes(tmp_path)).json()["sha256"]
    assert ((instruments / "uploads" / f"{sha}.h5").stat().st_mode & 0o777) == 0o600


def test_a_users_uploads_are_held_to_their_quota(make_api, instruments, tmp_path):
    content = quad_bytes(tmp_path)
    api = make_api(instrument_root=instruments, upload_quota_bytes=len(content) + 1_024)
    sha = upload(api, content).json()["sha256"]
    assert upload(api, content).status_code == 200  # a file already kept costs nothing more
    other = quad_bytes(tmp_path, fknee=0.2)
    refused = upload(api, other)
    assert refused.status_code == 413, refused.text
    assert refused.json()["code"] == "quota_exceeded" and "quota" in refused.json()["detail"]
    assert upload_rows(api) == [("alice", sha)] and uploads(instruments) == [f"{sha}.h5"]  # nothing stored
    assert upload(api, other, api.bob).status_code == 201  # another user's quota is their own
    # A declared body larger than the whole quota is refused before it is read.
    declared = api.client.post(
        "/api/v1/instrument-files",
        params={"kind": "focal-plane"},
        headers={**HDF5, "Authorization": f"Bearer {api.alice}", "Content-Length": str(10 * len(content))},
        content=content * 10,
    )
    assert declared.status_code == 413 and declared.json()["code"] == "quota_exceeded"


def test_the_owner_deletes_an_upload_not_while_a_campaign_uses_it(make_api, instruments, tmp_path):
    api = make_api(instrument_root=instruments)
    content = quad_bytes(tmp_path)
    sha = upload(api, content).json()["sha256"]
    assert upload(api, content, api.bob).status_code == 201
    data = spec_data()
    data["focal_plane"] = {"sample_rate_hz": 5.0, "file": f"uploads/{sha}.h5", "sha256": sha}
    campaign = api.post("/campaigns", json=data)
    assert campaign.status_code == 201, campaign.text

    refused = api.request("DELETE", f"/instrument-files/{sha}", api.alice)
    assert refused.status_code == 409 and str(campaign.json()["id"]) in refused.json()["detail"]
    assert api.request("DELETE", f"/instrument-files/{sha}", api.bob).status_code == 204  # bob's campaigns: none
    assert upload_rows(api) == [("alice", sha)] and uploads(instruments) == [f"{sha}.h5"]  # alice's file stays
    assert api.request("DELETE", f"/instrument-files/{sha}", api.bob).status_code == 404  # his is gone

    assert api.post(f"/campaigns/{campaign.json()['id']}/cancel").status_code == 200
    assert api.request("DELETE", f"/instrument-files/{sha}", api.alice).status_code == 204
    assert upload_rows(api) == [] and uploads(instruments) == []  # the last holder: the bytes go too
    assert api.get(f"/instrument-files/{sha}", api.alice_worker).status_code == 404


def test_stale_temporary_uploads_are_swept_at_start_up(make_api, instruments, tmp_path):
    import os
    import time

    from service.instruments.service import STALE_UPLOAD_AGE_S

    folder = instruments / "uploads"
    folder.mkdir()
    stale, running, kept = folder / ".upload-stale", folder / ".upload-running", folder / f"{'a' * 64}.h5"
    for path in (stale, running, kept):
        path.write_bytes(b"partial")
    long_ago = time.time() - STALE_UPLOAD_AGE_S - 60  # the file's clock moved back, not the test's
    os.utime(stale, (long_ago, long_ago))
    os.utime(kept, (long_ago, long_ago))
    make_api(instrument_root=instruments)
    assert uploads(instruments) == [".upload-running", f"{'a' * 64}.h5"]
