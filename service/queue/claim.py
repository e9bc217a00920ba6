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

from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import NamedTuple, cast

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    String,
    Table,
    Update,
    and_,
    bindparam,
    exists,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from schemas.api import PlanRef, PreprocessTask, RealizeTask, preprocess_task_id, realize_task_id
from schemas.spec import CampaignSpec
from schemas.states import UNFINISHED_CAMPAIGN_STATES, CampaignState, Entity, PlanState, RealizationState, advance
from service.campaigns.models import Attempt, Campaign, Realization
from service.campaigns.specs import known_spec
from service.config import Settings
from service.db import UTCDateTime, in_chunks, is_postgresql, utcnow
from service.events.service import record_event
from service.events.transitions import CampaignStarted, EventKind, RealizationClaimed, transition
from service.queue.leases import lease_expiry
from service.queue.models import PreprocessingPlan
from service.queue.plans import take_build
from service.workers.models import Worker

Task = PreprocessTask | RealizeTask


@dataclass
class ClaimAnswer:
    """The tasks handed out so far in one claim, and what bounds the rest."""

    worker: Worker
    max_tasks: int
    now: datetime
    expires: datetime
    tasks: list[Task] = field(default_factory=list)
    spec_bytes: int = 0  # of the specs in the answer so far (see CLAIM_SPEC_BYTES)

    @property
    def full(self) -> bool:
        return len(self.tasks) >= self.max_tasks or self.spec_bytes >= CLAIM_SPEC_BYTES


def claim_tasks(
    *, session: Session, worker: Worker, max_tasks: int, settings: Settings, now: datetime | None = None
) -> list[Task]:
    """Claim up to ``max_tasks`` tasks for ``worker`` (its row locked by the caller:
    :func:`service.workers.service.hold_worker`) and commit."""
    now = now or utcnow()
    answer = ClaimAnswer(worker=worker, max_tasks=max_tasks, now=now, expires=lease_expiry(settings.lease_s, now))
    candidates, plans_here = _campaigns_with_queued_work(session, worker.site)
    ready = _hand_out_plan_builds(session, answer, candidates, plans_here, settings)
    runnable = [candidate for candidate in candidates if (candidate.scan_key, candidate.ranks) in ready]
    first_claims = _lock_campaigns_starting(session, answer, runnable)
    started = _hand_out_realizations(session, answer, runnable, ready)
    _start_campaigns(session, [campaign_id for campaign_id in first_claims if campaign_id in started])
    session.commit()
    return answer.tasks


def _campaigns_with_queued_work(
    session: Session, site: str
) -> tuple[list[Candidate], dict[tuple[str, int], PreprocessingPlan]]:
    """Unfinished campaigns with a queued realisation, in claim order (priority, then age), and the plans of
    ``site`` they need, by (scan key, ranks): one query.

    The plans once came in a query of their own (one per active scan key before that: 300 campaigns
    building plans made an empty claim cost 0.5 s, as a review measured it); joined here, a claim costs
    one round trip fewer.
    """
    candidates: list[Candidate] = []
    plans_here: dict[tuple[str, int], PreprocessingPlan] = {}
    for row in session.execute(_candidates_statement(), {"site": site}):
        candidate, plan = Candidate(*row[:-1]), row[-1]
        candidates.append(candidate)
        if plan is not None:
            plans_here[(candidate.scan_key, candidate.ranks)] = plan
    return candidates, plans_here


