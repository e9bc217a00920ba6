"""The dashboard pages of the scientist's journey in headless Chromium (SQLite and PostgreSQL): the plans and
products pages and the HTML 404, the live realisation table and products panel, a ground campaign's zoomed
quick-look maps, and the one-time login link. Nothing waits on wall-clock time: each wait is on a condition."""

from __future__ import annotations

import io

import pytest
from matplotlib.image import imread

from schemas.io import load_example_spec
from service.dashboard import quicklook
from tests.browser.conftest import Dashboard, new_page
from tests.support.databases import on_database
from tests.support.mapped_campaign import deliver, map_realizations, spec_json, write_spec

pytestmark = [pytest.mark.browser, on_database("sqlite")]

GRID_RENDERED = "() => document.getElementById('grid') && document.getElementById('grid').dataset.rendered === 'true'"


def wait_text(page, selector: str, text: str) -> None:
    page.wait_for_function(
        "([sel, t]) => { const e = document.querySelector(sel); return e && e.textContent.includes(t); }",
        arg=[selector, text],
    )


def row(page, index: int, role: str) -> str:
    return page.text_content(f"table.realizations tr[data-index='{index}'] [data-role={role}]").strip()


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mapped-journey")
    spec_path = write_spec(folder)
    return spec_json(spec_path), map_realizations(spec_path, folder / "maps", [0])


def test_live_table_products_panel_and_the_plans_and_products_pages(dash: Dashboard, page, mapped):
    spec, folders = mapped
    with dash.api() as client:
        campaign_id = client.post("/campaigns", json={**spec, "max_attempts": 3}).json()["id"]
    worker = dash.worker("w1")
    worker.build_plan(build_time_s=7.0)
    first, second = worker.claim(2)
    worker.start(first)

    dash.login(page)
    page.goto(dash.url + f"/campaigns/{campaign_id}")
    page.wait_for_function(GRID_RENDERED)
    page.wait_for_selector("#live-status[data-state=live]")
    assert (row(page, 0, "state"), row(page, 0, "attempts"), row(page, 0, "worker")) == ("running", "1 / 3", "w1")
    assert row(page, 2, "attempts") == "0 / 3" and row(page, 2, "worker") == "–"
    assert page.locator("#products-placeholder").count() == 1
    page.evaluate("() => { window.__sameDocument = 'yes'; }")

    # A failure: back to the queue with one attempt used; the worker that ran it stays shown, greyed.
    worker.fail(second, "app_error", exit_code=1, log_tail="boom")
    wait_text(page, "table.realizations tr[data-index='1'] [data-role=state]", "queued")
    page.wait_for_selector("table.realizations tr[data-index='1'] [data-role=worker].muted")
    assert row(page, 1, "attempts") == "1 / 3" and row(page, 1, "worker") == "w1"

    # A success with real map-maker products: the row keeps its worker and attempts; the panel appears.
    assert deliver(worker.client, first, folders[0]).status_code == 200
    wait_text(page, "table.realizations tr[data-index='0'] [data-role=state]", "succeeded")
    page.wait_for_selector("table.realizations tr[data-index='0'] [data-role=worker].muted")
    assert (row(page, 0, "attempts"), row(page, 0, "worker")) == ("1 / 3", "w1")
    assert row(page, 0, "finished").endswith("UTC")
    page.wait_for_selector("[data-chart='mc-spectra'] polyline[data-series='TT']", state="attached")
    assert page.locator("#products-placeholder").count() == 0
    assert "aggregates of 1 realisation(s)" in page.text_content("#products-panel p.small")
    assert page.evaluate("() => window.__sameDocument") == "yes", "the page reloaded"
    dash.screenshot(page, "campaign-live-table")

    # The plans page: the plan, its build time and uses, and the campaign that needs it.
    page.click("nav >> text=Plans")
    page.wait_for_url(dash.url + "/plans")
    plan = page.locator("#plans tbody tr").first
    assert plan.locator("[data-role=build-time]").text_content() == "7.0 s"
    assert plan.locator("[data-role=uses]").text_content() == "1"
    assert plan.locator("[data-role=ranks]").text_content() == str(spec["resources"]["ranks"])
    assert plan.locator("[data-role=campaigns] a").text_content() == spec["name"]
    dash.screenshot(page, "plans")

    # The products page: the campaign and its downloads, fetched with the session cookie.
    page.click("nav >> text=Products")
    page.wait_for_url(dash.url + "/products")
    links = page.locator(f"tr[data-campaign='{campaign_id}'] [data-role=downloads] a")
    names = [name.strip() for name in links.all_text_contents()]
    assert names[:8] == [
        "bandpowers.json", "bandpowers.npz", "bandpowers.fits", "spectra.json", "spectra.npz", "spectra.fits",
        "mean-map.fits", "mean-map.npz",
    ]  # fmt: skip
    answer = page.request.get(dash.url + links.nth(3).get_attribute("href"))
    assert answer.status == 200 and answer.json()["included"] == 1
    answer = page.request.get(dash.url + links.first.get_attribute("href"))
    assert answer.status == 200 and answer.json()["n"] == 1  # the bandpowers of the one realisation
    dash.screenshot(page, "products")

    # A mistyped address: the dashboard's own 404 page, with its menu; the same address as JSON for a script.
    answer = page.goto(dash.url + "/plan")
    assert answer.status == 404 and "There is no page at this address." in page.text_content("main")
    assert page.locator("nav a[href='/products']").count() == 1
    assert page.request.get(dash.url + "/plan", headers={"Accept": "application/json"}).json()["code"] == "not_found"


