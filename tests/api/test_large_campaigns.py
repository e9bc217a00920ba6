"""Campaigns of the largest size the spec allows: every bulk change is one bounded statement.

psycopg refuses a statement of more than 65,535 bind parameters; a change that listed a
campaign's realisation ids failed past that size, and failed for ever (it was answered 503).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.exc import DBAPIError

from schemas.spec import MAX_REALIZATIONS
from schemas.states import UNFINISHED_REALIZATION_STATES
from service.campaigns.models import Attempt, Realization
from service.errors import retry_can_succeed

LARGEST = MAX_REALIZATIONS  # 100,000: past psycopg's 65,535 bind parameters


def unfinished_realizations(api: Any) -> int:
    with api.database.session(write=False) as session:
        return session.scalar(
            select(func.count()).select_from(Realization).where(Realization.state.in_(UNFINISHED_REALIZATION_STATES))
        )


def open_attempts(api: Any) -> int:
    with api.database.session(write=False) as session:
        return session.scalar(select(func.count()).select_from(Attempt).where(Attempt.ended_at.is_(None)))


def started_campaign(api: Any) -> tuple[dict[str, Any], int, list[dict[str, Any]]]:
    """A campaign of LARGEST realisations, three of them claimed (open attempts), the rest queued."""
    campaign = api.create(realizations=LARGEST)
    worker = api.register()
    api.build_plan(worker)
    claimed = api.claim(worker, max_tasks=3)
    assert [task["kind"] for task in claimed] == ["realize"] * 3
    return campaign, worker, claimed


def test_a_campaign_of_the_largest_size_is_cancelled_and_deleted(api):
    campaign, worker, claimed = started_campaign(api)
    assert unfinished_realizations(api) == LARGEST and open_attempts(api) == 3

    cancelled = api.post(f"/campaigns/{campaign['id']}/cancel", json={"reason": "too big"})
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["progress"]["counts"]["cancelled"] == LARGEST
    assert unfinished_realizations(api) == 0 and open_attempts(api) == 0
    beat = api.wpost(f"/workers/{worker}/heartbeat", json={"running": [task["task_id"] for task in claimed]})
    assert sorted(beat.json()["cancel"]) == sorted(task["task_id"] for task in claimed)

    deleted = api.request("DELETE", f"/campaigns/{campaign['id']}", api.alice)
    assert deleted.status_code == 204, deleted.text
    assert api.get(f"/campaigns/{campaign['id']}").status_code == 404
    with api.database.session(write=False) as session:
        assert session.scalar(select(func.count()).select_from(Realization)) == 0


def test_a_campaign_of_the_largest_size_fails_whole_when_its_plan_runs_out_of_builds(make_api):
    api = make_api(max_plan_builds=1)
    campaign = api.create(realizations=LARGEST)
    worker = api.register()
    build = api.claim(worker)[0]
    assert build["kind"] == "preprocess"
    assert api.fail(build["task_id"], "app_error", 1).status_code == 200
    failed = api.campaign(campaign["id"])
    assert failed["state"] == "failed" and "preprocessing" in failed["failure_cause"]
    assert failed["progress"]["counts"]["failed"] == LARGEST
    assert unfinished_realizations(api) == 0


def test_a_heartbeat_naming_more_tasks_than_a_statement_binds_is_answered(make_api):
    api = make_api(max_json_body_bytes=4 << 20)  # 70,000 task ids pass the default 1 MiB
    campaign, worker, claimed = started_campaign(api)
    running = [task["task_id"] for task in claimed] + [f"realize-{n}" for n in range(10**6, 10**6 + 70_000)]
    beat = api.wpost(f"/workers/{worker}/heartbeat", json={"running": running})
    assert beat.status_code == 200, beat.text
    assert sorted(beat.json()["extended"]) == sorted(task["task_id"] for task in claimed)
    assert len(beat.json()["cancel"]) == 70_000  # attempts the service does not know: stop them
    assert api.campaign(campaign["id"])["progress"]["counts"]["claimed"] == 3


def refused_statement_route(app: FastAPI) -> None:
    """``GET /refused``: a statement the database refuses every time (a missing table)."""

    @app.get("/refused")
    def refused() -> None:
        with app.state.database.session() as session:
            session.execute(text("SELECT * FROM no_such_table"))


def test_a_statement_the_database_refuses_is_a_500_not_a_503_to_retry(make_api):
    api = make_api(configure=refused_statement_route)
    answer = api.client.get("/refused")
    assert answer.status_code == 500 and answer.json()["code"] == "internal_error"


def lock_timeout(database_url: str) -> DBAPIError:
    """The error of a statement that waited past its lock timeout for a row another transaction holds."""
    if database_url.startswith("sqlite"):
        engine = create_engine(database_url, connect_args={"timeout": 0.01})
        lock, wait = "BEGIN IMMEDIATE", "BEGIN IMMEDIATE"
    else:
        engine = create_engine(database_url)
        lock, wait = "BEGIN; LOCK TABLE workers", "SET lock_timeout = '10ms'; SELECT * FROM workers"
    try:
        with engine.connect() as holder, engine.connect() as waiter:
            holder.exec_driver_sql(lock)
            with pytest.raises(DBAPIError) as caught:
                waiter.exec_driver_sql(wait)
            holder.exec_driver_sql("ROLLBACK")
        return caught.value
    finally:
        engine.dispose()


def test_a_lock_timeout_is_temporary_a_refused_statement_is_not(database_url):
    assert retry_can_succeed(lock_timeout(database_url))
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection, pytest.raises(DBAPIError) as caught:
            connection.exec_driver_sql("SELECT * FROM no_such_table")
    finally:
        engine.dispose()
    assert not retry_can_succeed(caught.value)
