"""Claim: hand a worker its next tasks, each exactly once.

Order: campaign priority (higher first), then campaign age, then realisation
index. A realisation is handed to a worker of site S only when the plan for
its (scan key, ranks) is ready at S; when that plan does not exist at S (or
failed with builds left), the worker gets the ``preprocess`` task instead.

Atomicity: on PostgreSQL the realisation rows are taken with
``FOR UPDATE SKIP LOCKED``, so concurrent claimers pass each other instead
of queueing; on SQLite the write session began with ``BEGIN IMMEDIATE``, so
claims are serialised.

Lock order, the same in every transaction that changes realisations:
campaign row, then plan row, then realisation rows (by id), then the event lock.
"""
from __future__ import annotations

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from schemas.api import PlanRef, PreprocessTask, RealizeTask, preprocess_task_id, realize_task_id
from schemas.spec import CampaignSpec
from service.campaigns.models import Attempt, Campaign, Realization
from service.config import Settings
from service.db import utcnow
from service.events.service import record_event
from service.queue.leases import lease_expiry
from service.queue.models import PreprocessingPlan
from service.queue.plans import find_plan, take_build
from service.workers.models import Worker

Task = PreprocessTask | RealizeTask


def claim_tasks(*, session: Session, worker: Worker, max_tasks: int, settings: Settings) -> list[Task]:
    """Claim up to ``max_tasks`` tasks for ``worker`` and commit."""
    now = utcnow()
    expires = lease_expiry(settings.lease_s, now)
    worker.last_heartbeat_at = now
    has_queued = exists().where(Realization.campaign_id == Campaign.id, Realization.state == "queued")
    candidates = list(session.execute(
        select(Campaign.id, Campaign.scan_key, Campaign.ranks, Campaign.state, Campaign.queued_at)
        .where(Campaign.state.in_(("queued", "running")), has_queued)
        .order_by(Campaign.priority.desc(), Campaign.created_at, Campaign.id)
    ))
    tasks: list[Task] = []
    specs: dict[int, CampaignSpec] = {}
    ready: dict[tuple[str, int], PreprocessingPlan] = {}
    seen: set[tuple[str, int]] = set()
    for campaign_id, key, ranks, _state, queued_at in candidates:
        if (key, ranks) in seen:
            continue
        seen.add((key, ranks))
        plan = find_plan(session=session, scan_key=key, ranks=ranks, site=worker.site)
        if plan is not None and plan.state == "ready":
            ready[(key, ranks)] = plan
            continue
        if len(tasks) >= max_tasks or (plan is not None and plan.state == "building"):
            continue
        plan = take_build(session=session, scan_key=key, ranks=ranks, site=worker.site, worker=worker,
                          campaign_id=campaign_id, campaign_queued_at=queued_at, lease_s=settings.lease_s,
                          max_builds=settings.max_plan_builds)
        if plan is not None:
            spec = specs.setdefault(campaign_id, _spec(session, campaign_id))
            tasks.append(PreprocessTask(
                task_id=preprocess_task_id(plan.id, plan.build_number), plan_id=plan.id,
                build_attempt=plan.build_number, scan_key=key, ranks=ranks, site=worker.site,
                campaign_id=campaign_id, spec=spec, lease_expires_at=expires,
            ))

    slots = max_tasks - len(tasks)
    runnable = [row for row in candidates if (row[1], row[2]) in ready]
    if slots > 0 and runnable:
        first_claims = sorted(row[0] for row in runnable if row[3] == "queued")
        if first_claims:
            # The campaign goes queued -> running; lock its row first, as every other writer does.
            session.execute(select(Campaign.id).where(Campaign.id.in_(first_claims)).order_by(Campaign.id).with_for_update())
        realizations = list(session.scalars(
            select(Realization)
            .join(Campaign, Campaign.id == Realization.campaign_id)
            .where(Realization.state == "queued", Campaign.id.in_([row[0] for row in runnable]),
                   Campaign.state.in_(("queued", "running")))
            .order_by(Campaign.priority.desc(), Campaign.created_at, Campaign.id, Realization.index)
            .limit(slots)
            .with_for_update(of=Realization, skip_locked=True)
        ))
        campaigns = {row[0]: row for row in runnable}
        owners = dict(session.execute(select(Campaign.id, Campaign.owner_id).where(Campaign.id.in_(list(campaigns)))).all())
        attempts = []
        for realization in realizations:
            realization.attempts += 1
            realization.attempts_total += 1
            realization.state = "claimed"
            realization.lease_holder_id = worker.id
            realization.lease_expires_at = expires
            realization.updated_at = now
            attempt = Attempt(realization_id=realization.id, campaign_id=realization.campaign_id,
                              number=realization.attempts_total, worker_id=worker.id, claimed_at=now)
            _, key, ranks, _, _ = campaigns[realization.campaign_id]
            attempt.plan_id = ready[(key, ranks)].id
            session.add(attempt)
            attempts.append(attempt)
        session.flush()
        for realization, attempt in zip(realizations, attempts):
            realization.current_attempt_id = attempt.id
            _, key, ranks, _, _ = campaigns[realization.campaign_id]
            plan = ready[(key, ranks)]
            spec = specs.setdefault(realization.campaign_id, _spec(session, realization.campaign_id))
            tasks.append(RealizeTask(
                task_id=realize_task_id(attempt.id), attempt_id=attempt.id, campaign_id=realization.campaign_id,
                realization=realization.index, attempt=attempt.number, spec=spec,
                plan=PlanRef(id=plan.id, path=plan.path or "", checksum=plan.checksum or ""), lease_expires_at=expires,
            ))
            record_event(session, "realization", state="claimed", owner_id=owners[realization.campaign_id],
                         campaign_id=realization.campaign_id, realization=realization.index,
                         data={"attempt": attempt.number, "worker": worker.name})
        if first_claims:
            claimed_campaigns = {realization.campaign_id for realization in realizations}
            for campaign in session.scalars(select(Campaign).where(Campaign.id.in_(first_claims))):
                if campaign.id in claimed_campaigns and campaign.state == "queued":
                    campaign.state = "running"
                    record_event(session, "campaign", state="running", owner_id=campaign.owner_id,
                                 campaign_id=campaign.id, data={"from": "queued"})
    session.commit()
    return tasks


def _spec(session: Session, campaign_id: int) -> CampaignSpec:
    return CampaignSpec.model_validate(session.scalar(select(Campaign.spec).where(Campaign.id == campaign_id)))
