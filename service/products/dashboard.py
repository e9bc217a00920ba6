"""The campaign page's Monte Carlo products panel: running-mean maps (PNG) and spectra charts (JSON + SVG).

:func:`mc_products_panel` is registered with
``service.dashboard.panels.products_panel``. Once the campaign has
aggregates it shows:

* the running mean of I, Q and U (Mollweide PNGs rendered with the
  quick-look renderer from the mean map of the current generation, cached in
  ``products/cache/`` under the generation: the image URL changes when the
  mean does);
* the decoupled bandpowers first, as they are what a scientist uses: ``mc-bandpowers`` (D_b = l(l+1)
  C_b / 2 pi in uK^2 of TT, EE, BB, error bars of one realisation's scatter, the input model through the
  windows dashed when the campaign simulated a CMB sky), and ``mc-bandpower-transfer`` (the transfer
  function F_b, signal-only) or ``mc-bandpower-noise`` (N_b as D_b, noise-only) with their Monte Carlo
  errors;
* then the pseudo-C_l charts: ``mc-spectra`` (mean pseudo-spectra with a band of one realisation's
  scatter), ``mc-noise-bias`` (N_l, noise-only) or ``mc-transfer`` (the pseudo-C_l ratio F_l, labelled
  a full-sky approximation: it is biased on a masked sky);
* ``mc-transfer-matrix`` on each campaign of a pure-E / pure-B pair (a signal-only campaign of one pure
  polarisation whose owner has one of the other with the same coupling key,
  :func:`service.products.spectrum.matrix_partner`): the E/B transfer matrix's elements per bin, symlog y,
  error bars = Monte Carlo error, bins above 2 nside hollow and shaded.

Each chart's JSON flags unreliable bins (above 2 nside; for F_b and F_l also where the ratio is poorly
determined, ``campaignlib.montecarlo.transfer_unreliable``), which the renderer leaves out of the axis range
and draws hollow, and names the y scales the reader can switch between (linear, log, symlog).

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

from campaignlib import montecarlo
from schemas.files import atomic_write_bytes
from schemas.result import SpectrumName
from service.auth.session import DashboardUser
from service.campaigns import reads as campaigns
from service.dashboard.panels import ChartRef, FigureRef, ProductsPanel
from service.deps import ReadSessionDep, SettingsDep
from service.errors import InvalidField, NotFound
from service.products import formats
from service.products.aggregates import (
    AggregateState,
    BandpowerAggregates,
    bandpower_aggregates,
    load_state,
    spectra_aggregates,
)
from service.products.mapsums import mean_and_variance_maps
from service.products.service import ProductsNotReady, snapshot
from service.products.spectrum import MatrixPair, matrix_partner, sky_polarization, transfer_matrix_pair
from service.storage import CampaignProducts

FIELDS = ("I", "Q", "U")
UK2 = 1e12  # K^2 -> uK^2
CHARTS = ("spectra", "noise-bias", "transfer", "bandpowers", "bandpower-transfer", "bandpower-noise", "transfer-matrix")
# The transfer matrix's elements drawn, (out, in) over (EE, EB, BB), labelled input -> output.
MATRIX_ELEMENTS = {(0, 0): "E→E", (2, 2): "B→B", (2, 0): "E→B", (0, 2): "B→E", (1, 0): "E→EB", (1, 2): "B→EB"}
# The renderer's symlog is linear within +-1; the matrix is drawn in units of this so that leakage of
# 1e-4 .. 1e-2 of the input (the size that matters against a lensing BB 100 times below EE) is logarithmic.
MATRIX_UNIT = 1e-4

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
    # The decoupled bandpowers first: F_b and N_b are the corrections; the pseudo-C_l charts follow.
    charts = bandpower_charts(CampaignProducts(settings.products_dir, campaign.id), state, campaign.id)
    aggregates = spectra_aggregates(state)
    if aggregates is not None:
        base = f"/ui/campaigns/{campaign.id}/products"
        charts.append(
            ChartRef(
                kind="mc-spectra",
                src=f"{base}/spectra",
                title="Pseudo-spectra TT, EE, BB (C_l of the masked map): mean over realisations, band = scatter of one",
                caption=f"uK^2, bins of {aggregates.ell_bin_width} in ell up to {aggregates.lmax}; "
                f"mask w2 = {aggregates.w2:.3g}, fsky = {aggregates.fsky:.3g}",
            )
        )
        if aggregates.noise_bias_available:
            charts.append(
                ChartRef(
                    kind="mc-noise-bias",
                    src=f"{base}/noise-bias",
                    title="Pseudo-C_l noise N_l = <C~_l> / w2 (full-sky approximation), band = scatter of one "
                    "realisation",
                    caption="uK^2; the noise bias to subtract from decoupled bandpowers is N_b above",
                )
            )
        if aggregates.transfer_available:
            charts.append(
                ChartRef(
                    kind="mc-transfer",
                    src=f"{base}/transfer",
                    title="Pseudo-C_l ratio F_l = <C~_l> / (w2 C_l^in B_l^2): a full-sky approximation, biased on "
                    "a masked sky",
                    caption="the transfer function is F_b above; no pixel window (pixel-centre sampling); "
                    "hollow circles: F_l poorly determined",
                )
            )
    partner = matrix_partner(session=session, owner_id=campaign.owner_id, campaign=campaign)
    if partner is not None:
        pure_e, pure_b = (campaign, partner) if sky_polarization(campaign.spec) == "E-only" else (partner, campaign)
        charts.insert(
            0,
            ChartRef(
                kind="mc-transfer-matrix",
                src=f"/ui/campaigns/{campaign.id}/products/transfer-matrix",
                title=f"E/B transfer matrix of campaigns {pure_e.id} (pure E) and {pure_b.id} (pure B): T_b[out, in] "
                "per bin, labelled in→out, error bars = Monte Carlo error",
                caption=f"in units of {MATRIX_UNIT:g}, symlog y; E→B is the E -> B leakage that F_b folds into a "
                "factor; hollow and grey: above 2 nside; the EB column is assumed (identity)",
            ),
        )
    return ProductsPanel(figures=figures, charts=charts, note=panel_note(state))


def bandpower_charts(files: CampaignProducts, state: AggregateState, campaign_id: int) -> list[ChartRef]:
    """The decoupled-bandpower charts of a campaign with bandpower aggregates (none before the first)."""
    try:
        bandpowers = bandpower_aggregates(files, state)
    except FileNotFoundError:  # an update replaced the sums meanwhile: the charts' JSON reads the new ones
        bandpowers = None
    if bandpowers is None:
        return []
    base = f"/ui/campaigns/{campaign_id}/products"
    charts = [
        ChartRef(
            kind="mc-bandpowers",
            src=f"{base}/bandpowers",
            title="Decoupled bandpowers D_b TT, EE, BB: mean, error bars = scatter of one realisation"
            + (", dashed = input model" if bandpowers.model is not None else ""),
            caption=f"uK^2, D_b = l(l+1) C_b / 2 pi at the bin centres, bins of {bandpowers.bin_width} to "
            f"lmax {bandpowers.lmax}, {'pure' if bandpowers.purify_b else 'standard'} B; beam not deconvolved; "
            "grey: above 2 nside, where HEALPix transforms are inaccurate",
        )
    ]
    if bandpowers.transfer_available:
        charts.append(
            ChartRef(
                kind="mc-bandpower-transfer",
                src=f"{base}/bandpower-transfer",
                title="Transfer function F_b (<C_b> = F_b B_b^2 C_b^in), error bars = Monte Carlo error",
                caption="dimensionless; 1 where the map-maker loses nothing; hollow circles: unreliable bins "
                "(above 2 nside, or F_b poorly determined where the model through the beam is negligible), "
                "left out of the axis range",
            )
        )
    if bandpowers.noise_bias_available:
        charts.append(
            ChartRef(
                kind="mc-bandpower-noise",
                src=f"{base}/bandpower-noise",
                title="Noise bias N_b per bandpower as D_b, error bars = Monte Carlo error",
                caption="uK^2; subtract N_b from a data map's decoupled bandpowers",
            )
        )
    return charts


def _listed(values: np.ndarray) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in values]


def _bars(x: np.ndarray, value: np.ndarray, error: np.ndarray | None, flagged: np.ndarray) -> dict[str, Any]:
    """y, its error-bar ends (lo, hi) and which bins are unreliable; NaN (null) where undefined."""
    entry: dict[str, Any] = {"x": [float(v) for v in x], "y": _listed(value), "flagged": [bool(f) for f in flagged]}
    if error is not None:
        entry.update(lo=_listed(value - error), hi=_listed(value + error))
    return entry


def _shade(ell_lo: np.ndarray, ell_center: np.ndarray, reliable: np.ndarray) -> list[dict[str, Any]]:
    """The x range of the bins above 2 nside (from the first one's first multipole), as a grey band."""
    if reliable.all():
        return []
    first = int(np.argmin(reliable))
    return [{"from": float(ell_lo[first]), "to": float(ell_center[-1]), "label": "above 2 nside"}]


def _scale(values: np.ndarray, flagged: np.ndarray) -> str:
    """linear for F_b, unless its reliable bins span more than a decade either side of 1 (then symlog)."""
    shown = values[~flagged & np.isfinite(values)]
    return "symlog" if shown.size and np.max(np.abs(shown)) > 10 else "linear"


def bandpower_chart_data(bandpowers: BandpowerAggregates, chart: str) -> dict[str, Any]:
    """The JSON of one bandpower chart: series (label, x, y, lo/hi error-bar ends, ``flagged`` unreliable bins,
    ``model`` for overlays), the y scales the reader can choose and the first one, the x range above 2 nside."""
    x = bandpowers.ell_center
    d_ell = x * (x + 1) / (2 * np.pi) * UK2  # C_b (K^2) -> D_b (uK^2)
    names: tuple[SpectrumName, ...] = ("TT", "EE", "BB")
    rows = [0, 1, 2]
    above = ~np.asarray(bandpowers.reliable, dtype=bool)
    series: list[dict[str, Any]] = []
    if chart == "bandpowers":
        scatter = None
        if bandpowers.covariance is not None:
            scatter = np.sqrt(np.maximum(np.diag(bandpowers.covariance), 0.0)).reshape(bandpowers.mean.shape)
        for row, name in zip(rows, names, strict=True):
            error = None if scatter is None else scatter[row] * d_ell
            series.append({"label": name, **_bars(x, bandpowers.mean[row] * d_ell, error, above)})
            if bandpowers.model is not None:
                series.append({"label": name, "model": True, **_bars(x, bandpowers.model[row] * d_ell, None, above)})
        options: dict[str, Any] = {
            "yScale": "log",
            "scales": ["log", "linear"],
            "yLabel": "D_b (uK^2)",
            "reference": None,
        }
    elif chart == "bandpower-transfer" and bandpowers.transfer_available:
        value, sigma = bandpowers.transfer_function()
        flagged = montecarlo.transfer_unreliable(value, sigma, bandpowers.reliable)
        for row, name in zip(rows, names, strict=True):
            error = sigma[row] if bandpowers.n >= 2 else None
            series.append({"label": name, **_bars(x, value[row], error, flagged[row])})
        scale = _scale(value[rows], flagged[rows])
        options = {
            "yScale": scale,
            "scales": [scale, "symlog" if scale == "linear" else "linear"],
            "yLabel": "F_b",
            "reference": 1.0,
        }
    elif chart == "bandpower-noise" and bandpowers.noise_bias_available:
        value, sigma = bandpowers.noise_bias()
        for row, name in zip(rows, names, strict=True):
            error = sigma[row] * d_ell if bandpowers.n >= 2 else None
            series.append({"label": name, **_bars(x, value[row] * d_ell, error, above)})
        options = {"yScale": "log", "scales": ["log", "linear"], "yLabel": "N_b as D_b (uK^2)", "reference": None}
    else:
        options = {}
    return {
        "n": bandpowers.n,
        "xLabel": "multipole ell (bin centre)",
        "label": f"{chart} over {bandpowers.n} realisations",
        "shade": _shade(bandpowers.ell_lo, x, ~above),
        **options,
        "series": series,
    }


def matrix_chart_data(pair: MatrixPair) -> dict[str, Any]:
    """The JSON of the transfer-matrix chart (as :func:`bandpower_chart_data`'s): one series per element in units
    of :data:`MATRIX_UNIT`, with error-bar ends and the bins above 2 nside flagged."""
    bandpowers = pair.pure_e.bandpowers
    x = bandpowers.ell_center
    above = ~np.asarray(bandpowers.reliable, dtype=bool)
    n = min(pair.matrix.n_e, pair.matrix.n_b)
    series = []
    for (out, into), label in MATRIX_ELEMENTS.items():
        error = pair.matrix.error[:, out, into] / MATRIX_UNIT if n >= 2 else None
        series.append({"label": label, **_bars(x, pair.matrix.matrix[:, out, into] / MATRIX_UNIT, error, above)})
    return {
        "n": n,
        "generation": pair.pure_e.state.generation + pair.pure_b.state.generation,
        "xLabel": "multipole ell (bin centre)",
        "yLabel": f"T_b[out, in] / {MATRIX_UNIT:g}",
        "label": f"E/B transfer matrix from {pair.matrix.n_e} pure-E and {pair.matrix.n_b} pure-B realisations",
        "shade": _shade(bandpowers.ell_lo, x, ~above),
        "yScale": "symlog",
        "scales": ["symlog", "linear"],
        "reference": None,
        "unit": MATRIX_UNIT,
        "series": series,
    }


def transfer_matrix_chart(session: Any, user: Any, campaign_id: int, products_dir: Path) -> dict[str, Any]:
    """The matrix chart's JSON for a campaign of a pair; no series (with a note) while the pair cannot give one."""
    campaign = campaigns.get_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id)
    partner = matrix_partner(session=session, owner_id=user.user_id, campaign=campaign)
    if partner is None:
        return {"generation": 0, "series": [], "note": "no campaign of the other pure polarisation shares its coupling"}
    pure_e, pure_b = (campaign, partner) if sky_polarization(campaign.spec) == "E-only" else (partner, campaign)
    try:
        pair = transfer_matrix_pair(
            session=session, owner_id=user.user_id, products_dir=products_dir, pure_e_id=pure_e.id, pure_b_id=pure_b.id
        )
    except (ProductsNotReady, InvalidField) as not_yet:
        return {"generation": 0, "series": [], "note": str(not_yet)}
    return matrix_chart_data(pair)


