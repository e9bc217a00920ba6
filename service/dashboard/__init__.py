"""The web dashboard: campaigns, realisations, plans and workers, served by the service at ``/``.

``mount_dashboard(app)`` adds the pages, their JSON and event endpoints under
``/ui``, and the static files (scripts, styles, icon: everything the pages
load comes from the service; nothing from the network).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles


def mount_dashboard(app: FastAPI) -> None:
    # Imported here, not at the top: the package's pure modules (queries, panels) import without the pages.
    from service.dashboard.router import STATIC_DIR, install_dashboard_handlers, pages, ui

    app.include_router(pages)
    app.include_router(ui)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    install_dashboard_handlers(app)
