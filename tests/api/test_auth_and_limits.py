"""Tokens, ownership, token kinds, body limits, the catch-all error, health, metrics, OpenAPI."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from service.auth.models import ApiToken
from service.config import Settings
from service.migrate import head_revisions
from tests.support.service_helpers import spec_data


def test_tokens_are_required_and_stored_hashed(api):
    assert api.get("/campaigns", token="").status_code == 401
    answer = api.get("/campaigns", token="mcu_not-a-real-token")
    assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer"
    with api.database.session(write=False) as session:
        stored = list(session.scalars(select(ApiToken.token_hash)))
    assert api.alice not in stored and all(len(value) == 64 for value in stored)


def test_users_see_only_their_own_campaigns(api):
    campaign = api.create(realizations=2)
    cid = campaign["id"]
    for method, path in [
        ("GET", f"/campaigns/{cid}"),
        ("POST", f"/campaigns/{cid}/cancel"),
        ("POST", f"/campaigns/{cid}/retry"),
        ("DELETE", f"/campaigns/{cid}"),
        ("GET", f"/campaigns/{cid}/realizations"),
        ("GET", f"/campaigns/{cid}/realizations/0"),
        ("GET", f"/events/log?campaign_id={cid}"),
    ]:
        answer = api.request(method, path, api.bob)
        assert answer.status_code == 404, (method, path, answer.text)
    assert api.get("/campaigns", api.bob).json()["items"] == []
    assert api.campaign(cid)["state"] == "queued"  # bob's cancel changed nothing


def test_token_kinds_reach_only_their_endpoints(api):
    campaign = api.create(realizations=1)
    worker = api.register()
    for method, path in [
        ("GET", "/campaigns"),
        ("POST", "/campaigns"),
        ("GET", f"/campaigns/{campaign['id']}"),
        ("GET", "/plans"),
        ("GET", "/workers"),
        ("GET", "/events/log"),
    ]:
        assert api.request(method, path, api.alice_worker, json=spec_data()).status_code == 403, path
    for method, path, body in [
        ("POST", "/workers", {"name": "x", "site": "s", "host": "h"}),
        ("POST", f"/workers/{worker}/claim", {}),
        ("POST", f"/workers/{worker}/heartbeat", {}),
        ("POST", "/tasks/realize-1/started", {}),
        ("POST", "/tasks/realize-1/failed", {"failure_class": "oom"}),
    ]:
        answer = api.request(method, path, api.alice, json=body)
        assert answer.status_code == 403 and answer.json()["code"] == "wrong_token_kind", path
    # A worker id belongs to the token that registered it.
    assert api.wpost(f"/workers/{worker}/claim", api.bob_worker, json={}).status_code == 403
    assert api.wpost("/workers/999/claim", json={}).status_code == 404


def test_claims_and_heartbeats_check_the_token_in_their_own_statement_and_refuse_as_before(api):
    """A claim and a heartbeat check the token, lock the worker and record its heartbeat in one statement;
    whatever that does not find is refused by the ordinary checks, with their codes, and changes nothing."""
    from datetime import UTC, datetime

    from sqlalchemy import update

    from service.auth.models import ApiToken
    from service.auth.service import hash_token
    from service.workers.models import Worker

    api.create(realizations=2)
    worker = api.register()
    other = api.register("w2", token=api.bob_worker)

    def heartbeat_of(worker_id):
        with api.database.session(write=False) as session:
            return session.get(Worker, worker_id).last_heartbeat_at

    seen = heartbeat_of(worker)
    refusals = [
        (None, worker, 401, "missing_token"),
        ("mcw_not-a-token", worker, 401, "invalid_token"),
        (api.alice, worker, 403, "wrong_token_kind"),
        (api.bob_worker, worker, 403, "worker_token_mismatch"),
        (api.alice_worker, 999, 404, "worker_not_found"),
    ]
    for token, worker_id, status, code in refusals:
        for path, body in ((f"/workers/{worker_id}/claim", {"max_tasks": 1}), (f"/workers/{worker_id}/heartbeat", {})):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            answer = api.client.post(f"/api/v1{path}", json=body, headers=headers)
            assert (answer.status_code, answer.json()["code"]) == (status, code), (token, path, answer.text)
    assert heartbeat_of(worker) == seen
    assert api.campaign(api.get("/campaigns").json()["items"][0]["id"])["progress"]["counts"]["queued"] == 2

    assert [task["kind"] for task in api.claim(worker)] == ["preprocess"]
    assert heartbeat_of(worker) > seen
    with api.database.session() as session:  # a revoked token is refused at once
        session.execute(
            update(ApiToken).where(ApiToken.token_hash == hash_token(api.bob_worker)).values(revoked_at=datetime.now(UTC))
        )
        session.commit()
    for path in (f"/workers/{other}/claim", f"/workers/{other}/heartbeat"):
        answer = api.wpost(path, api.bob_worker, json={})
        assert (answer.status_code, answer.json()["code"]) == (401, "invalid_token"), path


def test_body_size_limit(make_api):
    api = make_api(max_json_body_bytes=4096)
    big = spec_data(description="x" * 3_990)
    answer = api.post("/campaigns", json=big)
    assert answer.status_code == 413 and answer.json()["code"] == "too_large"

    def chunks():
        yield b'{"name": "streamed", "description": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    streamed = api.post("/campaigns", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert api.get("/campaigns").json()["items"] == []


def test_unexpected_errors_answer_a_plain_500(make_api):
    def configure(app: FastAPI) -> None:
        @app.get("/boom")
        def boom() -> None:
            raise RuntimeError("secret internals: password=hunter2")

    api = make_api(configure=configure)
    answer = api.client.get("/boom")
    assert answer.status_code == 500
    assert answer.json() == {"detail": "internal server error", "code": "internal_error"}


def test_health_metrics_and_openapi(api):
    assert api.client.get("/healthz").json() == {
        "status": "ok",
        "database": api.database.dialect,
        "schema_revision": ",".join(sorted(head_revisions())),  # the newest migration
    }
    api.create(realizations=3)
    worker = api.register()
    api.build_plan(worker)
    api.claim(worker, max_tasks=2)
    text = api.client.get("/metrics").text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    states = {s.labels["state"]: s.value for s in families["mapcampaign_realizations"].samples}
    assert states["claimed"] == 2 and states["queued"] == 1
    claims = {s.labels["kind"]: s.value for s in families["mapcampaign_claims"].samples if s.name.endswith("_total")}
    assert claims == {"realize": 2, "preprocess": 1}
    assert "mapcampaign_lease_expiries" in families
    latency = families["mapcampaign_http_request_duration_seconds"]
    routes = {s.labels["route"] for s in latency.samples}
    assert "/api/v1/workers/{worker_id}/claim" in routes
    schema = api.client.get("/api/v1/openapi.json").json()
    assert "/api/v1/campaigns" in schema["paths"] and "/api/v1/tasks/{task_id}/artifacts/{name}" in schema["paths"]
    assert {"PreprocessTask", "RealizeTask", "HeartbeatAnswer"} <= set(schema["components"]["schemas"])


def test_metrics_are_open_by_default_and_need_the_scrape_token_when_one_is_set(api, make_api):
    assert api.client.get("/metrics").status_code == 200  # unset: as before, for a scraper with no credentials

    scrape_token = "s" * 40
    guarded = make_api(metrics_token=scrape_token)
    for headers, code in (
        ({}, "missing_token"),
        ({"Authorization": "Bearer " + "t" * 40}, "invalid_token"),
        ({"Authorization": f"Basic {scrape_token}"}, "missing_token"),
        ({"Authorization": f"Bearer {guarded.alice}"}, "invalid_token"),  # a user token is not the scrape token
    ):
        answer = guarded.client.get("/metrics", headers=headers)
        assert answer.status_code == 401 and answer.json()["code"] == code, (headers, answer.text)
        assert answer.headers["www-authenticate"] == "Bearer" and "mapcampaign_" not in answer.text
    answer = guarded.client.get("/metrics", headers={"Authorization": f"Bearer {scrape_token}"})
    assert answer.status_code == 200
    assert "mapcampaign_realizations" in {family.name for family in text_string_to_metric_families(answer.text)}
    assert guarded.client.get("/healthz").status_code == 200  # the health check stays open for probes


def test_a_short_metrics_token_is_refused_at_start():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="metrics_token"):
        Settings(metrics_token="short")


def test_api_docs_page_uses_the_services_own_swagger_files(api):
    page = api.client.get("/api/v1/docs")
    assert page.status_code == 200
    assert "cdn." not in page.text and "/api/v1/openapi.json" in page.text
    for asset in ("/apidocs/swagger-ui-bundle.js", "/apidocs/swagger-ui.css"):
        assert asset in page.text
        answer = api.client.get(asset)
        assert answer.status_code == 200 and len(answer.content) > 10_000, asset
