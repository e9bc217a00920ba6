"""The campaign page's Monte Carlo products panel, and the hook that fills it.

Until a provider is registered the panel says that the running-mean map and
the Monte Carlo spectra appear once the campaign has products; no figure is
drawn from made-up data. The products issue registers one provider::

    from service.dashboard.panels import ChartRef, FigureRef, ProductsPanel, products_panel

    @products_panel
    def mc_products(*, session, campaign, settings) -> ProductsPanel | None:
        # None (or an empty panel) while the campaign has no aggregates yet
        return ProductsPanel(
            figures=[FigureRef(title="Running mean, I", src=f"/campaigns/{campaign.id}/products/mean-I.png")],
            charts=[ChartRef(kind="mc-spectra", src=f"/ui/campaigns/{campaign.id}/products/spectra",
                             title="TT, EE, BB: mean and scatter")],
            note="Mean of 120 realisations",
        )

* ``FigureRef.src``: an image route (PNG rendered server-side, like the
  quick-look maps); add it to ``service/dashboard/router.py`` behind
  ``DashboardUser`` and ``owned_campaign``.
* ``ChartRef``: an SVG chart drawn in the browser. ``src`` answers JSON;
  ``kind`` names a renderer registered in JavaScript with
  ``MapCampaign.charts.register(kind, (element, data) => ...)`` (see
  ``static/charts.js``; ``MapCampaign.charts.lines`` draws log-scale lines
  with shaded scatter bands). The campaign page fetches every chart's ``src``
  when it loads and again after each accepted result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("mapcampaign.dashboard")


@dataclass(frozen=True)
class FigureRef:
    title: str
    src: str
    alt: str = ""
    caption: str = ""


@dataclass(frozen=True)
class ChartRef:
    kind: str
    src: str
    title: str
    caption: str = ""


@dataclass(frozen=True)
class ProductsPanel:
    figures: list[FigureRef] = field(default_factory=list)
    charts: list[ChartRef] = field(default_factory=list)
    note: str = ""

    @property
    def empty(self) -> bool:
        return not self.figures and not self.charts


PanelProvider = Callable[..., ProductsPanel | None]
_PROVIDERS: list[PanelProvider] = []


def products_panel(provider: PanelProvider) -> PanelProvider:
    """Register a provider: ``provider(*, session, campaign, settings) -> ProductsPanel | None``."""
    if provider not in _PROVIDERS:
        _PROVIDERS.append(provider)
    return provider


def remove_products_panel(provider: PanelProvider) -> None:
    if provider in _PROVIDERS:
        _PROVIDERS.remove(provider)


def collect_products_panel(*, session: Any, campaign: Any, settings: Any) -> ProductsPanel:
    """Everything the providers show for this campaign; a failing provider is logged and left out."""
    figures: list[FigureRef] = []
    charts: list[ChartRef] = []
    notes: list[str] = []
    for provider in _PROVIDERS:
        try:
            panel = provider(session=session, campaign=campaign, settings=settings)
        except Exception:
            log.exception(
                "products panel %s failed for campaign %d", getattr(provider, "__name__", provider), campaign.id
            )
            continue
        if panel is None:
            continue
        figures.extend(panel.figures)
        charts.extend(panel.charts)
        if panel.note:
            notes.append(panel.note)
    return ProductsPanel(figures=figures, charts=charts, note=" ".join(notes))