@cache
def _candidates_statement() -> Select[int, int, str, int, CampaignState, datetime, str, int, PreprocessingPlan]:
    """The query of :func:`_campaigns_with_queued_work`, built once (``site`` a bound parameter)."""
    has_queued = exists().where(Realization.campaign_id == Campaign.id, Realization.state == RealizationState.QUEUED)
    site_plan = and_(
        PreprocessingPlan.site == bindparam("site", type_=String()),
        PreprocessingPlan.scan_key == Campaign.scan_key,
        PreprocessingPlan.ranks == Campaign.ranks,
    )
    return (
        select(
            Campaign.id,
            Campaign.owner_id,
            Campaign.scan_key,
            Campaign.ranks,
            Campaign.state,
            Campaign.queued_at,
            Campaign.spec_hash,
            Campaign.realizations,
            PreprocessingPlan,
        )
        .outerjoin(PreprocessingPlan, site_plan)
        .where(Campaign.state.in_(UNFINISHED_CAMPAIGN_STATES), has_queued)
        .order_by(Campaign.priority.desc(), Campaign.created_at, Campaign.id)
    )


def _hand_out_plan_builds(
    session: Session,
    answer: ClaimAnswer,
    candidates: list[Candidate],
    plans_here: dict[tuple[str, int], PreprocessingPlan],
    settings: Settings,
) -> dict[tuple[str, int], PreprocessingPlan]:
    """Give the worker the builds its site needs (``preprocess`` tasks); return the plans ready at its site."""
    worker = answer.worker
    ready: dict[tuple[str, int], PreprocessingPlan] = {}
    seen: set[tuple[str, int]] = set()
    for candidate in candidates:
        key = (candidate.scan_key, candidate.ranks)
        if key in seen:
            continue
        seen.add(key)
        plan = plans_here.get(key)
        if plan is not None and plan.state == PlanState.READY:
            ready[key] = plan
            continue
        if answer.full or (plan is not None and plan.state == PlanState.BUILDING):
            continue
        plan = take_build(
            session=session,
            scan_key=candidate.scan_key,
            ranks=candidate.ranks,
            site=worker.site,
            worker=worker,
            campaign_id=candidate.id,
            campaign_queued_at=candidate.queued_at,
            lease_s=settings.lease_s,
            max_builds=settings.max_plan_builds,
        )
        if plan is not None:
            spec, size = _spec_and_size(session, candidate)
            answer.spec_bytes += size
            answer.tasks.append(
                PreprocessTask(
                    task_id=preprocess_task_id(plan.id, plan.build_number),
                    plan_id=plan.id,
                    build_attempt=plan.build_number,
                    scan_key=candidate.scan_key,
                    ranks=candidate.ranks,
                    site=worker.site,
                    campaign_id=candidate.id,
                    spec=spec,
                    lease_expires_at=answer.expires,
                )
            )
    return ready


def _lock_campaigns_starting(session: Session, answer: ClaimAnswer, runnable: list[Candidate]) -> list[int]:
    """Ids of the queued campaigns this claim may start; their rows locked first, as every other writer does."""
    first_claims = sorted(candidate.id for candidate in runnable if candidate.state == CampaignState.QUEUED)
    if answer.max_tasks > len(answer.tasks):
        for chunk in in_chunks(first_claims):  # ascending ids chunk after chunk: locked in id order
            session.execute(select(Campaign.id).where(Campaign.id.in_(chunk)).order_by(Campaign.id).with_for_update())
    return first_claims


