"""Fail fast, through the client against a live service on SQLite and PostgreSQL: K attempts failing alike
hold a campaign (nothing more is dispatched), K different failures do not, and a retry releases it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import mapcampaign
from service.campaigns.hold import failure_signature
from tests.client.conftest import CampaignRunner, small_spec
from tests.support.live_service import LiveService


def fail_next(runner: CampaignRunner, last_line: str, failure_class: str = "app_error") -> dict[str, Any]:
    task = runner.next_task()
    log_tail = f"realisation {task['realization']} at /scratch/r{task['realization']:04d}\n{last_line}\n"
    runner.worker.fail(task, failure_class, exit_code=1, log_tail=log_tail)
    return task


def campaign_events(live_service: LiveService, campaign_id: int) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{live_service.api_url}/events/log",
        params={"campaign_id": campaign_id, "after": 0, "limit": 1000},
        headers={"Authorization": f"Bearer {live_service.user_token}"},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()


def test_three_alike_failures_hold_the_campaign_and_a_retry_releases_it(
    client: mapcampaign.Client, campaign_runner: CampaignRunner, live_service: LiveService
):
    campaign = client.submit(small_spec("held", realizations=6, max_attempts=3))
    assert campaign.spec.hold_after_failures == 3  # the default
    # One task at a time: realisation 0 comes back first after each failure, then realisation 1.
    failed = [fail_next(campaign_runner, f"FileNotFoundError: sky_{n:04d}.fits") for n in range(3)]
    assert [task["realization"] for task in failed] == [0, 0, 0]
    assert client.get(campaign.id).state == "running"  # one realisation failing is its own max_attempts' business
    failed.append(fail_next(campaign_runner, "FileNotFoundError: sky_0001.fits"))
    assert failed[-1]["realization"] == 1

    held = client.get(campaign.id)
    assert held.state == "held"
    assert held.failure_cause is not None and "FileNotFoundError: sky_#.fits" in held.failure_cause
    assert f"mapcampaign retry {campaign.id}" in held.failure_cause
    assert campaign_runner.worker.claim(1) == []  # nothing more is dispatched
    assert (held.progress.counts["queued"], held.progress.counts["failed"]) == (5, 1)
    assert client.wait(campaign.id, timeout=30).state == "held"  # wait() returns: nothing will change by itself
    held_events = [e for e in campaign_events(live_service, campaign.id) if e.get("state") == "held"]
    assert held_events and "sky_#.fits" in held_events[-1]["data"]["signature"]

    released = client.retry(campaign.id)
    assert released.requeued == 1
    assert released.campaign.state in ("queued", "running") and released.campaign.failure_cause is None
    for _ in range(6):
        campaign_runner.run_one()
    assert client.wait(campaign.id, timeout=60).state == "succeeded"


def test_different_failures_and_a_success_in_between_do_not_hold(
    client: mapcampaign.Client, campaign_runner: CampaignRunner
):
    campaign = client.submit(small_spec("not held", realizations=8, max_attempts=1))
    for line in ("MemoryError", "ValueError: bad detector", "KeyError: 'T'"):
        fail_next(campaign_runner, line)
    assert client.get(campaign.id).state == "running"
    fail_next(campaign_runner, "KeyError: 'T'")
    campaign_runner.run_one()  # a success breaks the run of alike failures
    fail_next(campaign_runner, "KeyError: 'T'")
    fail_next(campaign_runner, "KeyError: 'T'", failure_class="walltime")  # same line, other class
    assert client.get(campaign.id).state == "running"


def test_the_site_s_own_failures_do_not_count_and_zero_never_holds(
    client: mapcampaign.Client, campaign_runner: CampaignRunner
):
    never = client.submit(small_spec("never held", realizations=4, max_attempts=1, hold_after_failures=0))
    for _ in range(4):
        fail_next(campaign_runner, "boom")
    assert client.get(never.id).state == "failed"

    site = client.submit(small_spec("site trouble", realizations=3, max_attempts=2))
    for _ in range(3):
        fail_next(campaign_runner, "cannot write the work folder", failure_class="site_error")
    assert client.get(site.id).state in ("queued", "running")  # site errors are given back: queued again


@pytest.mark.parametrize(
    ("one", "other", "alike"),
    [
        (("app_error", "x\nIOError: /a/sky_0001.fits"), ("app_error", "y\nIOError: /a/sky_0712.fits"), True),
        (("app_error", "rank 3 died at 0x7ffd12"), ("app_error", "rank 12 died at 0x11aa00"), True),
        (("app_error", "boom"), ("oom", "boom"), False),
        (("app_error", "boom"), ("app_error", "bang"), False),
        (("walltime", ""), ("walltime", "\n\n"), True),
    ],
)
def test_failure_signatures(one, other, alike):
    assert (failure_signature(*one) == failure_signature(*other)) is alike
