"""Dashboard pages and behaviour added for the scientist's journey (in process, no browser): the plans and
products pages, HTML 404s for browsers and JSON for API clients, the live realisation rows, frozen
throughput of a finished campaign, and the one-time login link (expiry by moving the service's clock)."""

from __future__ import annotations

import re

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


# --------------------------------------------------------------------------- pages and 404s


HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}  # as Chromium sends it


def test_plans_page_lists_the_plans_of_ones_campaigns(api):
    campaign, worker = running_campaign(api, realizations=2)
    other = api.create(name="same pointing", realizations=1)
    bobs = api.create(token=api.bob, name="bob's campaign", realizations=1)
    (task,) = api.claim(worker, 1)
    assert api.succeed(task).status_code == 200
    login(api)
    page = api.client.get("/plans", headers=HTML)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    assert campaign["scan_key"][:12] in text and f'<td data-role="ranks">{campaign["ranks"]}</td>' in text
    assert f'href="/campaigns/{campaign["id"]}"' in text and f'href="/campaigns/{other["id"]}"' in text
    assert "bob&#39;s campaign" not in text and f'href="/campaigns/{bobs["id"]}"' not in text  # only one's own
    assert '<td data-role="uses">1</td>' in text and '<td data-role="build-time">0.50 s</td>' in text
    login(api, api.bob)
    assert f'href="/campaigns/{bobs["id"]}"' in api.client.get("/plans").text


def test_products_page_without_products_says_so(api):
    running_campaign(api)
    login(api)
    page = api.client.get("/products", headers=HTML)
    assert page.status_code == 200 and "No campaign has products yet" in page.text


def test_unknown_paths_answer_html_to_browsers_and_json_to_others(api):
    login(api)
    for path in ("/plan", "/campaigns/1/nothing", "/products/x/y"):
        page = api.client.get(path, headers=HTML)
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html"), path
        assert "There is no page at this address." in page.text and 'href="/plans"' in page.text  # the menu
        answer = api.client.get(path, headers={"Accept": "application/json"})
        assert answer.status_code == 404 and answer.json()["code"] == "not_found", path
    api.client.cookies.clear()
    assert "<!doctype html>" in api.client.get("/nowhere", headers=HTML).text  # no session: still a page
    assert api.client.get("/api/v1/nowhere", headers=HTML).json()["code"] == "not_found"  # the API stays JSON
    assert api.client.get("/ui/nowhere", headers=HTML).json()["code"] == "not_found"


def test_a_missing_campaign_is_an_html_page_for_browsers_and_json_for_api_clients(api):
    login(api)
    page = api.client.get("/campaigns/999999", headers=HTML)
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    answer = api.client.get("/campaigns/999999", headers={"Accept": "application/json"})
    assert answer.status_code == 404 and answer.headers["content-type"] == "application/json"
    assert "999999" in answer.json()["detail"]


# --------------------------------------------------------------------------- realisation rows


def test_rows_keep_the_attempts_used_and_the_last_worker(api):
    campaign, worker = running_campaign(api, realizations=3, max_attempts=3)
    first, second = api.claim(worker, 2)
    login(api)
    rows = api.client.get(f"/ui/campaigns/{campaign['id']}/rows?indices=0,1,2").json()
    assert [(r["state"], r["attempts"], r["worker"], r["holding"]) for r in rows] == [
        ("claimed", 1, "w1", True),
        ("claimed", 1, "w1", True),
        ("queued", 0, None, False),
    ]
    assert api.fail(first["task_id"]).status_code == 200
    (again,) = api.claim(worker, 1)
    assert again["realization"] == first["realization"]
    assert api.succeed(again).status_code == 200
    assert api.succeed(second).status_code == 200
    rows = api.client.get(f"/ui/campaigns/{campaign['id']}/rows?indices=0,1").json()
    assert [(r["state"], r["attempts"], r["max_attempts"], r["worker"], r["holding"]) for r in rows] == [
        ("succeeded", 2, 3, "w1", False),  # two attempts used, the worker kept once it ended
        ("succeeded", 1, 3, "w1", False),
    ]
    assert rows[0]["finished_at"] is not None
    page = api.client.get(f"/campaigns/{campaign['id']}").text
    assert '<td data-role="attempts">2 / 3</td>' in page and '<td data-role="attempts">1 / 3</td>' in page
    assert 'title="the worker of the latest attempt">w1</td>' in page
    login(api, api.bob)
    assert api.client.get(f"/ui/campaigns/{campaign['id']}/rows?indices=0").status_code == 404
    assert api.client.get(f"/ui/campaigns/{campaign['id']}/products-panel").status_code == 404


def test_products_panel_json_is_empty_before_products(api):
    campaign, _worker = running_campaign(api)
    login(api)
    panel = api.client.get(f"/ui/campaigns/{campaign['id']}/products-panel").json()
    assert panel == {"empty": True, "note": "", "figures": [], "charts": []}


