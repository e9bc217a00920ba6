"""Numbers past what the database stores (found by the schemathesis run of tests/reliability) are a 422, not a 500."""

from __future__ import annotations

import pytest

from tests.support.service_helpers import spec_data

HUGE = 17_543_098_791_419_197_440  # over 2**63 - 1: PostgreSQL's bigint and SQLite's INTEGER refuse it


@pytest.mark.parametrize(
    "method, path, token_kind, body",
    [
        ("GET", f"/campaigns/{HUGE}", "user", None),
        ("DELETE", f"/campaigns/{HUGE}", "user", None),
        ("POST", f"/campaigns/{HUGE}/retry", "user", None),
        ("GET", f"/campaigns/{HUGE}/realizations", "user", None),
        ("GET", f"/campaigns/{HUGE}/products", "user", None),
        ("GET", f"/plans/{HUGE}", "user", None),
        ("GET", f"/events/log?after={HUGE}", "user", None),
        ("GET", f"/events/log?campaign_id=-{HUGE}", "user", None),
        ("POST", f"/workers/{HUGE}/claim", "worker", {"max_tasks": 1}),
        ("POST", f"/workers/{HUGE}/heartbeat", "worker", {}),
    ],
)
def test_ids_past_the_database_range_are_refused_with_a_4xx(api, method, path, token_kind, body):
    api.create(realizations=1)
    token = api.alice if token_kind == "user" else api.alice_worker
    answer = api.request(method, path, token, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "out_of_range"
    # The session that hit the error was rolled back: the next request works.
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