def _hand_out_realizations(
    session: Session,
    answer: ClaimAnswer,
    runnable: list[Candidate],
    ready: dict[tuple[str, int], PreprocessingPlan],
) -> set[int]:
    """Claim queued realisations of the runnable campaigns, in order; return the ids of the campaigns served."""
    started: set[int] = set()
    for candidate in runnable:
        slots = answer.max_tasks - len(answer.tasks)
        if slots <= 0 or answer.spec_bytes >= CLAIM_SPEC_BYTES:
            break
        spec, size = _spec_and_size(session, candidate)
        slots = min(slots, max(1 if not answer.tasks else 0, (CLAIM_SPEC_BYTES - answer.spec_bytes) // max(size, 1)))
        if slots <= 0:
            break
        plan = ready[(candidate.scan_key, candidate.ranks)]
        if is_postgresql(session):
            claimed = _claim_in_one_statement(session, answer, candidate, plan, spec, slots)
        else:
            claimed = _claim_row_by_row(session, answer, candidate, plan, spec, slots)
        if not claimed:
            continue
        answer.spec_bytes += size * claimed
        started.add(candidate.id)
    return started


def _claim_in_one_statement(
    session: Session,
    answer: ClaimAnswer,
    candidate: Candidate,
    plan: PreprocessingPlan,
    spec: CampaignSpec,
    slots: int,
) -> int:
    """PostgreSQL: take up to ``slots`` queued realisations, open their attempts and lease them in one
    statement; return how many were taken.

    One round trip instead of three (select the rows, insert the attempts, update the rows) and no ORM
    objects: the claim rate was bound by statements and their Python side, not by the database's work.
    ``FOR UPDATE SKIP LOCKED`` in the first step is what makes each realisation go to one claimer only.
    """
    worker, now = answer.worker, answer.now
    claimed_state = advance(Entity.REALIZATION, RealizationState.QUEUED, RealizationState.CLAIMED)
    parameters = {
        "claim_campaign_id": candidate.id,
        "claim_slots": slots,
        "claim_plan_id": plan.id,
        "claim_worker_id": worker.id,
        "claim_now": now,
        "claim_expires": answer.expires,
    }
    # RETURNING comes in no set order: the answer is in index order
    rows = sorted(session.execute(_claim_statement(), parameters).all())
    for index, attempt_id, number in rows:
        _add_realize_task(answer, candidate, plan, spec, index=index, attempt_id=attempt_id, number=number)
        _record_claimed(session, answer, candidate, state=claimed_state, index=index, number=number)
    return len(rows)


@cache
def _claim_statement() -> Update:
    """The statement of :func:`_claim_in_one_statement`, built once with its values as bound parameters.

    Building it for every claim (three nested constructs, then their cache key) cost more of a claim's
    Python time than any other step.
    """
    realizations = cast(Table, Realization.__table__)
    attempts = cast(Table, Attempt.__table__)
    picked = (
        select(realizations.c.id, realizations.c.attempts_total)
        .where(
            realizations.c.campaign_id == bindparam("claim_campaign_id", type_=BigInteger),
            realizations.c.state == RealizationState.QUEUED,
        )
        .order_by(realizations.c.index)
        .limit(bindparam("claim_slots", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    opened = (
        insert(attempts)
        .from_select(
            ["realization_id", "campaign_id", "number", "plan_id", "worker_id", "claimed_at"],
            select(
                picked.c.id,
                bindparam("claim_campaign_id", type_=BigInteger),
                picked.c.attempts_total + 1,
                bindparam("claim_plan_id", type_=BigInteger),
                bindparam("claim_worker_id", type_=BigInteger),
                bindparam("claim_now", type_=UTCDateTime()),
            ),
        )
        .returning(attempts.c.id, attempts.c.realization_id, attempts.c.number)
        .cte("opened")
    )
    return (
        update(realizations)
        .where(realizations.c.id == opened.c.realization_id)
        .values(
            state=advance(Entity.REALIZATION, RealizationState.QUEUED, RealizationState.CLAIMED),
            attempts=realizations.c.attempts + 1,
            attempts_total=realizations.c.attempts_total + 1,
            lease_holder_id=bindparam("claim_worker_id", type_=BigInteger),
            lease_expires_at=bindparam("claim_expires", type_=UTCDateTime()),
            current_attempt_id=opened.c.id,
            updated_at=bindparam("claim_now", type_=UTCDateTime()),
        )
        .returning(realizations.c.index, opened.c.id, opened.c.number)
    )


def _claim_row_by_row(
    session: Session,
    answer: ClaimAnswer,
    candidate: Candidate,
    plan: PreprocessingPlan,
    spec: CampaignSpec,
    slots: int,
) -> int:
    """SQLite (one writer at a time, BEGIN IMMEDIATE): the same claim through the ORM; return how many."""
    worker, now = answer.worker, answer.now
    realizations = list(
        session.scalars(
            select(Realization)
            .where(Realization.campaign_id == candidate.id, Realization.state == RealizationState.QUEUED)
            .order_by(Realization.index)
            .limit(slots)
        )
    )
    attempts = [
        Attempt(
            realization_id=realization.id,
            campaign_id=candidate.id,
            number=realization.attempts_total + 1,
            worker_id=worker.id,
            plan_id=plan.id,
            claimed_at=now,
        )
        for realization in realizations
    ]
    session.add_all(attempts)
    session.flush()
    for realization, attempt in zip(realizations, attempts, strict=True):
        realization.attempts += 1
        realization.attempts_total += 1
        realization.lease_holder_id = worker.id
        realization.lease_expires_at = answer.expires
        realization.current_attempt_id = attempt.id
        realization.updated_at = now
        _add_realize_task(
            answer, candidate, plan, spec, index=realization.index, attempt_id=attempt.id, number=attempt.number
        )
        transition(
            session,
            realization,
            to=RealizationState.CLAIMED,
            event=EventKind.REALIZATION,
            data=RealizationClaimed(attempt=attempt.number, worker=answer.worker.name),
            owner_id=candidate.owner_id,
            campaign_id=candidate.id,
            realization=realization.index,
        )
    return len(realizations)


def _add_realize_task(
    answer: ClaimAnswer,
    candidate: Candidate,
    plan: PreprocessingPlan,
    spec: CampaignSpec,
    *,
    index: int,
    attempt_id: int,
    number: int,
) -> None:
    answer.tasks.append(
        RealizeTask(
            task_id=realize_task_id(attempt_id),
            attempt_id=attempt_id,
            campaign_id=candidate.id,
            realization=index,
            attempt=number,
            spec=spec,
            plan=PlanRef(id=plan.id, path=plan.path or "", checksum=plan.checksum or ""),
            lease_expires_at=answer.expires,
        )
    )


def _record_claimed(
    session: Session, answer: ClaimAnswer, candidate: Candidate, *, state: RealizationState, index: int, number: int
) -> None:
    record_event(
        session,
        EventKind.REALIZATION,
        state=state,
        owner_id=candidate.owner_id,
        campaign_id=candidate.id,
        realization=index,
        data=dict(RealizationClaimed(attempt=number, worker=answer.worker.name)),
    )


def _start_campaigns(session: Session, campaign_ids: list[int]) -> None:
    """The campaigns whose first realisations this claim handed out go from queued to running."""
    for campaign_id in campaign_ids:
        campaign = session.get(Campaign, campaign_id)
        if campaign is not None and campaign.state == CampaignState.QUEUED:
            transition(
                session,
                campaign,
                to=CampaignState.RUNNING,
                event=EventKind.CAMPAIGN,
                data=CampaignStarted({"from": CampaignState.QUEUED}),
                owner_id=campaign.owner_id,
                campaign_id=campaign.id,
            )


class Candidate(NamedTuple):
    id: int
    owner_id: int
    scan_key: str
    ranks: int
    state: CampaignState
    queued_at: datetime
    spec_hash: str
    realizations: int


# Every task of a claim answer carries its campaign's spec; a spec may be large (up to 10,000 detectors),
# so a claim stops adding tasks once their specs reach this many bytes (always at least one task). The
# answer stays small enough to arrive well within the worker's wait, whatever max_tasks says.
CLAIM_SPEC_BYTES = 16 << 20


def _spec_and_size(session: Session, candidate: Candidate) -> tuple[CampaignSpec, int]:
    """The campaign's spec (its count as it stands: an extended campaign's new indices are in range for the
    map-maker) and its JSON size in bytes, validated once per process."""
    return known_spec(candidate, lambda: session.scalar(select(Campaign.spec).where(Campaign.id == candidate.id)))