# --------------------------------------------------------------------------- products page, with real map-maker outputs


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    from tests.support.mapped_campaign import map_realizations, spec_json, write_spec

    folder = tmp_path_factory.mktemp("mapped-pages")
    spec_path = write_spec(folder)
    return spec_json(spec_path), map_realizations(spec_path, folder / "maps", [0, 1])


def test_products_page_links_downloads_and_the_panel_appears(api, mapped):
    from schemas.api import API_PREFIX
    from tests.support.mapped_campaign import deliver
    from tests.support.service_helpers import auth

    spec, folders = mapped
    answer = api.post("/campaigns", json=spec)
    assert answer.status_code == 201, answer.text
    campaign_id = answer.json()["id"]
    worker = api.register()
    api.build_plan(worker)
    login(api)
    assert api.client.get(f"/ui/campaigns/{campaign_id}/products-panel").json()["empty"] is True
    for task in api.claim(worker, max_tasks=2):
        delivered = deliver(
            api.client, task, folders[task["realization"]], prefix=API_PREFIX, headers=auth(api.alice_worker)
        )
        assert delivered.status_code == 200, delivered.text

    panel = api.client.get(f"/ui/campaigns/{campaign_id}/products-panel").json()
    assert panel["empty"] is False and "2 realisation(s)" in panel["note"]
    # the decoupled bandpowers against the input model and their noise bias first, then the pseudo-spectra
    # and their pseudo-C_l noise
    assert [chart["kind"] for chart in panel["charts"]] == [
        "mc-bandpowers", "mc-bandpower-noise", "mc-spectra", "mc-noise-bias"
    ]
    assert [figure["src"].split("?")[0] for figure in panel["figures"]] == [
        f"/campaigns/{campaign_id}/products/mean-{field}.png" for field in "IQU"
    ]

    page = api.client.get("/products", headers=HTML).text
    assert f'href="/campaigns/{campaign_id}#products-panel"' in page
    names = ["spectra.json", "spectra.npz", "spectra.fits", "mean-map.fits", "mean-map.npz"]
    names += ["variance-map.fits", "variance-map.npz", "mask.fits"]
    for name in names:
        assert f'href="/campaigns/{campaign_id}/downloads/{name}"' in page, name
        download = api.client.get(f"/campaigns/{campaign_id}/downloads/{name}")
        assert download.status_code == 200, (name, download.text)
        assert f"campaign-{campaign_id}-" in download.headers["content-disposition"]
    spectra = api.client.get(f"/campaigns/{campaign_id}/downloads/spectra.json").json()
    assert spectra == api.get(f"/campaigns/{campaign_id}/products/spectra").json()  # the API's own file
    assert api.client.get(f"/campaigns/{campaign_id}/downloads/mean-map.fits").content.startswith(b"SIMPLE")
    assert api.client.get(f"/campaigns/{campaign_id}/downloads/other.txt").status_code == 404
    login(api, api.bob)
    assert api.client.get(f"/campaigns/{campaign_id}/downloads/spectra.json").status_code == 404
    assert f"/campaigns/{campaign_id}" not in api.client.get("/products").text


# --------------------------------------------------------------------------- one-time login link


def new_link(api, token: str | None = None):
    return api.post("/login-links", token)


LINK_FORM = re.compile(
    r'<form method="post" action="/login/link">\s*<input type="hidden" name="secret" value="([^"]+)">\s*'
    r'<input type="hidden" name="csrf_token" value="([^"]+)">'
)


def confirm(api, path: str, **headers: str):
    """Open the link (GET: the confirmation page), then press its button (POST); return both answers."""
    page = api.client.get(path, follow_redirects=False)
    assert page.status_code == 200, page.text
    secret, form_token = LINK_FORM.search(page.text).groups()
    posted = api.client.post(
        "/login/link", data={"secret": secret, "csrf_token": form_token}, headers=headers, follow_redirects=False
    )
    return page, posted


