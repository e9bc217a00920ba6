"""The dashboard's server side, in process (no browser): session cookie, CSRF, isolation, escaping,
query counts, quick-look cache, the products hook, and that nothing is loaded from the network."""

from __future__ import annotations

import hashlib
import re
import stat
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from schemas.api import ARTIFACT_SHA256_HEADER
from service.auth.models import ApiToken
from service.auth.service import Principal
from service.auth.session import COOKIE_NAME, load_session_key, make_cookie, read_cookie
from service.dashboard import panels, quicklook
from service.dashboard.router import STATIC_DIR, TEMPLATES_DIR
from tests.support.databases import statements_sent
from tests.support.fake_worker import iqu_map_fits

CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]*)">')


def login(api, token: str | None = None):
    api.client.cookies.clear()
    answer = api.client.post("/login", data={"token": token or api.alice, "next": "/"}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    return answer


def csrf_of(api, path: str = "/") -> str:
    return CSRF_META.search(api.client.get(path).text).group(1)


def running_campaign(api, realizations: int = 4, **changes):
    campaign = api.create(realizations=realizations, **changes)
    worker = api.register()
    api.build_plan(worker)
    return campaign, worker


def succeed_with_map(api, task) -> None:
    from tests.support.service_helpers import product

    payload = iqu_map_fits()
    upload = api.client.put(
        f"/api/v1/tasks/{task['task_id']}/artifacts/map_iqu.fits",
        content=payload,
        headers={
            "Authorization": f"Bearer {api.alice_worker}",
            ARTIFACT_SHA256_HEADER: hashlib.sha256(payload).hexdigest(),
        },
    )
    assert upload.status_code == 201, upload.text
    record = product("map_iqu.fits", payload)
    record["name"] = "iqu"
    assert api.succeed(task, products=[record]).status_code == 200


# --------------------------------------------------------------------------- session


def test_login_sets_a_signed_httponly_lax_cookie_and_logout_clears_it(api):
    assert api.client.get("/", follow_redirects=False).headers["location"] == "/login?next=%2F"
    answer = login(api)
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=") and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert "Path=/" in cookie and "Secure" not in cookie and "Max-Age=43200" in cookie
    assert api.alice not in cookie
    page = api.client.get("/")
    assert page.status_code == 200 and "alice" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'; script-src 'self'")
    assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
    logout = api.client.post("/logout", data={"csrf_token": csrf_of(api)}, follow_redirects=False)
    assert logout.status_code == 303 and logout.headers["location"] == "/login?notice=logged-out"
    assert f'{COOKIE_NAME}=""' in logout.headers["set-cookie"] and "Max-Age=0" in logout.headers["set-cookie"]
    api.client.cookies.clear()
    assert api.client.get("/ui/workers").status_code == 401


def test_secure_cookie_when_configured(make_api):
    api = make_api(cookie_secure=True, session_max_age_s=600)
    cookie = login(api).headers["set-cookie"]
    assert "Secure" in cookie and "Max-Age=600" in cookie


def test_worker_and_unknown_tokens_cannot_log_in(api):
    for token, message in ((api.alice_worker, "worker token"), ("mcu_nope", "unknown or revoked"), ("", "unknown")):
        answer = api.client.post("/login", data={"token": token}, follow_redirects=False)
        assert answer.status_code == 401 and message in answer.text
        assert COOKIE_NAME not in answer.headers.get("set-cookie", "")


def test_tampered_expired_and_revoked_sessions_are_refused(api):
    login(api)
    good = api.client.cookies[COOKIE_NAME]
    body, mac = good.split(".")
    for forged in (body + "." + mac[:-2] + ("AA" if mac[-2:] != "AA" else "BB"), body[:-1] + "x." + mac, "garbage"):
        api.client.cookies.set(COOKIE_NAME, forged)
        assert api.client.get("/", follow_redirects=False).status_code == 303
    key = load_session_key(api.settings)
    payload = read_cookie(key, good)
    principal = Principal(user_id=payload["u"], user_name="alice", token_id=payload["t"], kind="user")
    expired = make_cookie(key, principal=principal, max_age_s=60, now=time.time() - 3600)
    assert read_cookie(key, expired) is None
    api.client.cookies.set(COOKIE_NAME, good)
    assert api.client.get("/", follow_redirects=False).status_code == 200
    with api.database.session() as session:  # revoking the token ends the sessions made with it
        session.execute(update(ApiToken).where(ApiToken.id == payload["t"]).values(revoked_at=datetime.now(UTC)))
        session.commit()
    assert api.client.get("/", follow_redirects=False).status_code == 303


def test_session_key_file_is_made_once_and_private(api):
    login(api)
    path = api.settings.session_key_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_text()
    login(api)
    assert path.read_text() == first


def test_posts_need_the_page_csrf_token_and_this_origin(api):
    campaign, _ = running_campaign(api)
    login(api)
    token = csrf_of(api)
    for data, headers in (
        ({}, {}),
        ({"csrf_token": "forged"}, {}),
        ({"csrf_token": token}, {"Origin": "https://evil.example"}),
        ({"csrf_token": token}, {"Origin": "null"}),
        ({"csrf_token": token}, {"Referer": "https://evil.example/page"}),
    ):
        answer = api.client.post(f"/campaigns/{campaign['id']}/cancel", data=data, headers=headers)
        assert answer.status_code == 403, (data, headers)
    assert api.campaign(campaign["id"])["state"] == "queued"
    answer = api.client.post(
        f"/campaigns/{campaign['id']}/cancel",
        data={"csrf_token": token, "reason": "by hand"},
        headers={"Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert answer.status_code == 303 and answer.headers["location"].endswith("?notice=cancelled")
    assert api.campaign(campaign["id"])["cancel_reason"] == "by hand"
    # A login form posted from another site is refused too (login CSRF).
    api.client.cookies.clear()
    cross = api.client.post("/login", data={"token": api.alice}, headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403


def test_login_redirects_only_within_the_site(api):
    for target, expected in (
        ("/campaigns/3", "/campaigns/3"),
        ("//evil.example/x", "/"),
        ("https://evil.example", "/"),
        ("/\\evil.example", "/"),
    ):
        api.client.cookies.clear()
        answer = api.client.post("/login", data={"token": api.alice, "next": target}, follow_redirects=False)
        assert answer.headers["location"] == expected, target


# --------------------------------------------------------------------------- isolation and escaping


def test_another_users_campaign_is_404_everywhere(api):
    campaign, worker = running_campaign(api)
    task = api.claim(worker)[0]
    succeed_with_map(api, task)
    login(api, api.bob)
    base = f"/campaigns/{campaign['id']}"
    for path in (
        base,
        f"{base}/realizations/0",
        f"{base}/realizations/0/maps/I.png",
        f"{base}/realizations/0/products/map_iqu.fits",
    ):
        answer = api.client.get(path)
        assert answer.status_code == 404 and answer.headers["content-type"].startswith("text/html"), path
    for path in (
        f"/ui{base}/status",
        f"/ui{base}/grid",
        f"/ui{base}/results",
        f"/ui/events?campaign_id={campaign['id']}",
    ):
        assert api.client.get(path).status_code == 404, path
    assert api.client.get(f"/ui/overview?ids={campaign['id']}").json() == []
    token = csrf_of(api)
    for action in ("cancel", "retry"):
        assert api.client.post(f"{base}/{action}", data={"csrf_token": token}).status_code == 404
    # The owner reaches all of it.
    login(api)
    assert api.client.get(f"{base}/realizations/0/maps/Q.png").headers["content-type"] == "image/png"
    assert api.client.get(f"{base}/realizations/0/products/map_iqu.fits").content == iqu_map_fits()
    assert api.client.get(f"{base}/realizations/0/products/other.fits").status_code == 404
    assert api.client.get(f"{base}/realizations/0/maps/X.png").status_code == 404


def test_an_id_past_the_database_range_is_a_422_page_naming_the_parameter(api):
    login(api)
    for path, field in (("/campaigns/99999999999999999999", "campaign_id"), ("/campaigns/1/realizations/-1", "index")):
        answer = api.client.get(path)
        assert answer.status_code == 422 and answer.headers["content-type"].startswith("text/html"), path
        assert field in answer.text, answer.text
    assert api.client.get("/ui/campaigns/99999999999999999999/status").json()["code"] == "invalid_request"


def test_pages_escape_user_strings(api):
    name = '<script>alert(1)</script>" onmouseover="alert(2)" \'><img src=x onerror=alert(3)>'
    campaign, worker = running_campaign(api, name=name)
    task = api.claim(worker)[0]
    api.wpost(
        f"/tasks/{task['task_id']}/failed",
        json={"failure_class": "app_error", "log_tail": "</pre><script>x()</script>"},
    )
    login(api)
    for path in ("/", f"/campaigns/{campaign['id']}", f"/campaigns/{campaign['id']}/realizations/0"):
        html = api.client.get(path).text
        assert "<script>alert" not in html and "<img src=x" not in html and "<script>x()" not in html, path
        assert 'onmouseover="alert' not in html, path
    html = api.client.get(f"/campaigns/{campaign['id']}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34; onmouseover=&#34;alert(2)&#34;" in html
    status = api.client.get(f"/ui/campaigns/{campaign['id']}/status").json()
    assert status["failures"]["recent"][0]["last_line"] == "</pre><script>x()</script>"  # JSON; drawn with textContent


# --------------------------------------------------------------------------- queries


def test_overview_and_campaign_page_queries_do_not_grow_with_size(api):
    login(api)
    api.create(realizations=2)
    with statements_sent(api.database.engine) as few:
        assert api.client.get("/").status_code == 200
    for _ in range(8):
        api.create(realizations=30)
    with statements_sent(api.database.engine) as many:
        assert api.client.get("/").status_code == 200
    assert len(many) == len(few), "the overview makes more queries for more campaigns"

    small, worker = running_campaign(api, realizations=3)
    for task in api.claim(worker, max_tasks=2):
        assert api.succeed(task).status_code == 200
    big = api.create(realizations=400)
    for task in api.claim(worker, max_tasks=40):
        if task["campaign_id"] == big["id"]:
            assert api.succeed(task).status_code == 200
    for campaign in (small, big):
        for path in (
            f"/campaigns/{campaign['id']}",
            f"/ui/campaigns/{campaign['id']}/status",
            f"/ui/campaigns/{campaign['id']}/results",
        ):
            with statements_sent(api.database.engine) as seen:
                assert api.client.get(path).status_code == 200
            campaign.setdefault("counts", []).append(len(seen))
    assert small["counts"] == big["counts"], "the campaign page makes more queries for more realisations"


def test_grid_results_and_status_json(api):
    campaign, worker = running_campaign(api, realizations=5)
    tasks = api.claim(worker, max_tasks=3)
    api.wpost(f"/tasks/{tasks[1]['task_id']}/started", json={"host": "n1"})
    assert api.succeed(tasks[0]).status_code == 200
    login(api)
    assert api.client.get(f"/ui/campaigns/{campaign['id']}/grid").json() == {"states": "srcqq"}
    results = api.client.get(f"/ui/campaigns/{campaign['id']}/results?window=0").json()
    assert (results["first"], results["last"], results["windows"]) == (0, 4, 1)
    assert [item["index"] for item in results["items"]] == [0]
    assert results["items"][0]["timing"]["calc"] == {"max": 1.0, "mean": 0.9}
    assert results["items"][0]["residual_history"] == [1.0, 1e-3, 1e-7]
    status = api.client.get(f"/ui/campaigns/{campaign['id']}/status").json()
    assert status["counts"]["succeeded"] == 1 and status["counts"]["running"] == 1
    assert [(plan["state"], plan["uses_here"]) for plan in status["plans"]] == [("ready", 1)]
    assert status["latest_map"] is None  # that result has no map


# --------------------------------------------------------------------------- quick-look maps


def test_quicklook_is_rendered_once_and_cached(api, monkeypatch):
    campaign, worker = running_campaign(api)
    succeed_with_map(api, api.claim(worker)[0])
    calls = []
    real = quicklook.render_iqu
    monkeypatch.setattr(quicklook, "render_iqu", lambda *a, **k: calls.append(1) or real(*a, **k))
    login(api)
    status = api.client.get(f"/ui/campaigns/{campaign['id']}/status").json()
    assert status["latest_map"]["realization"] == 0
    for field in ("I", "Q", "U", "I"):
        image = api.client.get(status["latest_map"]["images"][field])
        assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    assert len(calls) == 1  # the three fields come from one read of the map
    cached = sorted(p.name for p in (api.settings.products_dir / str(campaign["id"]) / "quicklook").iterdir())
    assert [name.split("-")[-1] for name in cached] == ["I.png", "Q.png", "U.png"]


# --------------------------------------------------------------------------- products panel hook


def test_products_panel_placeholder_and_hook(api):
    campaign, _ = running_campaign(api)
    login(api)
    page = api.client.get(f"/campaigns/{campaign['id']}").text
    assert "appear here once the campaign has products" in page

    def provider(*, session, campaign, settings):
        return panels.ProductsPanel(
            figures=[panels.FigureRef(title="Mean <I>", src=f"/campaigns/{campaign.id}/products/mean-I.png")],
            charts=[
                panels.ChartRef(kind="mc-spectra", src=f"/ui/campaigns/{campaign.id}/products/spectra", title="C_l")
            ],
            note="Mean of 2 realisations",
        )

    def broken(**_):
        raise RuntimeError("boom")

    panels.products_panel(provider)
    panels.products_panel(broken)
    try:
        page = api.client.get(f"/campaigns/{campaign['id']}").text
    finally:
        panels.remove_products_panel(provider)
        panels.remove_products_panel(broken)
    assert "appear here once the campaign has products" not in page
    assert f'data-chart="mc-spectra" data-src="/ui/campaigns/{campaign["id"]}/products/spectra"' in page
    assert "Mean &lt;I&gt;" in page and "Mean of 2 realisations" in page


# --------------------------------------------------------------------------- offline


def test_dashboard_files_load_nothing_from_the_network(api):
    urls = re.compile(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
    allowed = {"http://www.w3.org"}  # the SVG namespace name in charts.js and the icon; not fetched
    for path in list(TEMPLATES_DIR.glob("*.html")) + [p for p in STATIC_DIR.iterdir() if p.is_file()]:
        found = set(urls.findall(path.read_text())) - allowed
        assert not found, f"{path.name} refers to {found}"
    login(api)
    html = api.client.get("/").text
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', html):
        answer = api.client.get(asset)
        assert answer.status_code == 200, asset


@pytest.mark.parametrize("path", ["/", "/workers", "/campaigns/1", "/campaigns/1/realizations/0"])
def test_pages_need_a_login(api, path):
    answer = api.client.get(path, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"].startswith("/login?next=")


def test_a_form_post_without_a_session_goes_to_the_login(api):
    campaign, _ = running_campaign(api)
    answer = api.client.post(f"/campaigns/{campaign['id']}/cancel", data={"csrf_token": "x"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/login?next=%2F"
    assert api.campaign(campaign["id"])["state"] == "queued"
    assert api.client.get("/ui/overview").status_code == 401


def test_realisation_page_shows_the_seconds_per_stage(api):
    from tests.support.service_helpers import result_for

    campaign, worker = running_campaign(api, realizations=1)
    task = api.claim(worker, max_tasks=1)[0]
    result = result_for(task["spec"], task["realization"], None)
    result["stages"] = {"pointing": {"max": 2.5, "mean": 2.0}, "solve": {"max": 40.0, "mean": 39.0}}
    assert api.wpost(f"/tasks/{task['task_id']}/succeeded", json={"result": result}).status_code == 200
    login(api)
    page = api.client.get(f"/campaigns/{campaign['id']}/realizations/0").text
    stages = re.search(r'<dd class="stages">(.*?)</dd>', page, re.DOTALL)
    assert stages is not None
    assert stages.group(1).index("pointing") < stages.group(1).index("solve")
    assert "Stages (mean / max over ranks)" in page


def test_realisation_page_shows_the_preconditioned_condition_estimate(api):
    from tests.support.service_helpers import result_for

    campaign, worker = running_campaign(api, realizations=1)
    task = api.claim(worker, max_tasks=1)[0]
    result = result_for(task["spec"], task["realization"], None)
    result["spectrum"] = {"smallest": 0.25, "largest": 1.03, "condition": 4.12}
    assert api.wpost(f"/tasks/{task['task_id']}/succeeded", json={"result": result}).status_code == 200
    login(api)
    page = api.client.get(f"/campaigns/{campaign['id']}/realizations/0").text
    assert "condition of M<sup>-1</sup>A about 4.12 (Ritz values 0.25 to 1.03)" in page