def panel_note(state: AggregateState) -> str:
    return (
        f"Monte Carlo aggregates of {state.n_included} realisation(s): "
        f"{state.n_spectra} with spectra, {state.n_maps} with maps."
    )


def _series(
    x: np.ndarray,
    values: dict[str, tuple[np.ndarray, np.ndarray | None]],
    scale: float,
    log: bool,
    flagged: dict[str, np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    series = []
    for name, (value, scatter) in values.items():
        y = np.asarray(value, dtype=np.float64) * scale
        entry: dict[str, Any] = {"label": name, "x": [float(v) for v in x], "y": _listed(y)}
        if scatter is not None:
            spread = np.asarray(scatter, dtype=np.float64) * scale
            lo, hi = y - spread, y + spread
            if log:
                lo = np.where(lo > 0, lo, np.nan)
            entry["lo"] = _listed(lo)
            entry["hi"] = _listed(hi)
        if flagged is not None:
            entry["flagged"] = [bool(f) for f in flagged[name]]
        series.append(entry)
    return series


def chart_data(state: AggregateState, chart: str, files: CampaignProducts | None = None) -> dict[str, Any]:
    """What the renderer of one chart draws (``MapCampaign.charts.lines`` options plus a generation)."""
    if chart.startswith("bandpower"):
        bandpowers = None if files is None else bandpower_aggregates(files, state)
        if bandpowers is None:
            return {"generation": state.generation, "series": []}
        return {"generation": state.generation, "note": panel_note(state), **bandpower_chart_data(bandpowers, chart)}
    aggregates = spectra_aggregates(state)
    if aggregates is None:
        return {"generation": state.generation, "series": []}
    names: tuple[SpectrumName, ...] = ("TT", "EE", "BB")
    x = aggregates.ell_center
    if chart == "spectra":
        values: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
            name: (aggregates.mean[name], aggregates.std[name] if aggregates.std else None) for name in names
        }
        options: dict[str, Any] = {
            "yScale": "log",
            "scales": ["log", "linear"],
            "yLabel": "pseudo-C_l (uK^2)",
            "series": _series(x, values, UK2, True),
        }
    elif chart == "noise-bias" and aggregates.noise_bias_available:
        bias = aggregates.noise_bias()
        options = {
            "yScale": "log",
            "scales": ["log", "linear"],
            "yLabel": "N_l (uK^2)",
            "series": _series(x, {name: bias[name] for name in names}, UK2, True),
        }
    elif chart == "transfer" and aggregates.transfer_available:
        transfer = aggregates.transfer_function()
        n = max(aggregates.n, 1)
        flagged = {  # the F_b rule on the scatter of the mean (std / sqrt(n)); the bins end at 2 nside
            name: montecarlo.transfer_unreliable(
                value, np.full_like(value, np.nan) if std is None else std / np.sqrt(n), np.ones(len(value), bool)
            )
            for name, (value, std) in transfer.items()
        }
        options = {
            "yScale": "linear",
            "scales": ["linear", "symlog"],
            "yLabel": "F_l (full-sky approximation)",
            "reference": 1.0,
            "series": _series(x, transfer, 1.0, False, flagged),
        }
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
    if chart == "transfer-matrix":
        payload = transfer_matrix_chart(session, user, campaign_id, settings.products_dir)
        return JSONResponse(payload, headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
    _owned(session, user, campaign_id)
    files = CampaignProducts(settings.products_dir, campaign_id)
    try:
        payload = snapshot(files, lambda state: chart_data(state, chart, files))
    except ProductsNotReady:
        payload = {"generation": 0, "series": []}
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
