"""The Monte Carlo products panel in headless Chromium (SQLite and PostgreSQL), with real map-maker outputs.

Realisations of a tiny noise-only campaign are mapped once by what
``python -m mapmaker realize`` runs, under ``mpiexec -n 2`` and delivered through
the worker API; the page must draw the charts with the renderers of
``static/products.js`` (no script error, nothing refused by the
Content-Security-Policy: the ``page`` fixture checks) and follow the next
result without a reload.
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import Dashboard
from tests.support.databases import on_database
from tests.support.mapped_campaign import deliver, map_realizations, spec_json, write_spec

pytestmark = [pytest.mark.browser, on_database("postgresql")]


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mapped-browser")
    spec_path = write_spec(folder)
    return spec_json(spec_path), map_realizations(spec_path, folder / "maps", [0, 1, 2])


def test_products_panel_draws_the_mean_maps_and_spectra_and_follows_new_results(dash: Dashboard, page, mapped):
    spec, folders = mapped
    with dash.api() as client:
        campaign_id = client.post("/campaigns", json=spec).json()["id"]
    worker = dash.service.client(dash.service.worker_token)
    worker_id = worker.post("/workers", json={"name": "w1", "site": "local", "host": "h", "capacity": 4}).json()["id"]
    plan = worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 1}).json()["tasks"][0]
    built = {"path": "/p.h5", "checksum": "sha256:0", "size_bytes": 1, "build_time_s": 0.1}
    worker.post(f"/tasks/{plan['task_id']}/plan-built", json=built).raise_for_status()
    tasks = worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 3}).json()["tasks"]
    for task in tasks[:2]:
        assert deliver(worker, task, folders[task["realization"]]).status_code == 200

    dash.login(page)
    page.goto(dash.url + f"/campaigns/{campaign_id}")
    for kind in ("mc-spectra", "mc-noise-bias"):
        for series in ("TT", "EE", "BB"):
            page.wait_for_selector(f"[data-chart='{kind}'] polyline[data-series='{series}']", state="attached")
    assert page.locator("[data-chart='mc-spectra'] polygon.band").count() == 3  # the scatter bands
    assert page.locator("[data-chart='mc-transfer']").count() == 0
    page.wait_for_function(
        "() => { const all = [...document.querySelectorAll('#products-panel img')];"
        " return all.length === 3 && all.every(i => i.complete && i.naturalWidth > 0); }"
    )
    stroke = page.eval_on_selector("[data-chart='mc-spectra'] polyline[data-series='EE']", "e => e.style.stroke")
    assert stroke  # coloured through the CSSOM, which the policy allows
    page.evaluate("() => { window.__sameDocument = 'yes'; }")

    assert deliver(worker, tasks[2], folders[tasks[2]["realization"]]).status_code == 200
    page.wait_for_function(
        "() => [...document.querySelectorAll('#products-panel img')].every(i => i.getAttribute('src').endsWith('?g=3'))"
    )
    page.wait_for_function(
        "() => { const all = [...document.querySelectorAll('#products-panel img')];"
        " return all.every(i => i.complete && i.naturalWidth > 0); }"
    )
    assert "aggregates of 3 realisation(s)" in page.text_content("#products-panel p.small")
    assert page.evaluate("() => window.__sameDocument") == "yes", "the page reloaded"
    dash.screenshot(page, "campaign-products")
    worker.close()
