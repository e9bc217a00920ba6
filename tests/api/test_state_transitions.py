"""The state machine as the service walks it: every transition the code performs is in the table, and every
transition in the table is one the code performs (the scenarios below reach each through the API)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select, update

from schemas.states import TRANSITIONS, Entity, State, observe_transitions
from service.campaigns.lifecycle import settle_campaign
from service.campaigns.models import Campaign, Realization
from tests.api.conftest import Api, MovableClock

Seen = set[tuple[Entity, State, State]]


@pytest.fixture
def transitions() -> Iterator[Seen]:
    seen: Seen = set()
    stop = observe_transitions(lambda entity, current, new: seen.add((entity, current, new)))
    yield seen
    stop()


def allowed() -> Seen:
    return {
        (entity, current, new) for entity, moves in TRANSITIONS.items() for current, to in moves.items() for new in to
    }


def succeed_and_retry(api: Api) -> None:
    """A realisation that succeeds after starting, one that fails its attempts, is retried, succeeds unstarted."""
    campaign = api.create(name="retried", realizations=2, max_attempts=2)
    worker = api.register()
    api.build_plan(worker)
    first = api.claim(worker)[0]
    assert api.wpost(f"/tasks/{first['task_id']}/started").json()["state"] == "running"
    assert api.succeed(first).status_code == 200
    second = api.claim(worker)[0]
    assert api.fail(second["task_id"]).json()["state"] == "queued"  # claimed -> queued, an attempt left
    again = api.claim(worker)[0]
    assert api.wpost(f"/tasks/{again['task_id']}/started").status_code == 200
    assert api.fail(again["task_id"]).json()["state"] == "failed"  # running -> failed, none left
    assert api.campaign(campaign["id"])["state"] == "failed"
    assert api.post(f"/campaigns/{campaign['id']}/retry").status_code == 200
    assert api.campaign(campaign["id"])["state"] == "running"  # failed -> running: one had succeeded
    last = api.claim(worker)[0]
    assert api.succeed(last).status_code == 200  # claimed -> succeeded, never reported started
    assert api.campaign(campaign["id"])["state"] == "succeeded"


def cancel(api: Api) -> None:
    """Cancel a campaign with realisations queued, claimed and running; and one never started."""
    worker = api.register("w2")
    campaign = api.create(name="cancelled", realizations=3)
    tasks = api.claim(worker, max_tasks=2)
    assert [task["kind"] for task in tasks] == ["realize", "realize"]
    assert api.wpost(f"/tasks/{tasks[0]['task_id']}/started").status_code == 200
    for cancelled in (campaign, api.create(name="never started", realizations=1)):
        answer = api.post(f"/campaigns/{cancelled['id']}/cancel", json={"reason": "enough"})
        assert answer.status_code == 200, answer.text
        assert api.campaign(cancelled["id"])["state"] == "cancelled"


def expire_leases(api: Api, clock: MovableClock) -> None:
    """Leases that expire running and claimed: the realisation goes back to the queue, its campaign too."""
    worker = api.register("w3")
    campaign = api.create(name="expired", realizations=1, max_attempts=5)
    task = api.claim(worker)[0]
    assert api.wpost(f"/tasks/{task['task_id']}/started").status_code == 200
    clock.advance(api.settings.lease_s + 1)
    assert api.reap().realizations == 1
    assert api.campaign(campaign["id"])["state"] == "queued"  # running -> queued: nothing started any more
    api.claim(worker)
    clock.advance(api.settings.lease_s + 1)
    assert api.reap().realizations == 1
    assert api.realization(campaign["id"], 0)["state"] == "queued"


def plan_refused_rebuilt_and_exhausted(api: Api) -> None:
    """A ready plan refused and rebuilt; a build that fails for good fails the campaigns that need it."""
    worker = api.register("w4")
    api.create(name="refused", realizations=1)
    task = api.claim(worker)[0]
    body = {"task_id": task["task_id"], "checksum": task["plan"]["checksum"], "reason": "checksum mismatch"}
    assert api.wpost(f"/plans/{task['plan']['id']}/invalid", json=body).json()["state"] == "failed"
    assert api.fail(task["task_id"], "app_error", 3).status_code == 200
    rebuild = api.claim(worker)[0]
    assert rebuild["kind"] == "preprocess"  # failed -> building
    assert api.plan_built(rebuild["task_id"]).status_code == 200
    stranded = api.create(name="stranded", realizations=1, **{"resources.ranks": 4})
    build = api.claim(worker)[0]
    assert build["kind"] == "preprocess" and build["ranks"] == 4
    assert api.fail(build["task_id"], "app_error", 1).json()["state"] == "failed"  # building -> failed
    assert api.campaign(stranded["id"])["state"] == "failed"  # queued -> failed: its plan cannot be built
    assert api.post(f"/campaigns/{stranded['id']}/retry").json()["requeued"] == 1
    assert api.campaign(stranded["id"])["state"] == "queued"  # failed -> queued: nothing of it had started


def settle_a_campaign_that_a_claim_raced(api: Api) -> None:
    """A claim that read the campaign running while the reaper put it back to queued leaves it queued with a
    leased realisation; that realisation's success settles it straight to succeeded."""
    campaign = api.create(name="raced", realizations=1)
    with api.database.session() as session:
        session.execute(update(Realization).where(Realization.campaign_id == campaign["id"]).values(state="succeeded"))
        row = session.scalar(select(Campaign).where(Campaign.id == campaign["id"]))
        assert row is not None and row.state == "queued"
        settle_campaign(session=session, campaign=row)
        assert row.state == "succeeded"
        session.commit()


