"""What each dashboard page and JSON endpoint shows, built from the service's own read functions.

Each function takes the owner's user id: another user's campaign raises
``CampaignNotFound`` (404), exactly as in the REST API.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from schemas.api import CampaignProgress
from schemas.states import CampaignState, RealizationState
from service.campaigns import progress as campaign_progress
from service.campaigns import reads as campaigns
from service.campaigns.models import Campaign
from service.config import Settings
from service.dashboard import queries
from service.dashboard.panels import collect_products_panel
from service.events.service import latest_event_id
from service.keptfiles import kept_state
from service.queue import couplings
from service.storage import CampaignProducts

CAMPAIGNS_PER_PAGE = 50
REALIZATIONS_PER_PAGE = 50


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def progress_json(campaign: Campaign, progress: CampaignProgress) -> dict[str, Any]:
    return {
        "id": campaign.id,
        "state": campaign.state,
        "counts": progress.counts,
        "done": progress.done,
        "total": progress.total,
        "throughput_per_hour": progress.throughput_per_hour,
        "eta_seconds": progress.eta_seconds,
        "finished_at": iso(campaign.finished_at),
    }


def overview(
    *,
    session: Session,
    owner_id: int,
    settings: Settings,
    state: CampaignState | None,
    name: str | None,
    cursor: str | None,
) -> dict[str, Any]:
    after_event = latest_event_id(session=session)  # read first: the live stream replays anything newer
    rows, next_cursor = campaigns.list_campaigns(
        session=session, owner_id=owner_id, state=state, name=name, cursor=cursor, limit=CAMPAIGNS_PER_PAGE
    )
    progress = campaign_progress.progress_many(session=session, campaigns=rows, window_s=settings.throughput_window_s)
    return {
        "campaigns": [{"campaign": campaign, "progress": progress[campaign.id]} for campaign in rows],
        "next_cursor": next_cursor,
        "after_event": after_event,
    }


def overview_progress(*, session: Session, owner_id: int, settings: Settings, ids: list[int]) -> list[dict[str, Any]]:
    rows = queries.campaigns_by_ids(session=session, owner_id=owner_id, ids=ids)
    progress = campaign_progress.progress_many(session=session, campaigns=rows, window_s=settings.throughput_window_s)
    return [progress_json(campaign, progress[campaign.id]) for campaign in rows]


def map_json(campaign_id: int, product: queries.MapProduct | None) -> dict[str, Any] | None:
    if product is None:
        return None
    base = f"/campaigns/{campaign_id}/realizations/{product.realization}/maps"
    return {
        "realization": product.realization,
        "finished_at": iso(product.finished_at),
        # The checksum in the URL: a new map is a new URL, an old one may be cached for long.
        "images": {field: f"{base}/{field}.png?v={product.sha256[:16]}" for field in ("I", "Q", "U")},
    }


def campaign_status(*, session: Session, owner_id: int, campaign_id: int, settings: Settings) -> dict[str, Any]:
    """What the campaign page refreshes after events: progress, plans, failures, the latest map."""
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    progress = campaign_progress.progress(session=session, campaign=campaign, window_s=settings.throughput_window_s)
    failures = queries.failure_summary(session=session, campaign_id=campaign.id)
    for failure in failures["recent"]:
        failure["ended_at"] = iso(failure["ended_at"])
    return {
        **progress_json(campaign, progress),
        "failure_cause": campaign.failure_cause,
        "cancel_reason": campaign.cancel_reason,
        "plans": [plan.as_json() for plan in queries.plans_of(session=session, campaign=campaign)],
        "failures": failures,
        "latest_map": map_json(campaign.id, queries.latest_map(session=session, campaign_id=campaign.id)),
        "latest_window": queries.latest_results_window(session=session, campaign_id=campaign.id),
    }


def campaign_page(
    *,
    session: Session,
    owner_id: int,
    campaign_id: int,
    settings: Settings,
    state: RealizationState | None,
    cursor: str | None,
) -> dict[str, Any]:
    after_event = latest_event_id(session=session)
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    progress = campaign_progress.progress(session=session, campaign=campaign, window_s=settings.throughput_window_s)
    realizations, next_cursor = campaigns.list_realizations(
        bind=session,
        owner_id=owner_id,
        campaign_id=campaign.id,
        state=state,
        cursor=cursor,
        limit=REALIZATIONS_PER_PAGE,
    )
    latest_map = queries.latest_map(session=session, campaign_id=campaign.id)
    return {
        "campaign": campaign,
        "instrument": campaign.instrument_summary or {},  # loaded here, in the session (a deferred column)
        "progress": progress,
        "grid": queries.state_grid(session=session, campaign=campaign),
        "plans": queries.plans_of(session=session, campaign=campaign),
        "failures": queries.failure_summary(session=session, campaign_id=campaign.id),
        "latest_map": latest_map,
        "latest_map_json": map_json(campaign.id, latest_map),
        "results_window": queries.latest_results_window(session=session, campaign_id=campaign.id),
        "results_window_size": queries.RESULTS_WINDOW,
        "realizations": realizations,
        "rows": queries.table_rows(session=session, campaign=campaign, indices=[item.index for item in realizations]),
        "realizations_state": state,
        "realizations_next_cursor": next_cursor,
        "products_panel": collect_products_panel(session=session, campaign=campaign, settings=settings),
        "after_event": after_event,
    }


def realization_page(
    *, session: Session, owner_id: int, campaign_id: int, index: int, products_dir: Path
) -> dict[str, Any]:
    after_event = latest_event_id(session=session)
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    detail = campaigns.get_realization(session=session, owner_id=owner_id, campaign_id=campaign.id, index=index)
    result = detail.result if isinstance(detail.result, dict) else None
    map_product = queries.map_product(result.get("products")) if result else None
    maps = None
    if map_product is not None:
        maps = map_json(
            campaign.id,
            queries.MapProduct(
                realization=index, path=map_product[0], sha256=map_product[1], finished_at=detail.finished_at
            ),
        )
    failed = [attempt.number for attempt in detail.attempt_history if attempt.failure_class]
    files = CampaignProducts(products_dir, campaign.id)
    kept = {  # maps kept at their site: readable here, fetched, being fetched, or refused by the site
        product["path"]: kept_state(files, index, product)
        for product in (result or {}).get("products") or []
        if isinstance(product, dict) and product.get("kept")
    }
    if (
        maps is not None
        and map_product is not None
        and kept.get(map_product[0], {}).get("state") not in (None, "readable", "ready")
    ):
        maps = None  # its images would wait on the site: the products list says where it stands
    return {
        "campaign": campaign,
        "realization": detail,
        "result": result,
        "maps": maps,
        "kept": kept,
        "open_log": max(failed) if failed else None,  # the latest failure's log is shown open
        "after_event": after_event,
    }


def workers_page(*, session: Session, owner_id: int) -> list[dict[str, Any]]:
    return queries.workers_with_tasks(session=session, owner_id=owner_id)


def workers_json(*, session: Session, owner_id: int) -> list[dict[str, Any]]:
    return [
        {**worker, "registered_at": iso(worker["registered_at"]), "last_heartbeat_at": iso(worker["last_heartbeat_at"])}
        for worker in queries.workers_with_tasks(session=session, owner_id=owner_id)
    ]


def rows_json(*, session: Session, owner_id: int, campaign_id: int, indices: list[int]) -> list[dict[str, Any]]:
    """The realisation table's rows for these indices, as the campaign page refreshes them after events."""
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    return [
        {**row, "finished_at": iso(row["finished_at"])}
        for row in queries.table_rows(session=session, campaign=campaign, indices=indices)
    ]


def products_panel_json(*, session: Session, owner_id: int, campaign_id: int, settings: Settings) -> dict[str, Any]:
    """The products panel as data, for the campaign page to build it when products appear after it loaded."""
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    panel = collect_products_panel(session=session, campaign=campaign, settings=settings)
    return {
        "empty": panel.empty,
        "note": panel.note,
        "figures": [vars(figure) for figure in panel.figures],
        "charts": [vars(chart) for chart in panel.charts],
    }


def plans_page(*, session: Session, owner_id: int) -> dict[str, Any]:
    return {
        "plans": queries.plans_of_owner(session=session, owner_id=owner_id),
        "couplings": couplings.list_couplings(session=session, owner_id=owner_id),
    }
