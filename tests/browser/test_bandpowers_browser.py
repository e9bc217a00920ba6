"""The products panel's decoupled-bandpower charts in headless Chromium (SQLite and PostgreSQL).

Three signal-only realisations made by the real bandpower code (``mapmaker.model.bandpowers`` on healpy
skies, as in ``tests/api/test_bandpowers_api.py``) are delivered through the worker API; the campaign page
must draw D_b of TT, EE and BB with error bars and the input model dashed, the transfer function F_b with its
axis range set by the reliable bins and the unreliable ones marked (hollow circles; the bins above 2 nside
shaded), switch the y axis on the toggle and zoom on a drag, with no script error and nothing refused by
the Content-Security-Policy (the ``page`` fixture checks).
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from tests.api.test_bandpowers_api import Skies, campaign_spec, refolder
from tests.browser.conftest import Dashboard
from tests.support.databases import on_database
from tests.support.mapped_campaign import deliver

pytestmark = [pytest.mark.browser, on_database("sqlite")]


@pytest.fixture(scope="module")
def signal_only(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bandpower-browser")
    spec = {**campaign_spec("signal-only"), "realizations": 3}
    with threadpool_limits(limits=1, user_api="openmp"):
        made = Skies(folder)
        generator = np.random.default_rng(7)
        paths = [made.realization_folder(spec, "signal-only", index, generator) for index in range(3)]
    return spec, [refolder(spec, path, folder / "delivered" / path.name) for path in paths]


def test_bandpower_charts_draw_error_bars_the_model_and_toggle_the_axis(dash: Dashboard, page, signal_only):
    spec, folders = signal_only
    with dash.api() as client:
        campaign_id = client.post("/campaigns", json=spec).json()["id"]
    worker = dash.service.client(dash.service.worker_token)
    worker_id = worker.post("/workers", json={"name": "w1", "site": "local", "host": "h", "capacity": 4}).json()["id"]
    plan = worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 1}).json()["tasks"][0]
    built = {"path": "/p.h5", "checksum": "sha256:0", "size_bytes": 1, "build_time_s": 0.1}
    worker.post(f"/tasks/{plan['task_id']}/plan-built", json=built).raise_for_status()
    for task in worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 3}).json()["tasks"]:
        assert deliver(worker, task, folders[task["realization"]]).status_code == 200

    dash.login(page)
    page.goto(dash.url + f"/campaigns/{campaign_id}")
    chart = "[data-chart='mc-bandpowers']"
    for series in ("TT", "EE", "BB"):
        page.wait_for_selector(f"{chart} polyline.data[data-series='{series}']", state="attached")
        page.wait_for_selector(
            f"[data-chart='mc-bandpower-transfer'] polyline[data-series='{series}']", state="attached"
        )
    assert page.locator(f"{chart} polyline.model").count() == 3  # the input model, one per spectrum
    assert page.locator(f"{chart} polyline.errbar").count() > 3 * 5  # error bars on the bins
    assert page.locator("[data-chart='mc-bandpower-noise']").count() == 0  # signal-only: no noise bias
    dash_array = page.eval_on_selector(f"{chart} polyline.model", "e => e.style.strokeDasharray")
    assert dash_array  # dashed through the CSSOM

    def tick_labels() -> list[str]:
        return page.eval_on_selector_all(f"{chart} g.axis text", "all => all.map(t => t.textContent)")

    assert page.get_attribute(chart, "data-y-scale") == "log" and any(t.startswith("1e") for t in tick_labels())
    toggle = page.locator(f"figure:has({chart}) button.axis-toggle")
    assert toggle.text_content() == "linear y axis"
    toggle.click()
    page.wait_for_function(f"() => document.querySelector(\"{chart}\").dataset.yScale === 'linear'")
    assert not any(t.startswith("1e") for t in tick_labels()), tick_labels()
    assert page.locator(f"{chart} polyline.model").count() == 3  # redrawn with everything
    check_the_transfer_chart(page, campaign_id)
    # the PCG chart of these 3-entry residual histories: iterations are whole numbers, and so are its x ticks
    page.wait_for_selector("#convergence-chart polyline", state="attached")
    x_ticks = page.eval_on_selector_all(
        "#convergence-chart g.axis text[text-anchor='middle']", "all => all.map(t => t.textContent)"
    )
    assert x_ticks and all(tick.lstrip("-").isdigit() for tick in x_ticks), x_ticks
    dash.screenshot(page, "campaign-bandpowers")
    worker.close()


def check_the_transfer_chart(page, campaign_id: int) -> None:
    """F_b of a masked signal-only campaign: the y range covers the reliable bins with their error bars and
    not much more, the flagged bins (above 2 nside; BB, where E leaks into B) are hollow circles, the bins
    above 2 nside are shaded; a drag zooms the x range and "reset zoom" undoes it."""
    chart = "[data-chart='mc-bandpower-transfer']"
    data = page.evaluate(
        f"() => fetch('/ui/campaigns/{campaign_id}/products/bandpower-transfer').then(answer => answer.json())"
    )
    reliable, flagged_values = [], []
    for series in data["series"]:
        for i, flagged in enumerate(series["flagged"]):
            values = [v for v in (series["y"][i], series["lo"][i], series["hi"][i]) if v is not None]
            (flagged_values if flagged else reliable).extend(values)
    assert reliable and flagged_values
    low, high = min(reliable), max(reliable)
    span = max(high - low, 0.1)
    y_low, y_high = (float(page.eval_on_selector(f"{chart} svg", f"s => s.dataset.{k}")) for k in ("yLow", "yHigh"))
    assert page.get_attribute(chart, "data-y-scale") == "linear"
    assert low - span <= y_low <= low and high <= y_high <= high + span, (y_low, y_high, low, high)
    assert any(not y_low <= v <= y_high for v in flagged_values), "no unreliable bin lies off the reliable range"
    n_flagged = sum(f and y is not None for s in data["series"] for f, y in zip(s["flagged"], s["y"], strict=True))
    assert page.locator(f"{chart} circle.unreliable").count() == n_flagged
    assert page.locator(f"{chart} rect.unreliable-region").count() == 1
    assert page.locator(f"{chart} polyline.errbar").count() == sum(
        not f and lo is not None for s in data["series"] for f, lo in zip(s["flagged"], s["lo"], strict=True)
    )

    page.locator(f"{chart} svg").scroll_into_view_if_needed()
    box = page.locator(f"{chart} svg").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    page.wait_for_function(f"() => document.querySelector(\"{chart}\").dataset.xRange !== undefined")
    full_high = max(x for s in data["series"] for x in s["x"])
    zoomed_high = float(page.eval_on_selector(f"{chart} svg", "s => s.dataset.xHigh"))
    assert zoomed_high < 0.7 * full_high
    page.click(f"figure:has({chart}) button.zoom-reset")
    page.wait_for_function(f"() => document.querySelector(\"{chart}\").dataset.xRange === undefined")
    assert float(page.eval_on_selector(f"{chart} svg", "s => s.dataset.xHigh")) == full_high
