"""Uploading TOAST files as a user does: ``mapcampaign upload`` and ``Client.upload_instrument_file`` against a
real ``mapcampaign serve`` with an instrument_root; the file is kept once and a submitted spec names it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import mapcampaign
from mapcampaign.errors import InvalidRequest
from tests.cli.conftest import cli_env, run_cli, stdout_json
from tests.support.live_service import LiveService, start_live_service
from tests.support.service_helpers import spec_data
from tests.support.toast_files import hexagon_focal_plane, write_ground_schedule


@pytest.fixture(scope="module")
def instruments(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("instruments")


@pytest.fixture(scope="module")
def upload_service(tmp_path_factory: pytest.TempPathFactory, instruments: Path) -> Iterator[LiveService]:
    service = start_live_service(tmp_path_factory.mktemp("upload-service"), env={"MAPCAMPAIGN_INSTRUMENT_ROOT": str(instruments)})
    try:
        yield service
    finally:
        service.stop()


def test_the_cli_uploads_once_and_prints_what_a_spec_names(upload_service, instruments, tmp_path):
    env = cli_env(upload_service, upload_service.user_token)
    sha = hexagon_focal_plane(tmp_path / "hex.h5", n_pix=7)
    done = run_cli(env, "upload", str(tmp_path / "hex.h5"))
    assert done.returncode == 0, done.stderr
    assert f"hex.h5: kept as uploads/{sha}.h5 (14 detectors" in done.stdout
    assert f'sha256 = "{sha}"' in done.stdout and f'file = "uploads/{sha}.h5"' in done.stdout
    done = run_cli(env, "upload", str(tmp_path / "hex.h5"), "--json")
    assert done.returncode == 0, done.stderr
    assert stdout_json(done)["sha256"] == sha
    assert sorted(p.name for p in (instruments / "uploads").iterdir()) == [f"{sha}.h5"]

    start = datetime(2026, 6, 1, 3, tzinfo=UTC)
    write_ground_schedule(tmp_path / "s.ecsv", [{"name": "f", "start": start, "stop": start + timedelta(hours=1),
                                                 "az_min": 120.0, "az_max": 150.0, "el": 50.0}], -22.96, -67.79)  # fmt: skip
    done = run_cli(env, "upload", str(tmp_path / "s.ecsv"))
    assert done.returncode == 2 and "--kind" in done.stderr
    (tmp_path / "broken.ecsv").write_text((tmp_path / "s.ecsv").read_text().replace("azmax", "az_max"))
    done = run_cli(env, "upload", str(tmp_path / "broken.ecsv"), "--kind", "ground-schedule")
    assert done.returncode == 2 and "column 'azmax' of schedule file" in done.stderr, done.stderr
    done = run_cli(env, "upload", str(tmp_path / "s.ecsv"), "--kind", "ground-schedule", "--json")
    assert done.returncode == 0 and stdout_json(done)["scans"] == 1


def test_the_client_uploads_and_a_spec_names_the_upload(upload_service, tmp_path):
    sha = hexagon_focal_plane(tmp_path / "narrow.h5", n_pix=7, width_deg=3.0)
    with mapcampaign.Client(server=upload_service.url, token=upload_service.user_token, timeout=30.0) as client:
        record = client.upload_instrument_file(tmp_path / "narrow.h5")
        assert record.sha256 == sha and record.detectors == 14 and record.file == f"uploads/{sha}.h5"
        data = spec_data(name="from an upload")
        data["focal_plane"] = {"sample_rate_hz": 5.0, "file": record.file, "sha256": record.sha256}
        campaign = client.submit(data)
        assert campaign.spec.focal_plane.file == record.file
        client.cancel(campaign.id, reason="only the submission is under test")
        (tmp_path / "bad.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 200)
        with pytest.raises(InvalidRequest) as caught:
            client.upload_instrument_file(tmp_path / "bad.h5")
        assert hashlib.sha256((tmp_path / "bad.h5").read_bytes()).hexdigest() in str(caught.value)


def test_a_site_without_the_service_folder_fetches_the_uploads_a_task_names(upload_service, tmp_path):
    """The worker's fetch (worker.instruments) against the live service: the upload lands under the site's own
    instrument_root with the checksum's bytes, once; an unknown upload and a file outside uploads/ are left alone."""
    from schemas.io import spec_from_data
    from worker.client import ServiceClient
    from worker.instruments import fetch_uploads

    sha = hexagon_focal_plane(tmp_path / "wide.h5", n_pix=7, width_deg=8.0)
    with mapcampaign.Client(server=upload_service.url, token=upload_service.user_token, timeout=30.0) as client:
        record = client.upload_instrument_file(tmp_path / "wide.h5")
    site_root = tmp_path / "site-instruments"
    data = spec_data(name="fetched")
    data["focal_plane"] = {"sample_rate_hz": 5.0, "file": record.file, "sha256": sha}
    spec = spec_from_data(data)
    worker = ServiceClient(upload_service.api_url, upload_service.worker_token, retry_s=5.0)
    try:
        assert fetch_uploads(spec, site_root, worker) == [site_root / record.file]
        assert (site_root / record.file).read_bytes() == (tmp_path / "wide.h5").read_bytes()
        assert fetch_uploads(spec, site_root, worker) == []  # kept for the next task
        data["focal_plane"] = {**data["focal_plane"], "file": f"uploads/{'1' * 64}.h5", "sha256": "1" * 64}
        assert fetch_uploads(spec_from_data(data), site_root, worker) == []  # the map-maker will refuse it
        data["focal_plane"] = {**data["focal_plane"], "file": "mine/wide.h5", "sha256": sha}
        assert fetch_uploads(spec_from_data(data), site_root, worker) == []  # the site's own file, not fetched
        assert fetch_uploads(spec, None, worker) == []  # a site without an instrument_root reads no files
    finally:
        worker.close()
    assert sorted(p.name for p in (site_root / "uploads").iterdir()) == [f"{sha}.h5"]
