"""The web dashboard: campaigns, realisations, plans and workers, served by the service at ``/``.

``mount_dashboard(app)`` adds the pages, the login pages of :mod:`service.auth.pages`
(drawn with the dashboard's templates), their JSON and event endpoints under
``/ui``, and the static files (scripts, styles, icon: everything the pages
load comes from the service; nothing from the network). Its error page is
handed to :func:`service.errors.install_error_handlers` by ``service.app``.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles


def mount_dashboard(app: FastAPI) -> None:
    # Imported here, not at the top: the package's pure modules (queries, panels) import without the pages.
    from service.auth.pages import login_pages
    from service.dashboard.router import STATIC_DIR, pages, render, ui

    app.include_router(login_pages(render))
    app.include_router(pages)
    app.include_router(ui)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
