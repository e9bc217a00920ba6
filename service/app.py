"""The FastAPI application: ``create_app()`` builds it from settings.

Run it with ``mapcampaign serve`` (which migrates and checks first), or with
``uvicorn --factory service.app:create_app``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from types import FrameType
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr

from schemas.api import API_PREFIX, ErrorBody, Health
from service.access_log import install_access_log_redaction
from service.admission import AdmissionMiddleware
from service.auth.errors import InvalidToken, MissingToken
from service.auth.router import router as login_links_router
from service.campaigns.reads import campaign_visible
from service.campaigns.router import router as campaigns_router
from service.config import Settings
from service.dashboard import mount_dashboard
from service.dashboard.router import error_page
from service.db import Database
from service.errors import install_error_handlers
from service.events.router import events_router
from service.instruments.router import router as instruments_router
from service.limits import BodyLimitMiddleware
from service.metrics import LatencyMiddleware, Metrics
from service.migrate import current_revisions
from service.products import mount_products
from service.products.reconcile import run_reconciler
from service.queue.reaper import run_reaper
from service.queue.router import claims_router, couplings_router, tasks_router
from service.queue.router import router as plans_router
from service.startup import ensure_local_tokens, prepare_database
from service.workers.router import workers_router

log = logging.getLogger("mapcampaign.service")

VERSION = "0.1.0"


def _close_streams_on_exit_signals(closing: threading.Event) -> Callable[[], None]:
    """On SIGINT/SIGTERM set ``closing`` too, then let uvicorn's handler stop the server; return the undo.

    uvicorn waits for open connections before it stops, up to its graceful timeout, then cancels them: an
    event stream (a dashboard tab, a `watch`, the demo's progress) never ends by itself, so each stop of
    `mapcampaign up` or `demo` wrote a CancelledError traceback into serve.log. With ``closing`` set the
    streams end within one poll, and the server stops cleanly. Signals are only caught in the main thread
    (uvicorn's own rule); elsewhere (a test client) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[int, Any] = {}  # signal.getsignal's answers: a handler, SIG_DFL/SIG_IGN or None

    def on_exit_signal(signum: int, frame: FrameType | None) -> None:
        closing.set()
        handler = previous.get(signum)
        if callable(handler):
            handler(signum, frame)

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, on_exit_signal)

    def restore() -> None:
        for signum, handler in previous.items():
            if signal.getsignal(signum) is on_exit_signal:
                signal.signal(signum, handler)

    return restore


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    install_access_log_redaction()  # uvicorn has configured logging before it calls this factory

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = Database(settings.effective_database_url, settings)
        try:
            revision = prepare_database(database, settings)  # refuses an unmigrated or outdated database
            if settings.embedded:
                ensure_local_tokens(database, settings)
        except Exception:
            database.dispose()
            raise
        metrics.watch_database(database)
        app.state.database = database
        stop = asyncio.Event()
        reaper = asyncio.create_task(run_reaper(database, settings, stop), name="mapcampaign-reaper")
        reconciler = asyncio.create_task(run_reconciler(database, settings, stop), name="mapcampaign-products")
        log.info(
            "service ready: database %s at revision %s, reaper every %.1f s",
            database.engine.url.render_as_string(hide_password=True),
            revision,
            settings.reaper_interval_s,
        )
        restore_signals = _close_streams_on_exit_signals(app.state.closing)
        try:
            yield
        finally:
            restore_signals()
            stop.set()
            await reaper
            await reconciler
            database.dispose()

    app = FastAPI(
        title="MapCampaign",
        version=VERSION,
        summary="Monte Carlo CMB map-making campaigns: queue, workers, results",
        lifespan=lifespan,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=None,  # served below from this service's own files, not from a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.closing = threading.Event()  # set on SIGINT/SIGTERM: open event streams end (service.events)
    install_error_handlers(app, error_page=error_page)  # JSON for the API, the dashboard's page for a browser
    app.add_middleware(
        AdmissionMiddleware,
        permits=settings.max_concurrent_requests or settings.db_pool_size,
        timeout_s=settings.admission_timeout_s,
    )
    # Added after (so outside) admission: a body is read, within its size and time limits, before its
    # request waits for a permit (service.limits).
    app.add_middleware(BodyLimitMiddleware, settings=settings)
    app.add_middleware(LatencyMiddleware, metrics=metrics)

    api = APIRouter(prefix=API_PREFIX)
    for router in (
        campaigns_router,
        plans_router,
        couplings_router,
        workers_router,
        claims_router,
        tasks_router,
        events_router(campaign_visible),
        login_links_router,
        instruments_router,
    ):
        api.include_router(router)
    app.include_router(api)
    mount_dashboard(app)  # pages at /, their JSON and events under /ui, files under /static
    mount_products(app)  # Monte Carlo aggregates: API, dashboard panel, result hook
    mount_api_docs(app)

    @app.get("/healthz", response_model=Health, tags=["operations"], responses={503: {"model": Health}})
    def healthz(request: Request) -> JSONResponse:
        database: Database = request.app.state.database
        try:
            with database.engine.connect() as connection:  # one connection: reachable, and its schema revision
                revision = ",".join(sorted(current_revisions(connection))) or None
            body, status = Health(status="ok", database=database.dialect, schema_revision=revision), 200
        except Exception as error:  # noqa: BLE001 -- the answer says unavailable; the log says why
            log.warning("health check: database unreachable: %s", type(error).__name__)
            body, status = Health(status="unavailable", database=database.dialect), 503
        return JSONResponse(body.model_dump(mode="json"), status_code=status)

    @app.get(
        "/metrics",
        tags=["operations"],
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 401: {"model": ErrorBody}},
    )
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus metrics. With ``MAPCAMPAIGN_METRICS_TOKEN`` set, only for ``Authorization: Bearer <it>``."""
        if settings.metrics_token is not None:
            check_scrape_token(request.headers.get("authorization"), settings.metrics_token)
        payload = await anyio.to_thread.run_sync(generate_latest, metrics.registry)
        return Response(payload, media_type=CONTENT_TYPE_LATEST)

    return app


def check_scrape_token(authorization: str | None, expected: SecretStr) -> None:
    """401 unless ``authorization`` is ``Bearer <expected>`` (Prometheus' ``authorization`` scrape setting)."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise MissingToken("/metrics needs the scrape token: Authorization: Bearer <MAPCAMPAIGN_METRICS_TOKEN>")
    if not hmac.compare_digest(given.strip().encode(), expected.get_secret_value().encode()):
        raise InvalidToken("the bearer token is not this service's metrics token")


API_DOCS_STATIC = "/apidocs"


def mount_api_docs(app: FastAPI) -> None:
    """Swagger UI at ``/api/v1/docs``, its script and style from the ``fastapi-offline`` package.

    FastAPI's default page loads them from a CDN: a browser without internet access (a cluster's
    gateway, a laptop on a plane) would show a blank page.
    """
    app.mount(
        API_DOCS_STATIC,
        StaticFiles(directory=str(resources.files("fastapi_offline") / "static")),
        name="apidocs",
    )

    @app.get(f"{API_PREFIX}/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=f"{API_PREFIX}/openapi.json",
            title="MapCampaign API",
            swagger_js_url=f"{API_DOCS_STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{API_DOCS_STATIC}/swagger-ui.css",
            swagger_favicon_url="/static/favicon.svg",
        )
