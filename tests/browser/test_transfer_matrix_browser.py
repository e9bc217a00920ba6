"""The products panel's E/B transfer-matrix chart in headless Chromium (SQLite and PostgreSQL).

A pure-E and a pure-B signal-only campaign (3 realisations each, real pure-B MASTER bandpowers of the
map-maker's pure skies, as in ``tests/api/test_transfer_matrix_api.py``) are delivered through the worker API;
the pure-B campaign's page must draw every element of the matrix with error bars on a symlog axis, the bins
above 2 nside hollow on a grey band, with no script error and nothing refused by the Content-Security-Policy
(the ``page`` fixture checks).
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from tests.api.test_bandpowers_api import refolder
from tests.api.test_transfer_matrix_api import PureSkies, campaign_spec
from tests.browser.conftest import Dashboard
from tests.support.databases import on_database
from tests.support.mapped_campaign import deliver_all

pytestmark = [pytest.mark.browser, on_database("postgresql")]

ELEMENTS = ("E→E", "B→B", "E→B", "B→E", "E→EB", "B→EB")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix-browser")
    made_folders = {}
    with threadpool_limits(limits=1, user_api="openmp"):
        made = PureSkies(folder)
        for seed, role in enumerate(("E-only", "B-only")):
            spec = {**campaign_spec(role), "realizations": 3}
            generator = np.random.default_rng(50 + seed)
            paths = [made.realization_folder(spec, role, index, generator) for index in range(3)]
            made_folders[role] = (spec, [refolder(spec, path, folder / "delivered" / path.name) for path in paths])
    return made_folders


def test_the_matrix_chart_draws_every_element_on_a_symlog_axis(dash: Dashboard, page, pair):
    worker = dash.service.client(dash.service.worker_token)
    worker_id = worker.post("/workers", json={"name": "w1", "site": "local", "host": "h", "capacity": 8}).json()["id"]
    ids = {}
    for role, (spec, folders) in pair.items():
        with dash.api() as client:
            ids[role] = client.post("/campaigns", json=spec).json()["id"]
        deliver_all(worker, worker_id, folders)

    dash.login(page)
    page.goto(dash.url + f"/campaigns/{ids['B-only']}")
    chart = "[data-chart='mc-transfer-matrix']"
    for label in ELEMENTS:
        page.wait_for_selector(f"{chart} polyline.data[data-series='{label}']", state="attached")
    data = page.evaluate(
        f"() => fetch('/ui/campaigns/{ids['B-only']}/products/transfer-matrix').then(answer => answer.json())"
    )
    assert page.get_attribute(chart, "data-y-scale") == "symlog"
    n_flagged = sum(f and y is not None for s in data["series"] for f, y in zip(s["flagged"], s["y"], strict=True))
    assert n_flagged and page.locator(f"{chart} circle.unreliable").count() == n_flagged
    assert page.locator(f"{chart} rect.unreliable-region").count() == 1
    assert page.locator(f"{chart} polyline.errbar").count() > 0
    ticks = page.eval_on_selector_all(f"{chart} g.axis text[text-anchor='end']", "all => all.map(t => t.textContent)")
    assert "0" in ticks and any(t.startswith("-") for t in ticks), ticks  # both signs: a symlog axis
    colour = page.eval_on_selector(f"{chart} polyline.data[data-series='E→B']", "e => e.style.stroke")
    assert colour  # coloured through the CSSOM
    dash.screenshot(page, "campaign-transfer-matrix")
    worker.close()
