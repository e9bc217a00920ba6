"""Dashboard pages and behaviour added for the scientist's journey (in process, no browser): the plans and
products pages, HTML 404s for browsers and JSON for API clients, the live realisation rows, frozen
throughput of a finished campaign, and the one-time login link (expiry by moving the service's clock)."""

from __future__ import annotations

import pytest

from tests.api.test_dashboard import login, running_campaign


def run_all(api, campaign, worker) -> None:
    for _ in range(campaign["realizations"]):
        (task,) = api.claim(worker, 1)
        assert api.succeed(task).status_code == 200


# --------------------------------------------------------------------------- throughput


def test_finished_campaign_throughput_is_frozen_at_its_end(api, clock):
    campaign, worker = running_campaign(api, realizations=4)
    clock.advance(600)  # the four realisations take ten minutes (on the service's clock)
    for _ in range(4):
        (task,) = api.claim(worker, 1)
        clock.advance(150)
        assert api.succeed(task).status_code == 200
    read = api.campaign(campaign["id"])
    assert read["state"] == "succeeded"
    frozen = read["progress"]["throughput_per_hour"]
    # Four realisations over the span from the first claim to the end: 4 x 150 s = 600 s, so 24 per hour.
    assert frozen == pytest.approx(24.0, rel=0.01)
    assert read["progress"]["eta_seconds"] is None
    clock.advance(6 * 3600)  # hours later, the figure has not moved
    later = api.campaign(campaign["id"])["progress"]["throughput_per_hour"]
    assert later == frozen
    login(api)
    status = api.client.get(f"/ui/campaigns/{campaign['id']}/status").json()
    assert status["throughput_per_hour"] == frozen


def test_running_campaign_throughput_still_follows_the_window(api, clock):
    campaign, worker = running_campaign(api, realizations=4)
    (task,) = api.claim(worker, 1)
    clock.advance(300)
    assert api.succeed(task).status_code == 200
    first = api.campaign(campaign["id"])["progress"]["throughput_per_hour"]
    assert first == pytest.approx(12.0, rel=0.01)  # one in 300 s
    clock.advance(300)
    assert api.campaign(campaign["id"])["progress"]["throughput_per_hour"] == pytest.approx(6.0, rel=0.01)
