"""A real ``mapcampaign serve`` subprocess: embedded tokens, SSE, the background reaper, concurrent claims."""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx

from tests.support.databases import on_database
from tests.support.live_service import REPO, start_live_service
from tests.support.service_helpers import spec_data
from tests.support.worker_helpers import wait_for


def read_events(lines: Iterator[str], count: int) -> list[dict]:
    """The next ``count`` SSE messages from the lines of an open stream, as {id, event, data}."""
    events, current = [], {}
    for line in lines:
        if line == "":
            if "data" in current:
                events.append(current)
                if len(events) == count:
                    return events
            current = {}
        elif line.startswith((":", "retry:")):
            continue
        else:
            key, _, value = line.partition(": ")
            current[key] = json.loads(value) if key == "data" else value
    raise AssertionError(f"the stream ended after {len(events)} events")


def build_plan(client: httpx.Client) -> int:
    worker = client.post("/workers", json={"name": "builder", "site": "local", "host": "h"}).json()["id"]
    task = client.post(f"/workers/{worker}/claim", json={"max_tasks": 1}).json()["tasks"][0]
    assert task["kind"] == "preprocess"
    built = client.post(
        f"/tasks/{task['task_id']}/plan-built", json={"path": "/p", "checksum": "c", "size_bytes": 1, "build_time_s": 1}
    )
    assert built.status_code == 200
    return worker


def test_embedded_default_makes_local_tokens(tmp_path):
    service = start_live_service(tmp_path / "embedded")
    try:
        for name in ("local-user.token", "local-worker.token"):
            mode = (tmp_path / "embedded" / "tokens" / name).stat().st_mode
            assert stat.S_IMODE(mode) == 0o600
        assert "local-user.token" in service.log_path.read_text()
        with service.client(service.user_token) as user, service.client(service.worker_token) as worker:
            assert user.get("/campaigns").status_code == 200
            assert worker.get("/campaigns").status_code == 403
            assert worker.post("/workers", json={"name": "w", "site": "local", "host": "h"}).status_code == 200
        extra = service.create_token("carol")
        with service.client(extra) as carol:
            assert carol.get("/campaigns").json()["items"] == []
    finally:
        service.stop()
    again = start_live_service(tmp_path / "embedded")  # second start: same tokens, nothing re-made
    try:
        assert again.user_token == service.user_token
    finally:
        again.stop()


