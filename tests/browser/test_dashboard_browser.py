"""The dashboard in headless Chromium against a live service (SQLite and PostgreSQL).

State changes are driven through the real worker API by a test worker
(tests/support/fake_worker.py) with made-up results and a real FITS map.
Nothing here asserts on wall-clock time; the 1000-realisation test prints
its page-load figures.
"""

from __future__ import annotations

import statistics

import pytest

from tests.browser.conftest import Dashboard, new_page, texts
from tests.support.databases import on_database

pytestmark = [pytest.mark.browser, on_database("postgresql")]

GRID_RENDERED = "() => document.getElementById('grid') && document.getElementById('grid').dataset.rendered === 'true'"


def cell_state(page, index: int) -> str:
    return page.get_attribute(f"#grid .cell[data-i='{index}']", "class").removeprefix("cell s-")


def wait_cell(page, index: int, state: str) -> None:
    page.wait_for_function(
        "([i, s]) => { const c = document.querySelector(`#grid .cell[data-i='${i}']`);"
        " return c && c.className === 'cell s-' + s; }",
        arg=[index, state],
    )


def wait_text(page, selector: str, text: str) -> None:
    page.wait_for_function(
        "([sel, t]) => { const e = document.querySelector(sel); return e && e.textContent.includes(t); }",
        arg=[selector, text],
    )


def count(page, scope: str, state: str) -> str:
    return page.text_content(f"{scope} [data-count='{state}']").strip()


def wait_images(page, selector: str) -> None:
    page.wait_for_function(
        "(sel) => { const all = [...document.querySelectorAll(sel)];"
        " return all.length > 0 && all.every(i => i.complete && i.naturalWidth > 0); }",
        arg=selector,
    )


def mark_no_reload(page) -> None:
    page.evaluate("() => { window.__sameDocument = 'yes'; }")


def assert_no_reload(page) -> None:
    assert page.evaluate("() => window.__sameDocument") == "yes", "the page reloaded"


# --------------------------------------------------------------------------- login, overview, logout


def test_login_overview_and_logout(dash: Dashboard, page):
    campaign = dash.create_campaign(name="Planck-like satellite, 12 realisations", realizations=12)

    answer = page.goto(dash.url + "/")
    assert page.url.startswith(dash.url + "/login?next=")  # not logged in: the login form
    assert answer.status == 200

    page.fill("#token", dash.service.worker_token)
    page.click("form[action='/login'] button[type=submit]")
    assert "worker token" in page.text_content("p.error")
    page.fill("#token", "mcu_not-a-real-token")
    page.click("form[action='/login'] button[type=submit]")
    assert "unknown or revoked" in page.text_content("p.error")

    dash.login(page)
    row = page.locator(f"tr[data-campaign='{campaign['id']}']")
    assert row.locator("a.campaign-name").text_content() == "Planck-like satellite, 12 realisations"
    assert row.locator("[data-role=state]").text_content() == "queued"
    assert count(page, f"tr[data-campaign='{campaign['id']}']", "queued") == "12"
    assert row.locator("svg.progress rect[data-part=queued]").get_attribute("width") == "1000.00"
    assert page.text_content(".who") == "local"

    cookies = {cookie["name"]: cookie for cookie in page.context.cookies()}
    session = cookies["mapcampaign_session"]
    assert session["httpOnly"] is True and session["sameSite"] == "Lax" and session["path"] == "/"
    assert dash.service.user_token not in session["value"]  # the cookie never holds the token
    assert "mapcampaign_session" not in page.evaluate("() => document.cookie")  # out of reach of scripts
    dash.screenshot(page, "overview")

    page.click("text=Log out")
    page.wait_for_url(dash.url + "/login?notice=logged-out")
    assert "logged out" in page.text_content(".notice")
    assert "mapcampaign_session" not in {cookie["name"] for cookie in page.context.cookies()}
    page.goto(dash.url + f"/campaigns/{campaign['id']}")
    assert page.url.startswith(dash.url + "/login?next=")


# --------------------------------------------------------------------------- live updates