def test_a_login_link_shows_a_confirmation_and_logs_in_once_by_its_button(api):
    answer = new_link(api)
    assert answer.status_code == 201, answer.text
    url = answer.json()["url"]
    assert url.startswith("http://testserver/login/link?secret=mcl_")
    path = url.removeprefix("http://testserver")
    secret = path.split("secret=")[1]
    api.client.cookies.clear()

    # A bare GET, however often, sets no session and spends nothing: it names the user and offers a button.
    for _ in range(2):
        page = api.client.get(path, follow_redirects=False)
        assert page.status_code == 200 and "mapcampaign_session" not in page.cookies
        assert '<span id="link-user">alice</span>' in page.text
        assert page.headers["cache-control"] == "no-store"
    assert api.client.get("/", follow_redirects=False).status_code == 303  # still not logged in

    page, opened = confirm(api, path, origin="http://testserver")
    assert 'action="/login/link"' in page.text and "?secret" not in page.text.split("<form")[1].split(">")[0]
    assert opened.status_code == 303 and opened.headers["location"] == "/"
    assert "mapcampaign_session" in opened.cookies
    overview = api.client.get("/")
    assert overview.status_code == 200 and '<span class="who" title="Logged in as">alice</span>' in overview.text
    # Someone else's link opened in this logged-in browser says whose account it would switch to.
    bobs = api.client.get(new_link(api, api.bob).json()["url"].removeprefix("http://testserver"))
    assert '<span id="link-user">bob</span>' in bobs.text and "This browser is logged in as alice" in bobs.text

    api.client.cookies.clear()
    again = api.client.get(path, follow_redirects=False)
    assert again.status_code == 401 and "used already, has expired" in again.text
    assert "run <code>mapcampaign login</code>" in again.text  # the page names the command that makes a new link
    assert "mapcampaign_session" not in again.cookies
    replayed = api.client.post("/login/link", data={"secret": secret}, follow_redirects=False)
    assert replayed.status_code == 403 and "mapcampaign_session" not in replayed.cookies
    assert api.client.get("/", follow_redirects=False).status_code == 303  # not logged in: to the login form
    for wrong in ("", "mcl_nothing", "mcu_" + path.split("mcl_")[1]):
        assert api.client.get(f"/login/link?secret={wrong}", follow_redirects=False).status_code == 401


def test_a_login_link_posted_from_another_site_logs_nobody_in(api):
    """Login CSRF: a page elsewhere that posts someone's live link (the attacker's own) into a victim's
    browser. Another Origin is refused; so is a post without the confirmation page's cookie and token,
    which another site can neither read nor send, even when the browser names no origin."""
    path = new_link(api, api.bob).json()["url"].removeprefix("http://testserver")
    secret = path.split("secret=")[1]
    api.client.cookies.clear()
    page = api.client.get(path)
    _, form_token = LINK_FORM.search(page.text).groups()
    cross_site = api.client.post(
        "/login/link",
        data={"secret": secret, "csrf_token": form_token},
        headers={"origin": "https://evil.example"},
        follow_redirects=False,
    )
    assert cross_site.status_code == 403 and "mapcampaign_session" not in cross_site.cookies
    api.client.cookies.clear()  # the cross-site post carries no cookie of this site (SameSite=Lax)
    without_cookie = api.client.post(
        "/login/link", data={"secret": secret, "csrf_token": form_token}, follow_redirects=False
    )
    assert without_cookie.status_code == 403 and "mapcampaign_session" not in without_cookie.cookies
    # None of these spent the link: its owner's own confirmation still logs in.
    _, opened = confirm(api, path)
    assert opened.status_code == 303 and "mapcampaign_session" in opened.cookies
    assert '<span class="who" title="Logged in as">bob</span>' in api.client.get("/").text


def test_a_login_link_expires_and_dies_with_its_token(api, clock):
    expiring = new_link(api).json()
    assert expiring["expires_at"]
    api.client.cookies.clear()
    path = expiring["url"].removeprefix("http://testserver")
    page = api.client.get(path)
    secret, form_token = LINK_FORM.search(page.text).groups()
    clock.advance(601)  # ten minutes and a second later, on the service's clock
    assert api.client.get(path, follow_redirects=False).status_code == 401
    late = api.client.post("/login/link", data={"secret": secret, "csrf_token": form_token}, follow_redirects=False)
    assert late.status_code == 401 and "mapcampaign_session" not in late.cookies

    from sqlalchemy import update

    from service.auth.models import ApiToken
    from service.auth.service import hash_token

    bobs = new_link(api, api.bob).json()["url"].removeprefix("http://testserver")
    with api.database.session() as session:
        session.execute(update(ApiToken).where(ApiToken.token_hash == hash_token(api.bob)).values(revoked_at=clock()))
        session.commit()
    assert api.client.get(bobs, follow_redirects=False).status_code == 401


def test_only_user_tokens_get_login_links(api):
    assert new_link(api, api.alice_worker).status_code == 403
    assert api.client.post("/api/v1/login-links").status_code == 401


def test_the_focal_plane_has_axes_and_counts_detectors_that_share_a_position(api):
    """The demo's 4 detectors are two A/B pairs at two offsets: the plot says so and labels its axes."""
    campaign, _worker = running_campaign(api)
    login(api)
    page = api.client.get(f"/campaigns/{campaign['id']}").text
    plot = page[page.index('<svg id="focal-plane-plot"'):]
    plot = plot[: plot.index("</svg>", plot.index("</svg>") + 1)]  # the degrees inside, the axes around
    assert "x offset (°)" in plot and "y offset (°)" in plot
    assert plot.count('<g class="detector">') == 4
    assert plot.count('class="shared-position"') == 2 and plot.count(">2</text>") == 2
    assert "at 2 positions" in page
