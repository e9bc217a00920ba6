"""Monte Carlo products of a campaign: running aggregates, their API, CLI downloads and dashboard panel.

``mount_products(app)`` adds the API routes under ``/api/v1/campaigns/{id}/products`` and
``/api/v1/workers/{id}/campaigns/{id}/map-sums`` (a site's partial map sums, :mod:`service.products.mapsums`),
``/api/v1/spectrum`` (a data map's unbiased bandpowers, :mod:`service.products.spectrum`),
the dashboard's image and chart routes, registers the result hook that updates
the aggregates (``service.campaigns.hooks.on_result_accepted``) and the
products panel provider (``service.dashboard.panels.products_panel``).
``run_reconciler`` is started by the app's lifespan. See
:mod:`service.products.aggregates` for where the state lives and why.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from schemas.api import API_PREFIX


def mount_products(app: FastAPI) -> None:
    # Imported here, not at the top: the package stays light, so that its pure modules (aggregates, formats)
    # import without the routers, the dashboard and matplotlib behind them.
    from service.campaigns.hooks import on_result_accepted
    from service.dashboard.panels import products_panel
    from service.products.dashboard import mc_products_panel
    from service.products.dashboard import router as dashboard_router
    from service.products.pages import router as pages_router
    from service.products.reconcile import update_after_result
    from service.products.router import router as api_router
    from service.products.router import spectrum_router
    from service.products.site_router import site_sums_router

    api = APIRouter(prefix=API_PREFIX)
    api.include_router(api_router)
    api.include_router(spectrum_router)
    api.include_router(site_sums_router)
    app.include_router(api)
    app.include_router(dashboard_router)
    app.include_router(pages_router)  # /products and the browser downloads
    on_result_accepted(update_after_result)
    products_panel(mc_products_panel)