def test_sse_stream_delivers_events_and_resumes(live_service):
    with live_service.client(live_service.user_token, timeout=20) as user:
        with user.stream("GET", "/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.iter_lines()
            next(lines)  # the stream is open: later events will be in it
            campaign = user.post("/campaigns", json=spec_data(realizations=2)).json()
            user.post(f"/campaigns/{campaign['id']}/cancel", json={"reason": "test"})
            first, second = read_events(lines, 2)
        assert (first["event"], first["data"]["state"], first["data"]["campaign_id"]) == (
            "campaign",
            "queued",
            campaign["id"],
        )
        assert int(second["id"]) > int(first["id"])
        # Resume after the first event: the second comes first.
        with user.stream(
            "GET", "/events", params={"campaign_id": campaign["id"]}, headers={"Last-Event-ID": first["id"]}
        ) as resumed:
            assert read_events(resumed.iter_lines(), 1)[0]["id"] == second["id"]
        log = user.get("/events/log", params={"after": 0, "campaign_id": campaign["id"]}).json()
        assert [event["id"] for event in log][:2] == [int(first["id"]), int(second["id"])]
        assert user.get("/events", params={"campaign_id": 424242}).status_code == 404


def test_background_reaper_requeues_expired_leases(make_live_service):
    service = make_live_service(env={"MAPCAMPAIGN_LEASE_S": "0.5", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.2"})
    with service.client(service.user_token) as user, service.client(service.worker_token) as worker:
        campaign = user.post("/campaigns", json=spec_data(realizations=1)).json()
        worker_id = build_plan(worker)
        task = worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 1}).json()["tasks"][0]
        wait_for(
            lambda: user.get(f"/campaigns/{campaign['id']}/realizations/0").json()["state"] == "queued",
            60,
            "the reaper to requeue the expired lease",
        )
        history = user.get(f"/campaigns/{campaign['id']}/realizations/0").json()["attempt_history"]
        assert history[0]["failure_class"] == "lost_worker"
        assert worker.post(f"/tasks/{task['task_id']}/started").status_code == 409


def test_concurrent_claims_hand_out_each_realisation_once(live_service, tmp_path):
    total, claimers = 2000, 4
    with live_service.client(live_service.user_token) as user, live_service.client(live_service.worker_token) as w:
        campaign = user.post("/campaigns", json=spec_data(realizations=total)).json()
        build_plan(w)
    outputs = [tmp_path / f"claims-{n}.jsonl" for n in range(claimers)]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.claimer",
                live_service.api_url,
                live_service.worker_token,
                f"claimer-{n}",
                str(outputs[n]),
                str(n),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        for n in range(claimers)
    ]
    for process in processes:
        assert process.wait(timeout=600) == 0
    claims = [json.loads(line) for path in outputs for line in path.read_text().splitlines()]
    handed_out = [(c["campaign_id"], c["realization"]) for c in claims if c["kind"] == "realize"]
    assert len(handed_out) == total and len(set(handed_out)) == total
    assert set(handed_out) == {(campaign["id"], index) for index in range(total)}
    assert len({c["task_id"] for c in claims}) == len(claims)
    assert all(path.read_text() for path in outputs), "every claimer should have won some claims"
    with live_service.client(live_service.user_token) as user:
        counts = user.get(f"/campaigns/{campaign['id']}").json()["progress"]["counts"]
    assert counts["claimed"] == total and counts["queued"] == 0


@on_database("sqlite")
def test_behind_a_tls_proxy_the_dashboard_believes_forwarded_headers_only_when_told(make_live_service):
    """The browser's Origin is the proxy's https:// address; the API sees plain HTTP from the proxy. Only with
    MAPCAMPAIGN_FORWARDED_ALLOW_IPS does it take the scheme from X-Forwarded-Proto, so the login is same-origin."""
    from_proxy = {"Host": "mapcampaign.example.org", "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    from_proxy["Origin"] = "https://mapcampaign.example.org"
    for forwarded_allow_ips, expected in ((None, 403), ("127.0.0.1", 303)):
        env = {"MAPCAMPAIGN_FORWARDED_ALLOW_IPS": forwarded_allow_ips} if forwarded_allow_ips else {}
        service = make_live_service(env=env)
        answer = httpx.post(
            service.url + "/login", data={"token": service.user_token}, headers=from_proxy, follow_redirects=False
        )
        assert answer.status_code == expected, answer.text[:300]
        service.stop()


def test_an_idle_connection_outlives_a_clients_own_keep_alive_limit(tmp_path):
    """A client reuses a connection idle up to its own limit (httpx's, which the CLI and workers use: 5 s);
    the server must not be closing it then. At uvicorn's default (5 s, the same) the server closed such
    connections as the next request arrived: under load, readers stalled ~5 s got "Server disconnected
    without sending a response" (tests/reliability/test_load.py), and nginx's pooled upstream connections
    (60 s) would have met the same race as 502s."""
    client_limit_s = httpx.Limits().keepalive_expiry
    assert client_limit_s is not None
    service = start_live_service(tmp_path / "embedded")
    address = urlsplit(service.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request("GET", "/healthz")
        first = connection.getresponse()
        first.read()
        socket_used = connection.sock.getsockname()
        time.sleep(client_limit_s + 0.5)  # the idle time under test, not a wait for an event
        connection.request("GET", "/healthz")  # http.client reconnects only when it closed the socket itself
        second = connection.getresponse()
        second.read()
        assert (first.status, second.status) == (200, 200)
        assert connection.sock.getsockname() == socket_used  # the same connection answered
    finally:
        connection.close()
        service.stop()
