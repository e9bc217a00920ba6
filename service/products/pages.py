"""The dashboard's products page (``/products``) and the browser downloads of a campaign's aggregates.

The page lists the user's campaigns that have Monte Carlo aggregates, each with
links to the same files the REST API serves
(``/api/v1/campaigns/{id}/products/...``: the bandpowers with F_b, N_b and the covariance, the
pseudo-spectra, the maps and the mask), here under
``/campaigns/{id}/downloads/{name}`` for a browser logged in with the session
cookie. It lives with the products, not in the dashboard package, because it
reads their state (the dashboard never imports the products; they import it).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

from service.auth.session import DashboardUser
from service.campaigns import reads as campaigns
from service.config import Settings
from service.dashboard.router import render
from service.deps import ReadSessionDep, RowId, SettingsDep
from service.errors import NotFound
from service.products import service as products
from service.products.aggregates import load_state
from service.storage import CampaignProducts

router = APIRouter(include_in_schema=False)

# The files the page links to: name -> (what, format), as the REST API's routes name them.
DOWNLOADS = {
    "bandpowers.json": ("bandpowers", "json"),
    "bandpowers.npz": ("bandpowers", "npz"),
    "bandpowers.fits": ("bandpowers", "fits"),
    "spectra.json": ("spectra", "json"),
    "spectra.npz": ("spectra", "npz"),
    "spectra.fits": ("spectra", "fits"),
    "mean-map.fits": ("mean-map", "fits"),
    "mean-map.npz": ("mean-map", "npz"),
    "variance-map.fits": ("variance-map", "fits"),
    "variance-map.npz": ("variance-map", "npz"),
    "mask.fits": ("mask", "fits"),
    "mask.npz": ("mask", "npz"),
}
PAGE_CAMPAIGNS = 200  # the newest campaigns of the user looked at (one small state file read each)


def products_page_context(*, session: Any, owner_id: int, settings: Settings) -> dict[str, Any]:
    """The owner's newest campaigns that have Monte Carlo aggregates, with what can be downloaded of each."""
    rows, _ = campaigns.list_campaigns(session=session, owner_id=owner_id, limit=PAGE_CAMPAIGNS)
    items = []
    for campaign in rows:
        state = load_state(CampaignProducts(settings.products_dir, campaign.id))
        if state is None or not state.has_products:
            continue
        offered = []
        if state.n_bandpowers:
            offered += ["bandpowers.json", "bandpowers.npz", "bandpowers.fits"]
        if state.n_spectra:
            offered += ["spectra.json", "spectra.npz", "spectra.fits"]
        if state.n_maps:
            offered += ["mean-map.fits", "mean-map.npz"]
        if state.n_maps >= 2:
            offered += ["variance-map.fits", "variance-map.npz"]
        if state.mask is not None:
            offered += ["mask.fits", "mask.npz"]
        items.append(
            {
                "campaign": campaign,
                "included": state.n_included,
                "spectra": state.n_spectra,
                "maps": state.n_maps,
                "downloads": offered,
            }
        )
    return {"items": items, "limit": PAGE_CAMPAIGNS}


@router.get("/products", response_class=HTMLResponse)
def products_page(request: Request, user: DashboardUser, session: ReadSessionDep, settings: SettingsDep) -> Response:
    context = products_page_context(session=session, owner_id=user.user_id, settings=settings)
    return render(request, "products.html", context, user=user)


@router.get("/campaigns/{campaign_id}/downloads/{name}")
def product_download(
    campaign_id: RowId, name: str, user: DashboardUser, session: ReadSessionDep, settings: SettingsDep
) -> Response:
    """A file of the campaign's Monte Carlo aggregates (the REST API's, for a browser with the session cookie)."""
    if name not in DOWNLOADS:
        raise NotFound(f"no download {name!r}; one of {', '.join(DOWNLOADS)}")
    what, fmt = DOWNLOADS[name]
    if what == "bandpowers":
        download = products.bandpower_download(
            session=session, owner_id=user.user_id, campaign_id=campaign_id, products_dir=settings.products_dir, fmt=fmt
        )
    elif what == "spectra":
        download = products.spectra_download(
            session=session, owner_id=user.user_id, campaign_id=campaign_id, products_dir=settings.products_dir, fmt=fmt
        )
    else:
        download = products.map_download(
            session=session,
            owner_id=user.user_id,
            campaign_id=campaign_id,
            products_dir=settings.products_dir,
            which=what,
            fmt=fmt,
        )
    return FileResponse(
        download.path,
        media_type=download.media_type,
        filename=download.filename,
        headers={"Cache-Control": "private, no-cache", "X-Content-Type-Options": "nosniff"},
    )