def test_campaign_page_follows_a_running_campaign_without_reload(dash: Dashboard, page):
    campaign = dash.create_campaign(name="live campaign", realizations=12)
    worker = dash.worker("w1")
    worker.build_plan(build_time_s=42.0)
    tasks = worker.claim(3)
    for task in tasks:
        worker.start(task, job_id=f"slurm-{task['realization']}")

    dash.login(page)
    page.goto(dash.url + f"/campaigns/{campaign['id']}")
    page.wait_for_function(GRID_RENDERED)
    assert page.locator("#grid .cell").count() == 12
    assert [cell_state(page, i) for i in range(4)] == ["running", "running", "running", "queued"]
    assert count(page, "#progress-panel", "running") == "3"
    assert count(page, "#progress-panel", "succeeded") == "0"
    assert "ready" in page.text_content("#plans") and "42 s" in page.text_content("#plans")
    assert "0 of this campaign" in page.text_content("#plans")
    assert "appear here once the campaign has products" in page.text_content("#products-placeholder")
    assert "once one has succeeded" in page.text_content("#maps-caption")
    page.wait_for_selector("#live-status[data-state=live]")
    mark_no_reload(page)

    # A realisation finishes: the worker uploads its FITS map and reports the result.
    worker.succeed(tasks[0])
    wait_cell(page, 0, "succeeded")
    wait_text(page, "#progress-panel [data-count=succeeded]", "1")
    assert count(page, "#progress-panel", "running") == "2"
    assert float(page.get_attribute("#progress-panel rect[data-part=succeeded]", "width")) == pytest.approx(
        1000 / 12, abs=0.01
    )
    wait_text(page, "#plans", "1 of this campaign")
    page.wait_for_selector("#timing-chart .bar-group[data-slot='0'] rect.bar-calc")
    assert page.locator("#timing-chart .bar-group[data-slot='0'] rect").count() == 3  # calc, comm, io
    page.wait_for_selector("#convergence-chart polyline[data-series='0']")
    wait_text(page, "table.realizations tr[data-index='0'] [data-role=state]", "succeeded")
    page.wait_for_selector("#maps img[data-field=I]", state="attached")
    page.locator("#maps-panel").scroll_into_view_if_needed()  # the maps load lazily, when in view
    wait_images(page, "#maps img")
    for field in ("I", "Q", "U"):
        assert page.evaluate(f"() => document.querySelector('#maps img[data-field={field}]').naturalWidth") == 640
    assert page.text_content("#maps-realization") == "#0"
    cache = dash.service.data_dir / "campaigns" / str(campaign["id"]) / "quicklook"
    assert sorted(path.name.split("-")[-1] for path in cache.glob("0-*.png")) == ["I.png", "Q.png", "U.png"]

    # Another one fails (attempts remain, so it goes back to the queue) with its failure class.
    worker.fail(tasks[1], "app_error", exit_code=1, log_tail="Traceback (most recent call last):\nValueError: NaN")
    wait_cell(page, 1, "queued")
    wait_text(page, "#failure-classes", "app_error")
    wait_text(page, "#recent-failures", "ValueError: NaN")
    assert_no_reload(page)
    dash.screenshot(page, "campaign-live")

    # The overview follows too.
    page.goto(dash.url + "/")
    mark_no_reload(page)
    scope = f"tr[data-campaign='{campaign['id']}']"
    assert count(page, scope, "succeeded") == "1"
    worker.succeed(tasks[2], with_map=False)
    wait_text(page, f"{scope} [data-count=succeeded]", "2")
    assert count(page, scope, "running") == "0"
    assert_no_reload(page)


# --------------------------------------------------------------------------- realisation page


