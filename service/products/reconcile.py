"""Bring the aggregates up to date with the database: the hook after each result, and the reconciler.

The hook (:func:`update_after_result`) runs after the result's commit. A
service killed between that commit and the hook, or a hook that failed,
leaves a succeeded realisation outside the aggregates; the reconciler finds
it by comparing the database's succeeded realisations with each campaign's
ledger, at service start and then every ``MAPCAMPAIGN_REAPER_INTERVAL_S``,
in every API process (the per-campaign lock and the ledger make a second
offer of the same realisation a no-op).
"""

from __future__ import annotations

import asyncio
import logging

import anyio
from sqlalchemy import func, select

from schemas.states import RealizationState
from service.campaigns.hooks import AcceptedResult
from service.campaigns.models import Campaign, Realization
from service.config import Settings
from service.db import Database
from service.products.aggregates import include_realization, load_state
from service.storage import CampaignProducts

log = logging.getLogger("mapcampaign.products")


def update_after_result(accepted: AcceptedResult) -> None:
    """Hook for ``service.campaigns.hooks.on_result_accepted``: add the accepted realisation to the aggregates."""
    if accepted.settings is None:
        return
    files = CampaignProducts(accepted.settings.products_dir, accepted.campaign_id)
    include_realization(files, accepted.realization, accepted.result, accepted.product_dir)


def reconcile_campaign(*, database: Database, products_dir, campaign_id: int) -> int:
    """Add every succeeded realisation of the campaign that its aggregates lack; return how many were added."""
    files = CampaignProducts(products_dir, campaign_id)
    with database.session(write=False) as session:
        succeeded = list(
            session.scalars(
                select(Realization.index)
                .where(Realization.campaign_id == campaign_id, Realization.state == RealizationState.SUCCEEDED)
                .order_by(Realization.index)
            )
        )
    state = load_state(files)
    missing = [index for index in succeeded if state is None or not state.includes(index)]
    added = 0
    for index in missing:
        with database.session(write=False) as session:
            result = session.scalar(
                select(Realization.result).where(
                    Realization.campaign_id == campaign_id,
                    Realization.index == index,
                    Realization.state == RealizationState.SUCCEEDED,
                )
            )
            exists = session.scalar(select(Campaign.id).where(Campaign.id == campaign_id)) is not None
        if result is None or not exists:
            continue  # deleted meanwhile
        if include_realization(files, index, result):
            added += 1
    if added:
        log.info(
            "campaign %d: %d succeeded realisation(s) added to the aggregates by the reconciler", campaign_id, added
        )
    return added


class Reconciler:
    """Finds campaigns whose aggregates lack succeeded realisations; remembers the ones already complete."""

    def __init__(self, database: Database, settings: Settings):
        self.database = database
        self.settings = settings
        self._complete: dict[int, int] = {}  # campaign id -> succeeded count known to be all included

    def run_once(self) -> int:
        with self.database.session(write=False) as session:
            counts = dict(
                session.execute(
                    select(Realization.campaign_id, func.count())
                    .where(Realization.state == RealizationState.SUCCEEDED)
                    .group_by(Realization.campaign_id)
                ).all()
            )
        self._complete = {cid: n for cid, n in self._complete.items() if cid in counts}
        added = 0
        for campaign_id, count in sorted(counts.items()):
            if self._complete.get(campaign_id) == count:
                continue
            files = CampaignProducts(self.settings.products_dir, campaign_id)
            state = load_state(files)
            if state is None or state.n_included < count:
                try:
                    added += reconcile_campaign(
                        database=self.database, products_dir=self.settings.products_dir, campaign_id=campaign_id
                    )
                except Exception:
                    log.exception("campaign %d: reconciling the aggregates failed; trying again later", campaign_id)
                    continue
            self._complete[campaign_id] = count
        return added


async def run_reconciler(database: Database, settings: Settings, stop: asyncio.Event) -> None:
    """Reconcile once at start, then every ``reaper_interval_s`` until ``stop``; errors are logged, never fatal."""
    reconciler = Reconciler(database, settings)
    while not stop.is_set():
        try:
            await anyio.to_thread.run_sync(reconciler.run_once)
        except Exception:
            log.exception("products reconciler round failed; trying again in %.1f s", settings.reaper_interval_s)
        try:
            await asyncio.wait_for(stop.wait(), timeout=settings.reaper_interval_s)
        except TimeoutError:
            pass
