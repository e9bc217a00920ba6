"""The campaign page shows what the campaign read from its TOAST files, in headless Chromium (SQLite and PostgreSQL).

The service is started with an instrument_root holding a focal plane and a ground schedule written by TOAST
itself; the page draws the file's detectors and lists the schedule's scans with their fields on the sky, from
what the service read at submit.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.browser.conftest import Dashboard, texts
from tests.support.databases import on_database
from tests.support.live_service import LiveService
from tests.support.service_helpers import spec_data
from tests.support.toast_files import hexagon_focal_plane, write_ground_schedule, write_satellite_schedule

pytestmark = [pytest.mark.browser, on_database("sqlite")]

START = datetime(2026, 6, 1, 3, tzinfo=UTC)
SCANS = [
    {"name": "south_field", "start": START, "stop": START + timedelta(minutes=40), "az_min": 125.0, "az_max": 155.0, "el": 50.0},
    {"name": "north_field", "start": START + timedelta(hours=2), "stop": START + timedelta(hours=2, minutes=40), "az_min": 205.0, "az_max": 235.0, "el": 55.0},
]  # fmt: skip


@pytest.fixture
def instruments(tmp_path: Path) -> Path:
    root = tmp_path / "instruments"
    root.mkdir()
    return root


@pytest.fixture
def live_service(make_live_service: Callable[..., LiveService], instruments: Path) -> LiveService:
    return make_live_service(env={"MAPCAMPAIGN_INSTRUMENT_ROOT": str(instruments)})


def test_the_campaign_page_draws_a_file_focal_plane_and_lists_the_schedule(dash: Dashboard, page, instruments):
    focal_plane_sha = hexagon_focal_plane(instruments / "hex.h5", n_pix=7)  # 14 detectors
    schedule_sha = write_ground_schedule(instruments / "schedule.ecsv", SCANS, -22.96, -67.79)
    data = spec_data()
    data["focal_plane"] = {"sample_rate_hz": 5.0, "file": "hex.h5", "sha256": focal_plane_sha, "select": {"first": 10}}
    data["scan"] = {"kind": "ground-schedule", "file": "schedule.ecsv", "sha256": schedule_sha, "chunk_s": 600.0}
    with dash.api() as client:
        answer = client.post("/campaigns", json=data)
    assert answer.status_code == 201, answer.text
    campaign = answer.json()

    dash.login(page)
    page.goto(f"{dash.url}/campaigns/{campaign['id']}")
    summary = texts(page.locator("#focal-plane-summary"))[0]
    assert summary.startswith("10 detectors of the file's 14 from the TOAST focal-plane file hex.h5"), summary
    plot = page.locator("#focal-plane-plot")
    assert plot.is_visible()
    assert page.locator("#focal-plane-plot g.detector").count() == 10
    box = plot.bounding_box()
    assert box is not None and box["width"] > 100 and box["height"] > 100
    # The detectors spread over the plot (a hexagon 5 degrees wide), not piled at its centre.
    marks = [page.locator("#focal-plane-plot g.detector circle").nth(i).bounding_box() for i in range(10)]
    xs = [mark["x"] for mark in marks if mark]
    assert len(xs) == 10 and max(xs) - min(xs) > 0.2 * box["width"]

    assert texts(page.locator("#schedule-totals")) == ["2 scans, 1.3 h observed."]
    rows = page.locator("#schedule-scans tbody tr")
    assert rows.count() == 2
    first, second = (texts(rows.nth(i).locator("td")) for i in range(2))
    assert first[:5] == ["south_field", "2026-06-01T03:00:00+00:00", "2400 s", "125.0–155.0°", "50.0°"], first
    assert second[:5] == ["north_field", "2026-06-01T05:00:00+00:00", "2400 s", "205.0–235.0°", "55.0°"], second
    assert page.locator("#schedule-sky g.field").count() == 2
    assert page.locator("#schedule-sky").is_visible()
    dash.screenshot(page, "instrument-files")


def test_the_campaign_page_draws_a_satellite_schedule_s_reach_on_the_sky(dash: Dashboard, page, instruments):
    start = datetime(2027, 3, 1, tzinfo=UTC)
    scans = [
        {"name": f"day{day}", "start": start + timedelta(days=day), "stop": start + timedelta(days=day, minutes=20),
         "prec_period": 10.0, "spin_period": 2.0}
        for day in range(2)
    ]  # fmt: skip
    schedule_sha = write_satellite_schedule(instruments / "satellite.ecsv", scans)
    data = spec_data()
    data["scan"] = {"kind": "satellite-schedule", "file": "satellite.ecsv", "sha256": schedule_sha, "chunk_s": 600.0,
                    "spin_angle_deg": 50.0, "precession_angle_deg": 45.0}  # fmt: skip
    with dash.api() as client:
        answer = client.post("/campaigns", json=data)
        assert answer.status_code == 201, answer.text
        campaign = answer.json()
    dash.login(page)
    page.goto(f"{dash.url}/campaigns/{campaign['id']}")
    coverage = texts(page.locator("#schedule-coverage"))[0]
    percent = int(coverage.split("reach ")[1].split("%")[0])
    assert 40 <= percent <= 75, coverage  # the ring 5-95 degrees from the anti-Sun axis: 50% of the sky, widened
    covered = page.locator("#schedule-sky rect.covered")
    assert 0.3 * 72 * 36 < covered.count() < 72 * 36
    assert page.locator("#schedule-sky g.anti-sun").count() == 2
    assert page.locator("#schedule-sky").is_visible()
    dash.screenshot(page, "satellite-schedule")