def test_realization_page_lists_every_attempt(dash: Dashboard, page):
    campaign = dash.create_campaign(name="attempts", realizations=3, max_attempts=3)
    worker = dash.worker("w1", host="node017.cluster.example")
    worker.build_plan()
    first = worker.claim_one()
    worker.start(first, job_id="slurm-8812")
    log_tail = "\n".join(
        [f"[rank 0] PCG iteration {k}: |r|/|b| = 1e-{k}" for k in range(1, 6)]
        + ["Traceback (most recent call last):", '  File "mapmaker/pcg.py", line 88', "FloatingPointError: NaN"]
    )
    assert worker.fail(first, "app_error", exit_code=1, log_tail=log_tail, message="NaN in the residual") == "queued"
    second = worker.claim_one()
    assert second["realization"] == first["realization"] == 0 and second["attempt"] == 2
    worker.start(second, job_id="slurm-8813")
    worker.succeed(second)

    dash.login(page)
    page.goto(dash.url + f"/campaigns/{campaign['id']}/realizations/0")
    assert page.text_content("#realization-state .badge") == "succeeded"
    rows = page.locator("#attempts tr.attempt")
    assert rows.count() == 2
    failed, succeeded = rows.nth(0), rows.nth(1)
    assert failed.locator("[data-role=host]").text_content() == "node017.cluster.example"
    assert failed.locator("[data-role=exit-code]").text_content() == "1"
    assert failed.locator("[data-role=outcome]").text_content().strip() == "app_error"
    assert "s" in failed.locator("[data-role=duration]").text_content()  # a duration, not "running"
    assert "slurm-8812" in failed.text_content()
    log = page.locator("pre.log").first
    assert log.is_visible()  # the failed attempt's log is open
    assert log.text_content() == log_tail
    assert succeeded.locator("[data-role=exit-code]").text_content() == "0"
    assert succeeded.locator("[data-role=outcome]").text_content().strip() == "succeeded"
    assert "iterations, converged" in page.text_content("#result-panel")
    assert "block-diagonal: as the spec says" in page.text_content("#result-panel")
    page.wait_for_selector("#result-timing .bar-group rect.bar-comm")
    page.wait_for_selector("#result-convergence polyline")
    assert texts(page.locator("ul.products a")) == ["map_iqu.fits"]
    page.locator("#maps-panel").scroll_into_view_if_needed()
    wait_images(page, "#maps-panel img")
    dash.screenshot(page, "realization")

    # A realisation that failed twice in other ways; the failed one's page tells why.
    third = worker.claim_one()
    worker.start(third)
    worker.fail(
        third, "walltime", exit_code=137, log_tail="slurmstepd: error: *** JOB 8814 CANCELLED DUE TO TIME LIMIT ***"
    )
    page.goto(dash.url + f"/campaigns/{campaign['id']}/realizations/{third['realization']}")
    assert page.locator("#attempts tr.attempt [data-role=outcome]").text_content().strip() == "walltime"
    assert page.locator("#attempts tr.attempt [data-role=exit-code]").text_content() == "137"
    assert "TIME LIMIT" in page.text_content("pre.log")


# --------------------------------------------------------------------------- escaping


HOSTILE_NAME = (
    "<script>window.__pwned='name'</script>\" onmouseover=\"window.__pwned='attr'\" x=\""
    "'><img src=x onerror=\"window.__pwned='img'\">"
)
HOSTILE_HOST = '"><svg onload="window.__pwned=\'host\'"></svg>'
HOSTILE_LOG = "</pre><script>window.__pwned='log'</script><b onmouseover=\"window.__pwned='b'\">bold?</b>"


def assert_inert(page) -> None:
    assert page.evaluate("() => window.__pwned") is None
    assert (
        page.evaluate("() => document.querySelectorAll('[onmouseover], [onerror], [onload], img[src=x]').length") == 0
    )


def test_user_strings_render_as_text(dash: Dashboard, page):
    campaign = dash.create_campaign(name=HOSTILE_NAME, realizations=4, max_attempts=1)
    worker = dash.worker("w-hostile", host=HOSTILE_HOST)
    worker.build_plan()
    first = worker.claim_one()
    worker.start(first)
    worker.fail(first, "app_error", exit_code=2, log_tail=HOSTILE_LOG)
    running = worker.claim_one()
    worker.start(running)

    dash.login(page)
    assert page.text_content("a.campaign-name") == HOSTILE_NAME
    page.hover("a.campaign-name")
    assert_inert(page)

    page.goto(dash.url + f"/campaigns/{campaign['id']}")
    page.wait_for_function(GRID_RENDERED)
    assert page.text_content("#campaign-name") == HOSTILE_NAME
    assert page.title() == f"{HOSTILE_NAME} · MapCampaign"
    assert HOSTILE_LOG in page.text_content("#recent-failures")
    # A failure after the page opened: the failures table is rebuilt by script from the event stream.
    worker.fail(running, "oom", exit_code=137, log_tail=HOSTILE_LOG + "\n" + HOSTILE_NAME)
    wait_text(page, "#failure-classes", "oom")
    wait_text(page, "#recent-failures", HOSTILE_NAME)
    page.hover("#campaign-name")
    assert_inert(page)
    dash.screenshot(page, "escaping-campaign")

    page.goto(dash.url + f"/campaigns/{campaign['id']}/realizations/{first['realization']}")
    assert page.text_content("pre.log") == HOSTILE_LOG
    assert page.text_content("#attempts [data-role=host]") == HOSTILE_HOST
    assert page.text_content("#campaign-link") == HOSTILE_NAME
    assert_inert(page)

    page.goto(dash.url + "/workers")
    assert page.text_content("tr[data-worker] [data-role=host]") == HOSTILE_HOST
    page.wait_for_timeout(5_500)  # the table is rebuilt by script from /ui/workers every 5 s
    assert page.text_content("tr[data-worker] [data-role=host]") == HOSTILE_HOST
    assert HOSTILE_NAME not in page.text_content("#workers")  # no task of this campaign runs any more
    assert_inert(page)


