"""Security against the live service on PostgreSQL: hashed tokens, ownership, token kinds, escaping, loopback.

Issue 10, part 4. The API-level checks of tests/api run in-process; these go through the real
``mapcampaign serve`` subprocess, its log and its database rows.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from tests.reliability.conftest import row_counts
from tests.support.databases import on_database
from tests.support.fake_worker import FakeWorker
from tests.support.figures import record
from tests.support.live_service import REPO, free_port, mapcampaign_command, service_env
from tests.support.service_helpers import spec_data

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]


def test_tokens_are_stored_hashed_and_never_logged(make_pg_service, pg_url):
    # Debug logging: the most the service ever writes, so a token in any log line would show.
    service = make_pg_service(env={"MAPCAMPAIGN_LOG_LEVEL": "debug"})
    user_token, worker_token = service.user_token, service.worker_token
    with service.client(user_token) as user, service.client(worker_token) as worker_client:
        assert user.post("/campaigns", json=spec_data(realizations=1)).status_code == 201
        assert user.get("/campaigns").status_code == 200
        assert worker_client.post("/workers", json={"name": "w", "site": "local", "host": "h"}).status_code == 200
        # A mistyped token and a token of the wrong kind: error paths must not echo it either.
        assert httpx.get(service.api_url + "/campaigns", headers={"Authorization": f"Bearer {user_token}x"}).status_code == 401
        assert worker_client.get("/campaigns").status_code == 403
    with psycopg.connect(pg_url, autocommit=True) as connection:
        rows = connection.execute("SELECT * FROM api_tokens").fetchall()
    assert len(rows) == 2
    for token in (user_token, worker_token):
        stored = [row for row in rows if hashlib.sha256(token.encode()).hexdigest() in row]
        assert len(stored) == 1, "each token is found by its SHA-256 only"
        assert not any(isinstance(value, str) and token in value for row in rows for value in row)
        assert token[:8] in stored[0]  # the short prefix kept to tell tokens apart is not the token
    service.stop()  # flush the log
    log = service.log_path.read_text(errors="replace")
    assert "/api/v1/campaigns" in log  # the log did record these requests
    for token in (user_token, worker_token):
        assert token not in log
        assert token[8:24] not in log  # not even a piece past the public prefix


def test_login_link_secrets_stay_out_of_the_access_log(make_pg_service):
    """uvicorn logs each request line with its query string; a login link's secret and a token passed as a
    query parameter are written as [redacted] while the request itself is still logged."""
    service = make_pg_service(env={"MAPCAMPAIGN_LOG_LEVEL": "info"})  # info: uvicorn's access log is on
    env = {**service.env, "MAPCAMPAIGN_SERVER": service.url, "MAPCAMPAIGN_TOKEN": service.user_token}
    made = subprocess.run(
        mapcampaign_command("login", "--json"), env=env, capture_output=True, text=True, check=True, timeout=120
    )
    link = json.loads(made.stdout)["url"]
    secret = link.split("secret=")[1]
    with httpx.Client(timeout=30) as browser:
        page = browser.get(link)
        assert page.status_code == 200
        form_token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
        logged_in = browser.post(
            service.url + "/login/link",
            data={"secret": secret, "csrf_token": form_token},
            headers={"Origin": service.url},
        )
        assert logged_in.status_code == 303 and "mapcampaign_session" in browser.cookies
        assert browser.get(f"{service.api_url}/campaigns?token={service.user_token}").status_code == 401
    service.stop()  # flush the log
    log = service.log_path.read_text(errors="replace")
    assert '"GET /login/link?secret=[redacted] HTTP/1.1" 200' in log
    assert '"POST /login/link HTTP/1.1" 303' in log
    assert '"GET /api/v1/campaigns?token=[redacted] HTTP/1.1" 401' in log
    for value in (secret, secret[4:20], service.user_token, service.user_token[8:24]):
        assert value not in log


def test_users_cannot_see_touch_or_download_each_others_campaigns(make_pg_service, pg_url):
    service = make_pg_service()
    bob_token = service.create_token("bob")
    with service.client(service.user_token) as alice:
        campaign = alice.post("/campaigns", json=spec_data(name="alice's", realizations=2)).json()
    worker = FakeWorker(service.api_url, service.worker_token, name="w-sec")
    try:
        worker.build_plan()
        task = worker.claim_one()
        worker.start(task)
        worker.succeed(task)  # a stored product: something real to try to download
    finally:
        worker.close()
    cid, missing = campaign["id"], campaign["id"] + 1000
    paths = [
        ("GET", "/campaigns/{id}"),
        ("GET", "/campaigns/{id}/realizations"),
        ("GET", "/campaigns/{id}/realizations/0"),
        ("POST", "/campaigns/{id}/cancel"),
        ("POST", "/campaigns/{id}/retry"),
        ("DELETE", "/campaigns/{id}"),
        ("GET", "/campaigns/{id}/products"),
        ("GET", "/campaigns/{id}/products/spectra"),
        ("GET", "/campaigns/{id}/products/mean-map"),
        ("GET", "/campaigns/{id}/products/variance-map"),
        ("GET", "/campaigns/{id}/products/mask"),
        ("GET", "/campaigns/{id}/products/realizations/0/map"),
        ("GET", "/campaigns/{id}/products/realizations/0/spectra"),
        ("GET", "/campaigns/{id}/products/realizations/0/mask"),
    ]
    before = row_counts(pg_url)
    with service.client(bob_token) as bob, service.client(service.user_token) as alice:
        for method, template in paths:
            theirs = bob.request(method, template.format(id=cid))
            nobodys = bob.request(method, template.format(id=missing))
            # Someone else's campaign looks exactly like one that does not exist: no existence leak.
            assert theirs.status_code == nobodys.status_code == 404, (method, template, theirs.text)
            assert theirs.json()["code"] == nobodys.json()["code"]
        assert bob.get("/campaigns").json()["items"] == []
        assert bob.get("/events/log", params={"campaign_id": cid}).status_code == 404
        # Alice still has everything: bob's cancel, retry and delete did nothing.
        assert alice.get(f"/campaigns/{cid}").json()["state"] == "running"
        assert alice.get(f"/campaigns/{cid}/products/realizations/{task['realization']}/map").status_code == 200
    assert row_counts(pg_url) == before

    # The dashboard too: bob's session gets a 404 page for alice's campaign and product files.
    with httpx.Client(base_url=service.url, headers={"Origin": service.url}) as browser:
        assert browser.post("/login", data={"token": bob_token}).status_code in (302, 303)
        for path in (f"/campaigns/{cid}", f"/campaigns/{cid}/realizations/{task['realization']}/products/map_iqu.fits"):
            assert browser.get(path).status_code == 404, path


def test_token_kinds_cannot_cross(make_pg_service, pg_url):
    service = make_pg_service()
    with service.client(service.worker_token) as worker, service.client(service.user_token) as user:
        before = row_counts(pg_url)
        answer = worker.post("/campaigns", json=spec_data(realizations=1))
        assert answer.status_code == 403 and answer.json()["code"] == "wrong_token_kind"
        assert user.post("/workers", json={"name": "u", "site": "local", "host": "h"}).status_code == 403
        assert row_counts(pg_url) == before  # nothing made by either
        worker_id = worker.post("/workers", json={"name": "w", "site": "local", "host": "h"}).json()["id"]
        assert user.post("/campaigns", json=spec_data(realizations=1)).status_code == 201
        claimed = user.post(f"/workers/{worker_id}/claim", json={"max_tasks": 1})
        assert claimed.status_code == 403 and claimed.json()["code"] == "wrong_token_kind"
        with psycopg.connect(pg_url, autocommit=True) as connection:
            states = {row[0] for row in connection.execute("SELECT state FROM realizations")}
            plans = connection.execute("SELECT count(*) FROM preprocessing_plans").fetchone()[0]
        assert states == {"queued"} and plans == 0  # the user's claim handed out nothing


def listening_addresses(pid: int) -> set[str]:
    found = set()
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        for connection in process.net_connections(kind="inet"):
            if connection.status == psutil.CONN_LISTEN:
                found.add(connection.laddr.ip)
    return found


@pytest.mark.parametrize("host", [None, "0.0.0.0"], ids=["default", "told-otherwise"])
def test_serve_listens_on_loopback_unless_told(tmp_path: Path, host: str | None):
    port = free_port()
    env = service_env(tmp_path / "data", port, None, None)
    del env["MAPCAMPAIGN_HOST"]  # the default, as a user gets it
    args = ["serve"] + (["--host", host] if host else [])
    process = subprocess.Popen(
        mapcampaign_command(*args), env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        addresses: set[str] = set()
        while not addresses and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
            addresses = listening_addresses(process.pid)
        assert addresses == ({"127.0.0.1"} if host is None else {host}), addresses
        record("security", f"mapcampaign serve ({'default' if host is None else '--host ' + host}) listens on {sorted(addresses)}")
    finally:
        process.terminate()
        process.wait(timeout=30)


HOSTILE_NAMES = [
    "<script>window.__pwned='script'</script>",
    "<img src=x onerror=\"window.__pwned='img'\">",
    "evil <b onmouseover=\"window.__pwned='b'\">x</b> \u05e9\u05dc\u05d5\u05dd",
]


@pytest.mark.browser
@on_database("postgresql")
def test_dashboard_renders_hostile_names_as_text(dash, page):
    campaigns = [dash.create_campaign(name=name, realizations=1) for name in HOSTILE_NAMES]
    dash.login(page)
    listed = page.locator("a.campaign-name").all_text_contents()
    assert sorted(listed) == sorted(HOSTILE_NAMES)
    for campaign, name in zip(campaigns, HOSTILE_NAMES):
        page.goto(dash.url + f"/campaigns/{campaign['id']}")
        assert page.text_content("#campaign-name") == name
        page.hover("#campaign-name")
        assert page.evaluate("() => window.__pwned") is None
        assert page.evaluate("() => document.querySelectorAll('img[src=x], [onerror], [onmouseover]').length") == 0
    record("security", f"dashboard: {len(HOSTILE_NAMES)} hostile campaign names rendered as text in Chromium, no script ran")
