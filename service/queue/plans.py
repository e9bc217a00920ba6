"""Overlap-plan builds: at most one per (scan key, ranks, site) at a time, shared by every campaign.

A plan row is ``building`` while one worker holds the build lease, ``ready``
once built, ``failed`` when a build failed. A failed plan is built again by the
next claim while it has build attempts left; past ``max_plan_builds`` the
campaigns that need it fail with the cause. A campaign queued (or retried)
after that failure gets a fresh build budget, so resubmitting is the way out.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, exists, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from schemas.api import PlanBuilt, PlanInfo
from schemas.programs import MAX_MESSAGE_CHARS
from schemas.states import (
    LIVE_PLAN_STATES,
    UNFINISHED_CAMPAIGN_STATES,
    Entity,
    PlanState,
    RealizationState,
    advance,
)
from service.campaigns.lifecycle import fail_unfinished, settle_campaign
from service.campaigns.models import Campaign
from service.db import Database, utcnow
from service.events.service import record_event
from service.queue.errors import LeaseLost, PlanNotFound
from service.queue.leases import lease_expiry
from service.queue.models import PreprocessingPlan
from service.workers.models import Worker

log = logging.getLogger("mapcampaign.queue")


def find_plan(*, session: Session, scan_key: str, ranks: int, site: str) -> PreprocessingPlan | None:
    return session.scalar(
        select(PreprocessingPlan).where(
            PreprocessingPlan.scan_key == scan_key, PreprocessingPlan.ranks == ranks, PreprocessingPlan.site == site
        )
    )


def take_build(
    *,
    session: Session,
    scan_key: str,
    ranks: int,
    site: str,
    worker: Worker,
    campaign_id: int,
    campaign_queued_at: datetime,
    lease_s: float,
    max_builds: int,
) -> PreprocessingPlan | None:
    """Give ``worker`` the build of this plan if nobody builds it and it is not ready; else None."""
    now = utcnow()
    expires = lease_expiry(lease_s, now)
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    inserted = session.execute(
        insert(PreprocessingPlan)
        .values(
            scan_key=scan_key,
            ranks=ranks,
            site=site,
            state=PlanState.BUILDING,
            uses=0,
            build_attempts=1,
            build_number=1,
            campaign_id=campaign_id,
            lease_holder_id=worker.id,
            lease_expires_at=expires,
            created_at=now,
        )
        .on_conflict_do_nothing(index_elements=["scan_key", "ranks", "site"])
        .returning(PreprocessingPlan.id)
    ).scalar()
    if inserted is not None:
        plan = session.get(PreprocessingPlan, inserted)
        assert plan is not None  # inserted by this transaction
        _announce_build(session, plan, worker)
        return plan
    plan = find_plan(session=session, scan_key=scan_key, ranks=ranks, site=site)
    if plan is None or plan.state != PlanState.FAILED:
        return None
    attempts = plan.build_attempts
    if attempts >= max_builds:
        if plan.failed_at is not None and campaign_queued_at > plan.failed_at:
            attempts = 0  # a campaign queued after the failure: a fresh budget
        else:
            return None
    # Optimistic: only one claimer turns this failed row into a build.
    result = session.execute(
        update(PreprocessingPlan)
        .where(
            PreprocessingPlan.id == plan.id,
            PreprocessingPlan.state == PlanState.FAILED,
            PreprocessingPlan.build_attempts == plan.build_attempts,
        )
        .values(
            state=advance(Entity.PLAN, plan.state, PlanState.BUILDING),
            build_attempts=attempts + 1,
            build_number=PreprocessingPlan.build_number + 1,
            campaign_id=campaign_id,
            lease_holder_id=worker.id,
            lease_expires_at=expires,
        )
        .execution_options(synchronize_session=False)
    )
    if cast("CursorResult[Any]", result).rowcount != 1:  # an UPDATE's result is a cursor's
        return None
    session.refresh(plan)
    _announce_build(session, plan, worker)
    return plan


def _announce_build(session: Session, plan: PreprocessingPlan, worker: Worker) -> None:
    record_event(
        session,
        "plan",
        state=plan.state,
        plan_id=plan.id,
        data={
            "scan_key": plan.scan_key,
            "ranks": plan.ranks,
            "site": plan.site,
            "build": plan.build_number,
            "build_attempt": plan.build_attempts,
            "worker": worker.name,
        },
    )


def locked_build(*, session: Session, plan_id: int, build: int, worker_id: int) -> PreprocessingPlan:
    """The plan row, locked, if this worker still holds build number ``build``; else LeaseLost/PlanNotFound."""
    plan = session.scalar(select(PreprocessingPlan).where(PreprocessingPlan.id == plan_id).with_for_update())
    if plan is None:
        raise PlanNotFound(f"plan {plan_id} not found")
    if plan.state != PlanState.BUILDING or plan.build_number != build or plan.lease_holder_id != worker_id:
        raise LeaseLost(f"build {build} of plan {plan_id} is no longer this worker's (plan is {plan.state})")
    return plan


def report_built(*, session: Session, plan: PreprocessingPlan, report: PlanBuilt) -> None:
    plan.state = advance(Entity.PLAN, plan.state, PlanState.READY)
    plan.path = report.path
    plan.checksum = report.checksum
    plan.size_bytes = report.size_bytes
    plan.build_time_s = report.build_time_s
    plan.last_error = None
    plan.lease_holder_id = None
    plan.lease_expires_at = None
    plan.ready_at = utcnow()
    record_event(
        session,
        "plan",
        state=plan.state,
        plan_id=plan.id,
        data={"scan_key": plan.scan_key, "ranks": plan.ranks, "site": plan.site},
    )
    session.commit()


def invalidate_plan(*, session: Session, plan_id: int, checksum: str, cause: str) -> PreprocessingPlan:
    """A worker refused the ready plan ``checksum``: mark it failed so the next claim builds it again; commit.

    The build had succeeded, so the rebuild gets a fresh build budget. A plan
    that is no longer ready with that checksum (invalidated already, being
    rebuilt, rebuilt) is left as it is: the call is idempotent.
    """
    plan = session.scalar(select(PreprocessingPlan).where(PreprocessingPlan.id == plan_id).with_for_update())
    if plan is None:
        raise PlanNotFound(f"plan {plan_id} not found")
    if plan.state != PlanState.READY or plan.checksum != checksum:
        session.rollback()
        return plan
    plan.state = advance(Entity.PLAN, plan.state, PlanState.FAILED)
    plan.last_error = cause[-MAX_MESSAGE_CHARS:]
    plan.failed_at = utcnow()
    plan.build_attempts = 0
    plan.lease_holder_id = None
    plan.lease_expires_at = None
    record_event(
        session,
        "plan",
        state=plan.state,
        plan_id=plan.id,
        data={
            "scan_key": plan.scan_key,
            "ranks": plan.ranks,
            "site": plan.site,
            "invalidated": True,
            "error": plan.last_error[-500:],
        },
    )
    session.commit()
    log.warning(
        "plan %d (%s, %d ranks, site %s) invalidated: %s", plan.id, plan.scan_key[:12], plan.ranks, plan.site, cause
    )
    return plan


def report_build_failed(
    *, database: Database, session: Session, plan: PreprocessingPlan, cause: str, max_builds: int
) -> None:
    """Record a failed build (reported or lost) and commit; past the limit, fail the campaigns that need it."""
    plan.state = advance(Entity.PLAN, plan.state, PlanState.FAILED)
    plan.last_error = cause[-MAX_MESSAGE_CHARS:]
    plan.failed_at = utcnow()
    plan.lease_holder_id = None
    plan.lease_expires_at = None
    exhausted = plan.build_attempts >= max_builds
    record_event(
        session,
        "plan",
        state=plan.state,
        plan_id=plan.id,
        data={
            "scan_key": plan.scan_key,
            "ranks": plan.ranks,
            "site": plan.site,
            "build_attempt": plan.build_attempts,
            "final": exhausted,
            "error": plan.last_error[-500:],
        },
    )
    session.commit()
    if exhausted:
        fail_campaigns_needing(database=database, plan=plan)


def fail_campaigns_needing(*, database: Database, plan: PreprocessingPlan) -> int:
    """Fail every unfinished campaign queued before the plan's last failure that needs this plan.

    Not while another site holds the same plan ready or building: those campaigns can still finish there.
    """
    cause = (
        f"preprocessing for scan key {plan.scan_key[:12]}, {plan.ranks} ranks at site {plan.site!r} failed "
        f"{plan.build_attempts} times; last error: {(plan.last_error or 'unknown')[-1_000:]}"
    )
    failed = 0
    with database.session() as session:
        # Plans are per site: while another site has this plan ready or building, the campaigns go on there.
        elsewhere = session.scalar(
            select(PreprocessingPlan.site)
            .where(
                PreprocessingPlan.scan_key == plan.scan_key,
                PreprocessingPlan.ranks == plan.ranks,
                PreprocessingPlan.site != plan.site,
                PreprocessingPlan.state.in_(LIVE_PLAN_STATES),
            )
            .limit(1)
        )
        if elsewhere is not None:
            log.warning("%s; the campaigns needing it go on at site %r", cause, elsewhere)
            return 0
        needing = select(Campaign.id).where(
            Campaign.scan_key == plan.scan_key,
            Campaign.ranks == plan.ranks,
            Campaign.state.in_(UNFINISHED_CAMPAIGN_STATES),
        )
        if plan.failed_at is not None:  # campaigns queued later get a fresh budget of builds
            needing = needing.where(Campaign.queued_at <= plan.failed_at)
        ids = list(session.scalars(needing))
    for campaign_id in sorted(ids):
        # One transaction per campaign, campaign row locked first like every other change.
        with database.session() as session:
            campaign = session.scalar(select(Campaign).where(Campaign.id == campaign_id).with_for_update())
            if campaign is None or campaign.state not in UNFINISHED_CAMPAIGN_STATES:
                continue
            if plan.failed_at is not None and campaign.queued_at > plan.failed_at:
                continue
            campaign.failure_cause = cause
            fail_unfinished(
                session=session, campaign=campaign, state=RealizationState.FAILED, failure_class="cancelled"
            )
            settle_campaign(session=session, campaign=campaign)
            session.commit()
            failed += 1
            log.warning("campaign %d failed: %s", campaign_id, cause)
    return failed


def plan_info(plan: PreprocessingPlan, holder: str | None) -> PlanInfo:
    return PlanInfo(
        id=plan.id,
        scan_key=plan.scan_key,
        ranks=plan.ranks,
        site=plan.site,
        state=plan.state,
        path=plan.path,
        checksum=plan.checksum,
        build_time_s=plan.build_time_s,
        size_bytes=plan.size_bytes,
        uses=plan.uses,
        build_attempts=plan.build_attempts,
        last_error=plan.last_error,
        lease_holder=holder,
        lease_expires_at=plan.lease_expires_at,
        created_at=plan.created_at,
        ready_at=plan.ready_at,
    )


def used_by_owner(owner_id: int) -> ColumnElement[bool]:
    """A plan one of this user's campaigns needs (same scan key and ranks), as the dashboard's plans page."""
    return exists().where(
        Campaign.owner_id == owner_id,
        Campaign.scan_key == PreprocessingPlan.scan_key,
        Campaign.ranks == PreprocessingPlan.ranks,
    )


def list_plans(
    *,
    session: Session,
    visible_to: int | None,
    state: PlanState | None,
    scan_key: str | None,
    site: str | None,
    after_id: int | None,
    limit: int,
) -> list[PlanInfo]:
    """Plans by id; ``visible_to`` a user id: only the plans that user's campaigns need; None: all of them."""
    query = select(PreprocessingPlan, Worker.name).outerjoin(Worker, Worker.id == PreprocessingPlan.lease_holder_id)
    if visible_to is not None:
        query = query.where(used_by_owner(visible_to))
    if state is not None:
        query = query.where(PreprocessingPlan.state == state)
    if scan_key is not None:
        query = query.where(PreprocessingPlan.scan_key == scan_key)
    if site is not None:
        query = query.where(PreprocessingPlan.site == site)
    if after_id is not None:
        query = query.where(PreprocessingPlan.id > after_id)
    return [plan_info(plan, name) for plan, name in session.execute(query.order_by(PreprocessingPlan.id).limit(limit))]


def get_plan(*, session: Session, plan_id: int, visible_to: int | None) -> PlanInfo:
    """One plan; PlanNotFound also when ``visible_to`` (a user id) has no campaign that needs it."""
    query = (
        select(PreprocessingPlan, Worker.name)
        .outerjoin(Worker, Worker.id == PreprocessingPlan.lease_holder_id)
        .where(PreprocessingPlan.id == plan_id)
    )
    if visible_to is not None:
        query = query.where(used_by_owner(visible_to))
    row = session.execute(query).first()
    if row is None:
        raise PlanNotFound(f"plan {plan_id} not found")
    return plan_info(*row)