# --------------------------------------------------------------------------- isolation


def test_users_see_only_their_own_campaigns(dash: Dashboard, page, chromium):
    mine = dash.create_campaign(name="alice's secret campaign", realizations=3)
    worker = dash.worker("w1")
    worker.build_plan()
    task = worker.claim_one()
    worker.start(task)
    worker.succeed(task)
    bob_token = dash.service.create_token("bob")

    bob = new_page(chromium, dash)
    try:
        dash.login(bob, bob_token)
        assert bob.text_content(".who") == "bob"
        assert "alice's secret campaign" not in bob.text_content("main")
        assert "No campaigns yet" in bob.text_content("main")
        base = f"/campaigns/{mine['id']}"
        for path in (
            base,
            f"{base}/realizations/0",
            f"{base}/realizations/0/maps/I.png",
            f"{base}/realizations/0/products/map_iqu.fits",
        ):
            answer = bob.goto(dash.url + path)
            assert answer.status == 404, path
        assert "alice" not in bob.text_content("main")
        dash.screenshot(bob, "other-users-campaign-404")
        for path in (
            f"/ui/campaigns/{mine['id']}/status",
            f"/ui/campaigns/{mine['id']}/grid",
            f"/ui/campaigns/{mine['id']}/results",
            f"/ui/events?campaign_id={mine['id']}",
            f"/ui/overview?ids={mine['id']}",
        ):
            answer = bob.request.get(dash.url + path)
            assert answer.status == (200 if "overview" in path else 404), path
            if "overview" in path:
                assert answer.json() == []
        csrf = bob.get_attribute("meta[name=csrf-token]", "content")
        answer = bob.request.post(dash.url + f"{base}/cancel", form={"csrf_token": csrf, "reason": "bob was here"})
        assert answer.status == 404
        assert dash.campaign(mine["id"])["state"] == "running"
    finally:
        bob.context.close()

    # Alice sees hers.
    dash.login(page)
    assert "alice's secret campaign" in page.text_content("main")


# --------------------------------------------------------------------------- owner actions


def test_owner_retries_failed_and_cancels_with_csrf(dash: Dashboard, page):
    campaign = dash.create_campaign(name="actions", realizations=6, max_attempts=1)
    worker = dash.worker("w1")
    worker.build_plan()
    task = worker.claim_one()
    worker.start(task)
    assert worker.fail(task, "oom", exit_code=137, log_tail="Killed") == "failed"

    dash.login(page)
    page.goto(dash.url + f"/campaigns/{campaign['id']}")
    page.wait_for_function(GRID_RENDERED)
    assert cell_state(page, 0) == "failed"

    # Cookie-authenticated POSTs need the page's CSRF token, and this origin.
    forged = page.request.post(dash.url + f"/campaigns/{campaign['id']}/retry", form={"csrf_token": "forged"})
    assert forged.status == 403
    csrf = page.get_attribute("meta[name=csrf-token]", "content")
    cross_site = page.request.post(
        dash.url + f"/campaigns/{campaign['id']}/cancel",
        form={"csrf_token": csrf},
        headers={"Origin": "https://evil.example"},
    )
    assert cross_site.status == 403
    assert dash.campaign(campaign["id"])["progress"]["counts"]["failed"] == 1

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#retry-form button")
    page.wait_for_url(f"**/campaigns/{campaign['id']}?notice=retried")
    page.wait_for_function(GRID_RENDERED)
    assert "back in the queue" in page.text_content(".notice")
    assert cell_state(page, 0) == "queued"
    assert page.is_hidden("#retry-form")

    page.fill("#cancel-form input[name=reason]", "wrong noise model")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-form button")
    page.wait_for_url(f"**/campaigns/{campaign['id']}?notice=cancelled")
    page.wait_for_function(GRID_RENDERED)
    assert page.text_content("#campaign-state .badge") == "cancelled"
    assert {cell_state(page, i) for i in range(6)} == {"cancelled"}
    assert page.text_content("#cancel-reason") == "Cancelled: wrong noise model"
    assert page.is_hidden("#cancel-form")
    assert dash.campaign(campaign["id"])["state"] == "cancelled"
    dash.screenshot(page, "cancelled")