def realize_tasks(api: Api, worker: int, count: int) -> list[dict[str, Any]]:
    """``count`` realisation tasks; plan builds handed out on the way (for campaigns earlier scenarios left
    queued, whose plans the worker's site lacks) are reported built."""
    tasks: list[dict[str, Any]] = []
    for _ in range(20):
        for task in api.claim(worker, max_tasks=count - len(tasks)):
            if task["kind"] == "preprocess":
                assert api.plan_built(task["task_id"]).status_code == 200
            else:
                tasks.append(task)
        if len(tasks) == count:
            return tasks
    raise AssertionError(f"{len(tasks)} realisation tasks, not {count}")


def extend_a_finished_campaign(api: Api) -> None:
    """A succeeded campaign extended with one more realisation runs again, then succeeds again (priority 10:
    claimed before what earlier scenarios left queued)."""
    worker = api.register("w-extend", site="extend-site")
    campaign = api.create(name="extended", realizations=1, priority=10)
    assert api.succeed(realize_tasks(api, worker, 1)[0]).status_code == 200
    assert api.campaign(campaign["id"])["state"] == "succeeded"
    assert api.post(f"/campaigns/{campaign['id']}/extend", json={"realizations": 1}).json()["state"] == "running"
    assert api.succeed(realize_tasks(api, worker, 1)[0]).status_code == 200  # succeeded -> running -> succeeded
    assert api.campaign(campaign["id"])["state"] == "succeeded"


def hold_release_and_end(api: Api) -> None:
    """Fail fast: two alike failures hold a running campaign (K = 2); a retry releases it to queued (nothing
    of it running) or running (a realisation running); a held one is cancelled, or ends failed."""
    worker = api.register("w-hold", site="hold-site")

    def fail_two_alike(campaign_id: int, *, running: int = 0) -> list[dict[str, Any]]:
        tasks = realize_tasks(api, worker, 2 + running)
        for task in tasks[:2]:
            assert api.fail(task["task_id"]).status_code == 200
        assert api.campaign(campaign_id)["state"] == "held"  # running -> held
        return tasks[2:]

    released = api.create(name="held", realizations=3, max_attempts=2, hold_after_failures=2, priority=10)
    fail_two_alike(released["id"])
    assert api.post(f"/campaigns/{released['id']}/retry").json()["campaign"]["state"] == "queued"  # held -> queued
    fail_two_alike(released["id"])
    assert api.post(f"/campaigns/{released['id']}/cancel").json()["state"] == "cancelled"  # held -> cancelled

    running = api.create(name="held while running", realizations=3, max_attempts=1, hold_after_failures=2, priority=10)
    [still_running] = fail_two_alike(running["id"], running=1)
    assert api.post(f"/campaigns/{running['id']}/retry").json()["campaign"]["state"] == "running"  # held -> running
    again = api.create(name="held to the end", realizations=3, max_attempts=1, hold_after_failures=2, priority=10)
    assert api.succeed(still_running).status_code == 200
    for task in realize_tasks(api, worker, 2):  # the first campaign's two requeued realisations
        assert api.succeed(task).status_code == 200
    [last] = fail_two_alike(again["id"], running=1)
    assert api.succeed(last).status_code == 200
    assert api.campaign(again["id"])["state"] == "failed"  # held -> failed: nothing of it left to run


def test_the_service_performs_every_allowed_transition_and_no_other(make_api, clock, transitions):
    api = make_api(lease_s=60, max_plan_builds=1)
    succeed_and_retry(api)
    cancel(api)
    expire_leases(api, clock)
    plan_refused_rebuilt_and_exhausted(api)
    settle_a_campaign_that_a_claim_raced(api)
    extend_a_finished_campaign(api)
    hold_release_and_end(api)
    assert transitions <= allowed()  # advance() refuses the rest, so this holds by construction...
    assert allowed() - transitions == set()  # ...and every move in the table is one the code makes
