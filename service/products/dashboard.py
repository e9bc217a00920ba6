"""The campaign page's Monte Carlo products panel: running-mean maps (PNG) and spectra charts (JSON + SVG).

:func:`mc_products_panel` is registered with
``service.dashboard.panels.products_panel``. Once the campaign has
aggregates it shows:

* the running mean of I, Q and U (Mollweide PNGs rendered with the
  quick-look renderer from the mean map of the current generation, cached in
  ``products/cache/`` under the generation: the image URL changes when the
  mean does);
* ``mc-spectra``: mean pseudo-spectra TT, EE, BB with a band of one
  realisation's scatter (log scale, uK^2);
* ``mc-noise-bias`` (noise-only): N_l TT, EE, BB with its scatter (uK^2), or
  ``mc-transfer`` (signal-only with a CMB sky): F_l TT, EE, BB with its scatter.

The charts are drawn by the renderers that ``static/products.js`` registers
with ``MapCampaign.charts.register``; the campaign page re-fetches them after
each succeeded realisation, and the renderer then points the images at the new
generation. Reading the panel touches no database: the state is a file.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from schemas.files import atomic_write_bytes
from schemas.result import SpectrumName
from service.campaigns import service as campaigns
from service.dashboard.panels import ChartRef, FigureRef, ProductsPanel
from service.dashboard.session import DashboardUser
from service.deps import ReadSessionDep, SettingsDep
from service.errors import NotFound
from service.products import formats
from service.products.aggregates import (
    AggregateState,
    load_state,
    mean_and_variance_maps,
    spectra_aggregates,
)
from service.products.service import ProductsNotReady, snapshot
from service.storage import CampaignProducts

FIELDS = ("I", "Q", "U")
UK2 = 1e12  # K^2 -> uK^2
CHARTS = ("spectra", "noise-bias", "transfer")

_render_lock = threading.Lock()  # one render at a time per process: the CPU is shared with the workers

router = APIRouter(include_in_schema=False)


def mc_products_panel(*, session: Any, campaign: Any, settings: Any) -> ProductsPanel | None:
    """The panel for a campaign with aggregates; None before its first included realisation with products."""
    state = load_state(CampaignProducts(settings.products_dir, campaign.id))
    if state is None or not state.has_products:
        return None
    figures = []
    if state.n_maps:
        figures = [
            FigureRef(
                title=f"Running mean, {field}",
                src=f"/campaigns/{campaign.id}/products/mean-{field}.png?g={state.generation}",
                alt=f"Mollweide map of the mean {field} over {state.n_maps} realisations",
            )
            for field in FIELDS
        ]
    charts = []
    aggregates = spectra_aggregates(state)
    if aggregates is not None:
        base = f"/ui/campaigns/{campaign.id}/products"
        charts.append(
            ChartRef(
                kind="mc-spectra",
                src=f"{base}/spectra",
                title="Pseudo-spectra TT, EE, BB: mean over realisations, band = scatter of one",
                caption=f"uK^2, bins of {aggregates.ell_bin_width} in ell up to {aggregates.lmax}; "
                f"mask w2 = {aggregates.w2:.3g}, fsky = {aggregates.fsky:.3g}",
            )
        )
        if aggregates.noise_bias_available:
            charts.append(
                ChartRef(
                    kind="mc-noise-bias",
                    src=f"{base}/noise-bias",
                    title="Noise bias N_l = <C~_l> / w2, band = scatter of one realisation",
                    caption="uK^2; subtract w2 N_l from a masked map's pseudo-spectrum",
                )
            )
        if aggregates.transfer_available:
            charts.append(
                ChartRef(
                    kind="mc-transfer",
                    src=f"{base}/transfer",
                    title="Transfer function F_l = <C~_l> / (w2 C_l^in B_l^2), band = scatter of one realisation",
                    caption="no pixel window: the simulated sky is sampled at pixel centres",
                )
            )
    return ProductsPanel(figures=figures, charts=charts, note=panel_note(state))


def panel_note(state: AggregateState) -> str:
    return (
        f"Monte Carlo aggregates of {state.n_included} realisation(s): "
        f"{state.n_spectra} with spectra, {state.n_maps} with maps."
    )


def _series(
    x: np.ndarray, values: dict[str, tuple[np.ndarray, np.ndarray | None]], scale: float, log: bool
) -> list[dict[str, Any]]:
    series = []
    for name, (value, scatter) in values.items():
        y = np.asarray(value, dtype=np.float64) * scale
        entry: dict[str, Any] = {
            "label": name,
            "x": [float(v) for v in x],
            "y": [float(v) if np.isfinite(v) else None for v in y],
            "cls": f"mc-{name}",
            "bandCls": f"mc-{name}",
        }
        if scatter is not None:
            spread = np.asarray(scatter, dtype=np.float64) * scale
            lo, hi = y - spread, y + spread
            if log:
                lo = np.where(lo > 0, lo, np.nan)
            entry["lo"] = [float(v) if np.isfinite(v) else None for v in lo]
            entry["hi"] = [float(v) if np.isfinite(v) else None for v in hi]
        series.append(entry)
    return series


def chart_data(state: AggregateState, chart: str) -> dict[str, Any]:
    """What the renderer of one chart draws (``MapCampaign.charts.lines`` options plus a generation)."""
    aggregates = spectra_aggregates(state)
    if aggregates is None:
        return {"generation": state.generation, "series": []}
    names: tuple[SpectrumName, ...] = ("TT", "EE", "BB")
    x = aggregates.ell_center
    if chart == "spectra":
        values: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
            name: (aggregates.mean[name], aggregates.std[name] if aggregates.std else None) for name in names
        }
        options = {"logY": True, "yLabel": "pseudo-C_l (uK^2)", "series": _series(x, values, UK2, True)}
    elif chart == "noise-bias" and aggregates.noise_bias_available:
        bias = aggregates.noise_bias()
        options = {
            "logY": True,
            "yLabel": "N_l (uK^2)",
            "series": _series(x, {name: bias[name] for name in names}, UK2, True),
        }
    elif chart == "transfer" and aggregates.transfer_available:
        options = {"logY": False, "yLabel": "F_l", "series": _series(x, aggregates.transfer_function(), 1.0, False)}
    else:
        options = {"series": []}
    return {
        "generation": state.generation,
        "note": panel_note(state),
        "n": aggregates.n,
        "xLabel": "multipole ell (bin centre)",
        **options,
        "label": f"{chart} over {aggregates.n} realisations",
    }


def _owned(session: Any, user: Any, campaign_id: int) -> None:
    campaigns.get_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id)


@router.get("/ui/campaigns/{campaign_id}/products/{chart}")
def products_chart(
    campaign_id: int, chart: str, user: DashboardUser, session: ReadSessionDep, settings: SettingsDep
) -> JSONResponse:
    if chart not in CHARTS:
        raise NotFound(f"no products chart {chart!r}")
    _owned(session, user, campaign_id)
    state = load_state(CampaignProducts(settings.products_dir, campaign_id))
    payload = {"generation": 0, "series": []} if state is None else chart_data(state, chart)
    return JSONResponse(payload, headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


def mean_map_png(files: CampaignProducts, field: str) -> Path:
    """The PNG of one field of the current mean map, rendering the three fields if missing."""

    def build(state: AggregateState) -> Path:
        target = files.cache_path(state.generation, f"mean-{field}.png")
        if target.is_file():
            return target
        with _render_lock:
            if target.is_file():
                return target
            from service.dashboard.quicklook import render_iqu  # deferred: brings matplotlib (about 2 s)

            fits_path = files.cache_path(state.generation, "mean-map-quicklook.fits")
            if not fits_path.is_file():
                maps = mean_and_variance_maps(files, state)
                if maps is None:
                    raise ProductsNotReady(f"campaign {files.campaign_id} has no mean map yet")
                formats.write_map_fits(fits_path, maps[0], ["MEAN_I", "MEAN_Q", "MEAN_U"], "K", [])
            images = render_iqu(fits_path, title=f"mean of {state.n_maps}")
            for name, png in images.items():
                atomic_write_bytes(files.cache_path(state.generation, f"mean-{name}.png"), png)
        return target

    return snapshot(files, build)


@router.get("/campaigns/{campaign_id}/products/mean-{field}.png")
async def products_mean_image(
    request: Request, campaign_id: int, field: str, user: DashboardUser, settings: SettingsDep
) -> Response:
    if field not in FIELDS:
        raise NotFound(f"no map field {field!r}; use I, Q or U")
    database = request.app.state.database

    def find() -> None:
        with database.session(write=False) as session:
            _owned(session, user, campaign_id)

    await anyio.to_thread.run_sync(find)
    files = CampaignProducts(settings.products_dir, campaign_id)
    png = await anyio.to_thread.run_sync(lambda: mean_map_png(files, field))
    return FileResponse(png, media_type="image/png", headers={"Cache-Control": "private, max-age=60"})