# --------------------------------------------------------------------------- workers page


def test_workers_page_shows_sites_heartbeats_and_tasks(dash: Dashboard, page):
    campaign = dash.create_campaign(name="workers view", realizations=5)
    local = dash.worker("local-1", site="local", host="laptop")
    dash.worker("perlmutter-1", site="perlmutter", host="login07.nersc.example")
    local.build_plan()
    tasks = local.claim(2)
    for task in tasks:
        local.start(task)
    local.heartbeat([task["task_id"] for task in tasks])

    dash.login(page)
    page.goto(dash.url + "/workers")
    row = page.locator("tr[data-worker]", has_text="local-1")
    assert row.locator("[data-role=site]").text_content() == "local"
    assert row.locator("[data-role=running]").text_content().strip() == "2 / 8"
    assert row.locator("[data-role=heartbeat]").text_content().endswith("ago")
    assert texts(row.locator("[data-role=own] a")) == ["workers view", "#0", "#1"]
    other = page.locator("tr[data-worker]", has_text="perlmutter-1")
    assert other.locator("[data-role=site]").text_content() == "perlmutter"
    assert other.locator("[data-role=running]").text_content().strip() == "0 / 8"
    dash.screenshot(page, "workers")
    row.locator("[data-role=own] a", has_text="#1").click()
    page.wait_for_url(f"**/campaigns/{campaign['id']}/realizations/1")


# --------------------------------------------------------------------------- a big campaign


def test_thousand_realisations_campaign_page(dash: Dashboard, page):
    total = 1000
    campaign = dash.create_campaign(name="1000 realisations", realizations=total, max_attempts=1)
    worker = dash.worker("w1", host="big-node")
    worker.build_plan()
    claimed = worker.claim(50) + worker.claim(50) + worker.claim(50)
    for task in claimed[:100]:
        worker.start(task)
    for task in claimed[:59]:
        worker.succeed(task, with_map=False)
    worker.succeed(claimed[59])  # the latest success has a map
    for task in claimed[60:70]:
        worker.fail(task, "app_error", exit_code=1, log_tail="boom")

    dash.login(page)
    url = dash.url + f"/campaigns/{campaign['id']}"
    figures = []
    for _ in range(4):  # the first load is the server's first of this page; the others are warm
        page.goto(url, wait_until="load")
        page.wait_for_function(GRID_RENDERED)
        page.wait_for_function("() => performance.getEntriesByType('navigation')[0].loadEventEnd > 0")
        figures.append(
            page.evaluate(
                """() => {
                  const nav = performance.getEntriesByType('navigation')[0];
                  const grid = performance.getEntriesByName('grid-rendered')[0];
                  return {load: nav.loadEventEnd, grid: grid.startTime, html: nav.decodedBodySize};
                }"""
            )
        )
    assert page.locator("#grid .cell").count() == total
    assert page.locator("#grid .cell.s-succeeded").count() == 60
    assert page.locator("#grid .cell.s-failed").count() == 10
    assert page.locator("#grid .cell.s-running").count() == 30
    assert page.locator("#grid .cell.s-claimed").count() == 50
    assert page.locator("#grid .cell.s-queued").count() == total - 150
    assert count(page, "#progress-panel", "queued") == str(total - 150)
    assert page.locator("table.realizations tbody tr").count() == 50  # paginated
    assert page.locator("#realizations-panel .pager a[rel=next]").count() == 1
    page.wait_for_selector("#timing-chart .bar-group")
    page.locator("#maps-panel").scroll_into_view_if_needed()
    wait_images(page, "#maps img")
    page.evaluate("() => window.scrollTo(0, 0)")
    dash.screenshot(page, "campaign-1000")

    cold, warm = figures[0], figures[1:]
    print(
        f"\n1000-realisation campaign page ({dash.database_kind}): "
        f"first load: load event {cold['load']:.0f} ms, grid rendered {cold['grid']:.0f} ms; "
        f"next {len(warm)} loads, median: load event {statistics.median(f['load'] for f in warm):.0f} ms, "
        f"grid rendered {statistics.median(f['grid'] for f in warm):.0f} ms; HTML {cold['html'] / 1000:.0f} kB"
    )
