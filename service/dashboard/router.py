"""HTTP for the dashboard: pages at ``/``, JSON and the event stream under ``/ui``, static files at ``/static``.

Pages and ``/ui`` authenticate with the session cookie (:mod:`service.auth.session`; the login and logout
routes are :mod:`service.auth.pages`, drawn with this module's :func:`render`); a page without a session
redirects to the login form, ``/ui`` answers 401. Errors of a page (another user's campaign: 404) are HTML
pages drawn by :func:`error_page`: :mod:`service.errors` decides which errors get one.
"""

from __future__ import annotations

import hashlib
import mimetypes
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import anyio
from fastapi import APIRouter, Form, Header, Query, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, StreamingResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from schemas.api import CAMPAIGN_STATES, FAILURE_CLASSES, REALIZATION_STATES
from schemas.states import CampaignState, RealizationState
from service.auth.session import CSRF_FIELD, DashboardUser, check_csrf, optional_session
from service.campaigns import lifecycle
from service.campaigns import reads as campaigns
from service.dashboard import queries
from service.dashboard import service as dashboard
from service.dashboard.quicklook import FIELDS, MapUnreadable, quicklook_png
from service.db import utcnow
from service.deps import (
    EventPositionQuery,
    ReadSessionDep,
    RealizationIndex,
    RowId,
    RowIdQuery,
    SessionDep,
    SettingsDep,
)
from service.errors import NotFound, page_redirect
from service.events.router import open_event_stream
from service.keptfiles import kept_source, sites_with_workers
from service.storage import ArtifactStore, CampaignProducts, CampaignStorage

HERE = Path(__file__).parent
TEMPLATES_DIR = HERE / "templates"
STATIC_DIR = HERE / "static"

