"""The reaper: tasks whose lease expired go back to the queue as a lost attempt (failure class lost_worker).

Safe with several API processes: every process runs a reaper; rows are taken
with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (and under the one write lock on
SQLite), and a row is re-checked after it is locked, so an expiry is handled once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import anyio
from sqlalchemy import exists, select
from sqlalchemy.orm import Session, aliased

from schemas.states import (
    LEASED_REALIZATION_STATES,
    LIVE_PLAN_STATES,
    UNFINISHED_CAMPAIGN_STATES,
    Entity,
    PlanState,
    RealizationState,
    advance,
)
from service.campaigns.lifecycle import settle_campaign
from service.campaigns.models import Attempt, Campaign, Realization
from service.config import Settings
from service.db import Database, in_chunks, utcnow
from service.events.service import record_event
from service.queue.models import PreprocessingPlan
from service.queue.plans import fail_campaigns_needing, report_build_failed
from service.queue.tasks import end_attempt
from service.storage import ArtifactStore
from service.workers.models import Worker

log = logging.getLogger("mapcampaign.reaper")


@dataclass
class Reaped:
    realizations: int = 0
    plans: int = 0
    stranded_campaigns: int = 0  # campaigns of an exhausted plan that were left unfailed


def reap_expired(*, database: Database, settings: Settings) -> Reaped:
    reaped = Reaped()
    now = utcnow()
    with database.session(write=False) as session:
        campaign_ids = sorted(
            set(
                session.scalars(
                    select(Realization.campaign_id).where(
                        Realization.state.in_(LEASED_REALIZATION_STATES), Realization.lease_expires_at < now
                    )
                )
            )
        )
        plan_ids = list(
            session.scalars(
                select(PreprocessingPlan.id).where(
                    PreprocessingPlan.state == PlanState.BUILDING, PreprocessingPlan.lease_expires_at < now
                )
            )
        )
    store = ArtifactStore(settings.products_dir)
    for campaign_id in campaign_ids:
        with database.session() as session:
            ended = _reap_campaign(session, campaign_id)
        for attempt_id in ended:
            store.discard(campaign_id=campaign_id, attempt_id=attempt_id)
        reaped.realizations += len(ended)
    for plan_id in plan_ids:
        with database.session() as session:
            plan = session.scalar(
                select(PreprocessingPlan)
                .where(
                    PreprocessingPlan.id == plan_id,
                    PreprocessingPlan.state == PlanState.BUILDING,
                    PreprocessingPlan.lease_expires_at < utcnow(),
                )
                .with_for_update(skip_locked=True)
            )
            if plan is None:
                continue
            holder = session.scalar(select(Worker.name).where(Worker.id == plan.lease_holder_id))
            record_event(
                session,
                "lease_expired",
                state=PlanState.FAILED,
                plan_id=plan.id,
                data={"task": "preprocess", "worker": holder, "build": plan.build_number},
            )
            report_build_failed(
                database=database,
                session=session,
                plan=plan,
                cause=f"lost_worker: the build lease of worker {holder!r} expired",
                max_builds=settings.max_plan_builds,
            )
            reaped.plans += 1
    # Failing the campaigns of an exhausted plan happens after the plan's own commit, one campaign at a
    # time; if that was cut short (the API killed, the database gone), nothing else would ever fail them.
    # Every pass: so only plans that still have such a campaign, and no other site serving it, are read.
    sibling = aliased(PreprocessingPlan)
    with database.session(write=False) as session:
        exhausted = list(
            session.scalars(
                select(PreprocessingPlan).where(
                    PreprocessingPlan.state == PlanState.FAILED,
                    PreprocessingPlan.build_attempts >= settings.max_plan_builds,
                    exists().where(
                        Campaign.scan_key == PreprocessingPlan.scan_key,
                        Campaign.ranks == PreprocessingPlan.ranks,
                        Campaign.state.in_(UNFINISHED_CAMPAIGN_STATES),
                        Campaign.queued_at <= PreprocessingPlan.failed_at,
                    ),
                    ~exists().where(
                        sibling.scan_key == PreprocessingPlan.scan_key,
                        sibling.ranks == PreprocessingPlan.ranks,
                        sibling.site != PreprocessingPlan.site,
                        sibling.state.in_(LIVE_PLAN_STATES),
                    ),
                )
            )
        )
    for plan in exhausted:
        reaped.stranded_campaigns += fail_campaigns_needing(database=database, plan=plan)
    if reaped.realizations or reaped.plans or reaped.stranded_campaigns:
        log.info(
            "reaper: %d realisation leases and %d plan leases expired; %d campaigns of exhausted plans failed",
            reaped.realizations, reaped.plans, reaped.stranded_campaigns,
        )  # fmt: skip
    return reaped


def _reap_campaign(session: Session, campaign_id: int) -> list[int]:
    """Requeue (or fail) the campaign's expired tasks; return the ids of the attempts ended."""
    campaign = session.scalar(select(Campaign).where(Campaign.id == campaign_id).with_for_update(skip_locked=True))
    if campaign is None:
        return []  # locked by another writer (or deleted): the next round takes it
    realizations = list(
        session.scalars(
            select(Realization)
            .where(
                Realization.campaign_id == campaign_id,
                Realization.state.in_(LEASED_REALIZATION_STATES),
                Realization.lease_expires_at < utcnow(),
            )
            .order_by(Realization.id)
            .with_for_update(skip_locked=True)
        )
    )
    ended: list[int] = []
    holder_ids = {r.lease_holder_id for r in realizations if r.lease_holder_id is not None}
    holders = {
        row.id: row.name
        for chunk in in_chunks(holder_ids)
        for row in session.execute(select(Worker.id, Worker.name).where(Worker.id.in_(chunk)))
    }
    for realization in realizations:
        attempt = session.get(Attempt, realization.current_attempt_id) if realization.current_attempt_id else None
        holder = holders.get(realization.lease_holder_id)
        record_event(
            session,
            "lease_expired",
            state=None,
            owner_id=campaign.owner_id,
            campaign_id=campaign_id,
            realization=realization.index,
            data={"task": "realize", "worker": holder},
        )
        if attempt is None:  # cannot happen through the API; keep the realisation moving anyway
            realization.state = advance(Entity.REALIZATION, realization.state, RealizationState.QUEUED)
            realization.lease_holder_id = realization.lease_expires_at = None
            continue
        end_attempt(
            session=session,
            campaign=campaign,
            realization=realization,
            attempt=attempt,
            failure_class="lost_worker",
            exit_code=None,
            log_tail=f"lease expired: worker {holder!r} stopped sending heartbeats",
            worker_name=holder,
            settle=False,
        )
        ended.append(attempt.id)
    if realizations:  # once for the campaign, not once per realisation: each is a count over all of it
        settle_campaign(session=session, campaign=campaign)
    session.commit()
    return ended


async def run_reaper(database: Database, settings: Settings, stop: asyncio.Event) -> None:
    """Reap every ``reaper_interval_s`` until ``stop`` is set; errors are logged, never fatal."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=settings.reaper_interval_s)
            break
        except TimeoutError:
            pass
        try:
            await anyio.to_thread.run_sync(lambda: reap_expired(database=database, settings=settings))
        except Exception:
            log.exception("reaper round failed; trying again in %.1f s", settings.reaper_interval_s)