def map_fraction(png: bytes, box: tuple[float, float, float, float]) -> float:
    """Fraction of the map box's pixels drawn from data: neither white background nor the grey of unseen sky."""
    image = imread(io.BytesIO(png))[..., :3]
    height, width = image.shape[:2]
    left, bottom, box_width, box_height = box
    inside = image[
        int((1 - bottom - box_height) * height) : int((1 - bottom) * height),
        int(left * width) : int((left + box_width) * width),
    ]
    white = (inside > 0.97).all(axis=-1)
    grey = (abs(inside - quicklook.UNSEEN_RGBA[0]) < 0.02).all(axis=-1)
    return float((~white & ~grey).mean())


def test_a_ground_campaigns_maps_are_drawn_zoomed_on_its_patch(dash: Dashboard, page):
    spec = load_example_spec("ground").model_dump(mode="json")
    spec["realizations"] = 2
    with dash.api() as client:
        campaign_id = client.post("/campaigns", json=spec).json()["id"]
    worker = dash.worker("w1")
    worker.build_plan()
    task = worker.claim_one()
    worker.start(task)
    worker.succeed(task, nside=64, patch=(30.0, -40.0, 5.5))  # about 110 observed pixels

    dash.login(page)
    page.goto(dash.url + f"/campaigns/{campaign_id}")
    page.locator("#maps-panel").scroll_into_view_if_needed()
    page.wait_for_function(
        "() => { const all = [...document.querySelectorAll('#maps img')];"
        " return all.length === 3 && all.every(i => i.complete && i.naturalWidth > 0); }"
    )
    source = page.get_attribute("#maps img[data-field=I]", "src")
    png = page.request.get(dash.url + source).body()
    zoomed = map_fraction(png, quicklook.LAYOUTS["gnomonic"].map)
    assert zoomed > 0.5, f"the patch covers {zoomed:.0%} of the map"
    dash.screenshot(page, "ground-maps")


def test_a_one_time_login_link_logs_the_browser_in_once(dash: Dashboard, page, chromium):
    with dash.api() as client:
        answer = client.post("/login-links")
    assert answer.status_code == 201, answer.text
    link = answer.json()["url"]
    assert link.startswith(dash.url + "/login/link?secret=mcl_")

    page.goto(link)  # opening the link logs nobody in: a page names the user and asks to confirm
    assert page.text_content("#link-user") == "local"
    assert "mapcampaign_session" not in {cookie["name"] for cookie in page.context.cookies()}
    dash.screenshot(page, "login-link-confirm")
    page.click("form[action='/login/link'] button[type=submit]")
    page.wait_for_url(dash.url + "/")  # no token pasted; the secret is gone from the address bar
    assert page.text_content(".who") == "local"
    assert "mapcampaign_session" in {cookie["name"] for cookie in page.context.cookies()}

    other = new_page(chromium, dash)
    try:
        answer = other.goto(link)
        assert answer.status == 401
        assert "used already" in other.text_content("p.error")
        assert "mapcampaign login" in other.text_content("p.error")  # the command that makes a new link
        assert "mapcampaign_session" not in {cookie["name"] for cookie in other.context.cookies()}
        dash.screenshot(other, "login-link-used")
    finally:
        other.context.close()