SECURITY_HEADERS = {
    # Scripts, styles, images and fonts come from this service only; no inline script can run.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}

NOTICES = {
    "cancelled": "Campaign cancelled.",
    "retried": "Failed realisations are back in the queue.",
    "nothing-to-retry": "No failed realisations to retry.",
}


# --------------------------------------------------------------------------- templates


def _ago(moment: datetime | None) -> str:
    if moment is None:
        return "never"
    seconds = max((utcnow() - moment).total_seconds(), 0.0)
    return f"{_duration(seconds)} ago"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = float(seconds)
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "–"


def _size(size: int | None) -> str:
    if size is None:
        return "–"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"


def _between(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "–"
    return _duration((end - start).total_seconds())


@lru_cache
def static_version() -> str:
    """A digest of the static files: their URLs change when they do, so browsers may cache them."""
    digest = hashlib.sha256()
    for path in sorted(STATIC_DIR.rglob("*")):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _static(name: str) -> str:
    return f"/static/{quote(name)}?v={static_version()}"


def _make_environment() -> Environment:
    environment = Environment(
        loader=FileSystemLoader(TEMPLATES_DIR), autoescape=True, undefined=StrictUndefined, trim_blocks=True
    )
    environment.filters.update(ago=_ago, duration=_duration, when=_when, size=_size)
    environment.globals.update(
        static=_static,
        between=_between,
        csrf_field=CSRF_FIELD,
        campaign_states=CAMPAIGN_STATES,
        realization_states=REALIZATION_STATES,
        failure_classes=FAILURE_CLASSES,
        state_codes=queries.STATE_CODES,
    )
    return environment


templates = _make_environment()


def render(
    request: Request, name: str, context: dict[str, Any], *, user: Any = None, status_code: int = 200
) -> HTMLResponse:
    page = templates.get_template(name).render(
        request=request,
        user=user,
        csrf_token=user.csrf_token if user is not None else "",
        **context,
    )
    return HTMLResponse(page, status_code=status_code, headers={"Cache-Control": "no-store", **SECURITY_HEADERS})


# --------------------------------------------------------------------------- routes


async def error_page(request: Request, status_code: int, detail: str) -> HTMLResponse:
    """The dashboard's error page, with the user's menu when the request has a valid session cookie."""

    def who() -> Any:
        try:
            return optional_session(request)  # the page's own dependency has often looked already
        except Exception:  # noqa: BLE001 -- the error page must not fail for want of a session
            return None

    user = await anyio.to_thread.run_sync(who)
    titles = {
        401: "Log in first",
        403: "Not allowed",
        404: "Not found",
        409: "Not possible now",
        422: "Not a valid address",
    }
    return render(
        request,
        "error.html",
        {"status_code": status_code, "title": titles.get(status_code, "Error"), "detail": detail},
        user=user,
        status_code=status_code,
    )


pages = APIRouter(include_in_schema=False)
ui = APIRouter(prefix="/ui", include_in_schema=False)


@pages.get("/", response_class=HTMLResponse)
def overview(
    request: Request,
    user: DashboardUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    state: CampaignState | None = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Response:
    context = dashboard.overview(
        session=session, owner_id=user.user_id, settings=settings, state=state, name=name or None, cursor=cursor
    )
    filters = {key: value for key, value in (("state", state), ("name", name)) if value}
    next_url = "/?" + urlencode({**filters, "cursor": context["next_cursor"]}) if context["next_cursor"] else None
    return render(
        request,
        "overview.html",
        {**context, "state": state or "", "name": name or "", "next_url": next_url, "first_page": cursor is None},
        user=user,
    )


@pages.get("/campaigns/{campaign_id}", response_class=HTMLResponse)
def campaign_page(
    request: Request,
    campaign_id: RowId,
    user: DashboardUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    state: RealizationState | None = None,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Response:
    context = dashboard.campaign_page(
        session=session, owner_id=user.user_id, campaign_id=campaign_id, settings=settings, state=state, cursor=cursor
    )
    base = f"/campaigns/{campaign_id}"
    next_cursor = context["realizations_next_cursor"]
    next_url = (
        f"{base}?" + urlencode({**({"state": state} if state else {}), "cursor": next_cursor}) if next_cursor else None
    )
    notice = NOTICES.get(request.query_params.get("notice", ""), "")
    return render(
        request,
        "campaign.html",
        {**context, "next_url": next_url, "first_page": cursor is None, "notice": notice},
        user=user,
    )


@pages.get("/campaigns/{campaign_id}/realizations/{index}", response_class=HTMLResponse)
def realization_page(
    request: Request,
    campaign_id: RowId,
    index: RealizationIndex,
    user: DashboardUser,
    session: ReadSessionDep,
    settings: SettingsDep,
) -> Response:
    context = dashboard.realization_page(
        session=session, owner_id=user.user_id, campaign_id=campaign_id, index=index, products_dir=settings.products_dir
    )
    return render(request, "realization.html", context, user=user)


@pages.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request, user: DashboardUser, session: ReadSessionDep) -> Response:
    workers = dashboard.workers_page(session=session, owner_id=user.user_id)
    return render(request, "workers.html", {"workers": workers}, user=user)


@pages.get("/plans", response_class=HTMLResponse)
def plans_page(request: Request, user: DashboardUser, session: ReadSessionDep) -> Response:
    return render(request, "plans.html", dashboard.plans_page(session=session, owner_id=user.user_id), user=user)


@pages.post("/campaigns/{campaign_id}/cancel")
def cancel(
    request: Request,
    campaign_id: RowId,
    user: DashboardUser,
    session: SessionDep,
    settings: SettingsDep,
    csrf_token: Annotated[str, Form(max_length=200)] = "",
    reason: Annotated[str, Form(max_length=1_000)] = "",
) -> Response:
    check_csrf(request, user, csrf_token)
    reason = reason.strip() or f"cancelled by {user.user_name} in the dashboard"
    campaign = lifecycle.cancel_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id, reason=reason)
    ArtifactStore(settings.products_dir).discard(campaign_id=campaign.id)  # uploads of attempts that will not finish
    return page_redirect(f"/campaigns/{campaign.id}?notice=cancelled")


@pages.post("/campaigns/{campaign_id}/retry")
def retry(
    request: Request,
    campaign_id: RowId,
    user: DashboardUser,
    session: SessionDep,
    csrf_token: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    check_csrf(request, user, csrf_token)
    campaign, requeued = lifecycle.retry_failed(session=session, owner_id=user.user_id, campaign_id=campaign_id)
    return page_redirect(f"/campaigns/{campaign.id}?notice={'retried' if requeued else 'nothing-to-retry'}")


@pages.get("/campaigns/{campaign_id}/realizations/{index}/maps/{field}.png")
async def map_image(
    request: Request,
    campaign_id: RowId,
    index: RealizationIndex,
    field: str,
    user: DashboardUser,
    settings: SettingsDep,
) -> Response:
    if field not in FIELDS:
        raise NotFound(f"no map field {field!r}; use I, Q or U")
    database = request.app.state.database

    def find() -> tuple[queries.MapProduct | None, dict[str, Any] | None, set[str]]:
        with database.session(write=False) as session:
            campaigns.get_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id)
            found = queries.realization_map(session=session, campaign_id=campaign_id, index=index)
            record = (
                None
                if found is None
                else queries.product_of(session=session, campaign_id=campaign_id, index=index, name=found.path)
            )
            return found, record, sites_with_workers(session)

    product, record, sites = await anyio.to_thread.run_sync(find)
    if product is None:
        raise NotFound(f"realisation {index} of campaign {campaign_id} has no I/Q/U map")
    if record is not None and record.get("kept"):
        # Kept at its site: read there when the service can, checked against the recorded size and SHA-256.
        files = CampaignProducts(settings.products_dir, campaign_id)
        source = await anyio.to_thread.run_sync(
            lambda: kept_source(files, index, record, site_has_workers=sites.__contains__)
        )
    else:
        source = CampaignStorage(settings.products_dir).product_path(campaign_id, index, product.path)
    if not source.is_file():
        raise NotFound(f"the map file of realisation {index} is missing from the data folder")

    def draw() -> Path:
        return quicklook_png(
            products_dir=settings.products_dir,
            campaign_id=campaign_id,
            index=index,
            product_path=source,
            sha256=product.sha256,
            field=field,
        )

    try:
        png = await anyio.to_thread.run_sync(draw)
    except MapUnreadable as error:
        raise NotFound(str(error)) from None
    return FileResponse(
        png, media_type="image/png", headers={"Cache-Control": "private, max-age=86400", **SECURITY_HEADERS}
    )


@pages.get("/campaigns/{campaign_id}/realizations/{index}/products/{name}")
def product_file(
    campaign_id: RowId,
    index: RealizationIndex,
    name: str,
    user: DashboardUser,
    session: ReadSessionDep,
    settings: SettingsDep,
) -> Response:
    campaigns.get_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id)
    product = queries.product_of(session=session, campaign_id=campaign_id, index=index, name=name)
    if product is not None and product.get("kept"):
        files = CampaignProducts(settings.products_dir, campaign_id)
        path = kept_source(files, index, product, site_has_workers=sites_with_workers(session).__contains__)
    else:
        path = CampaignStorage(settings.products_dir).product_path(campaign_id, index, name)
    if product is None or not path.is_file():
        raise NotFound(f"realisation {index} of campaign {campaign_id} has no product {name!r}")
    media_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return FileResponse(
        path,
        media_type=media_type,
        filename=name,
        headers={"Cache-Control": "private, no-cache", "X-Content-Type-Options": "nosniff"},
    )


# --------------------------------------------------------------------------- JSON and events for the pages' scripts


def ui_json(payload: Any) -> JSONResponse:
    return JSONResponse(payload, headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


@ui.get("/overview")
def overview_progress(
    user: DashboardUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    ids: Annotated[str, Query(max_length=2_000, pattern=r"^[0-9,]*$")] = "",
) -> JSONResponse:
    wanted = sorted({int(part) for part in ids.split(",") if part})[:200]
    return ui_json(dashboard.overview_progress(session=session, owner_id=user.user_id, settings=settings, ids=wanted))


@ui.get("/campaigns/{campaign_id}/status")
def campaign_status(
    campaign_id: RowId, user: DashboardUser, session: ReadSessionDep, settings: SettingsDep
) -> JSONResponse:
    return ui_json(
        dashboard.campaign_status(session=session, owner_id=user.user_id, campaign_id=campaign_id, settings=settings)
    )


@ui.get("/campaigns/{campaign_id}/grid")
def campaign_grid(campaign_id: RowId, user: DashboardUser, session: ReadSessionDep) -> JSONResponse:
    campaign = campaigns.get_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id)
    return ui_json({"states": queries.state_grid(session=session, campaign=campaign)})


@ui.get("/campaigns/{campaign_id}/results")
def campaign_results(
    campaign_id: RowId,
    user: DashboardUser,
    session: ReadSessionDep,
    window: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> JSONResponse:
    campaign = campaigns.get_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id)
    size = queries.RESULTS_WINDOW
    return ui_json(
        {
            "window": window,
            "first": window * size,
            "last": min((window + 1) * size, campaign.realizations) - 1,
            "windows": (campaign.realizations + size - 1) // size,
            "items": queries.results_window(session=session, campaign=campaign, window=window),
        }
    )


@ui.get("/campaigns/{campaign_id}/rows")
def campaign_rows(
    campaign_id: RowId,
    user: DashboardUser,
    session: ReadSessionDep,
    indices: Annotated[str, Query(max_length=2_000, pattern=r"^[0-9,]*$")] = "",
) -> JSONResponse:
    wanted = sorted({int(part) for part in indices.split(",") if part and len(part) < 10})[:200]
    return ui_json(dashboard.rows_json(session=session, owner_id=user.user_id, campaign_id=campaign_id, indices=wanted))


@ui.get("/campaigns/{campaign_id}/products-panel")
def campaign_products_panel(
    campaign_id: RowId, user: DashboardUser, session: ReadSessionDep, settings: SettingsDep
) -> JSONResponse:
    return ui_json(
        dashboard.products_panel_json(
            session=session, owner_id=user.user_id, campaign_id=campaign_id, settings=settings
        )
    )


@ui.get("/workers")
def workers(user: DashboardUser, session: ReadSessionDep) -> JSONResponse:
    return ui_json(dashboard.workers_json(session=session, owner_id=user.user_id))


@ui.get("/events")
async def events(
    request: Request,
    user: DashboardUser,
    settings: SettingsDep,
    campaign_id: RowIdQuery = None,
    after: EventPositionQuery = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
) -> StreamingResponse:
    """The service's event stream (same events, same resumption), for a browser logged in with the cookie."""
    return await open_event_stream(
        request, user.principal, settings, campaign_id, after, last_event_id, check_campaign=campaigns.campaign_visible
    )
