"""Numbers past what the database stores (found by the schemathesis run of tests/reliability) are a 422 naming the
parameter, not a 500 (nor a driver error)."""

from __future__ import annotations

import pytest

from tests.support.service_helpers import spec_data

HUGE = 17_543_098_791_419_197_440  # over 2**63 - 1: PostgreSQL's bigint and SQLite's INTEGER refuse it


@pytest.mark.parametrize(
    "method, path, token_kind, body, field",
    [
        ("GET", f"/campaigns/{HUGE}", "user", None, "campaign_id"),
        ("DELETE", f"/campaigns/{HUGE}", "user", None, "campaign_id"),
        ("POST", f"/campaigns/{HUGE}/retry", "user", None, "campaign_id"),
        ("GET", f"/campaigns/{HUGE}/realizations", "user", None, "campaign_id"),
        ("GET", f"/campaigns/1/realizations/{HUGE}", "user", None, "index"),
        ("GET", f"/campaigns/{HUGE}/products", "user", None, "campaign_id"),
        ("GET", f"/campaigns/1/products/realizations/{HUGE}/map", "user", None, "index"),
        ("GET", f"/plans/{HUGE}", "user", None, "plan_id"),
        ("GET", f"/events/log?after={HUGE}", "user", None, "after"),
        ("GET", f"/events/log?campaign_id=-{HUGE}", "user", None, "campaign_id"),
        ("GET", f"/events?after={HUGE}", "user", None, "after"),
        ("POST", f"/workers/{HUGE}/claim", "worker", {"max_tasks": 1}, "worker_id"),
        ("POST", f"/workers/{HUGE}/heartbeat", "worker", {}, "worker_id"),
    ],
)
def test_ids_past_the_database_range_are_a_422_naming_the_parameter(api, method, path, token_kind, body, field):
    api.create(realizations=1)
    token = api.alice if token_kind == "user" else api.alice_worker
    answer = api.request(method, path, token, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "invalid_request"
    [problem] = answer.json()["detail"]
    assert problem["loc"][-1] == field and problem["type"] in ("less_than_equal", "less_than", "greater_than_equal")
    # Nothing reached the database, and the next request works.
    assert api.post("/campaigns", json=spec_data(realizations=1)).status_code == 201


def test_an_exhausted_connection_pool_answers_503_busy_not_500(make_api):
    # Found by the 200-client load run: requests that waited the pool's timeout got a 500.
    from fastapi import FastAPI
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    def configure(app: FastAPI) -> None:
        @app.get("/pool-exhausted")
        def exhausted() -> None:
            raise PoolTimeout("QueuePool limit of size 10 overflow 10 reached")

    api = make_api(configure=configure)
    answer = api.client.get("/pool-exhausted")
    assert answer.status_code == 503 and answer.json()["code"] == "busy"
    assert answer.headers["Retry-After"] == "2"
