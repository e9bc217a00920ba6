"""What workers report about the tasks they hold: started, succeeded, failed, plan built; and heartbeats.

Every report names a task id. A report is accepted only from the worker that
holds the task's lease (same token as the worker that claimed it) and only
while the task is current: a reaped, cancelled, reassigned or already
finished task answers 409 and changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from schemas.api import (
    HeartbeatAnswer,
    PlanBuilt,
    TaskFailed,
    TaskStarted,
    parse_task_id,
    realize_task_id,
    site_path_problem,
)
from schemas.result import KEPT_ROLES, RealizationResult
from schemas.spec import CampaignSpec, spec_hash
from schemas.states import (
    LEASED_REALIZATION_STATES,
    AttemptState,
    Entity,
    PlanState,
    RealizationState,
    advance,
    attempt_state,
)
from service.auth.service import Principal
from service.campaigns.hold import NOT_THE_SPECS_DOING, hold_if_failing_alike
from service.campaigns.hooks import AcceptedResult
from service.campaigns.lifecycle import settle_campaign
from service.campaigns.models import Attempt, Campaign, Realization
from service.config import Settings
from service.db import Database, in_chunks, utcnow
from service.errors import InvalidField
from service.events.transitions import (
    EventKind,
    RealizationEnded,
    RealizationStarted,
    RealizationSucceeded,
    transition,
)
from service.queue.couplings import record_coupling_use
from service.queue.errors import (
    LeaseLost,
    NotTaskHolder,
    ResultAlreadyAccepted,
    ResultMismatch,
    TaskNotFound,
    WrongTaskKind,
)
from service.queue.leases import lease_expiry
from service.queue.models import PreprocessingPlan
from service.queue.plans import locked_build, report_build_failed, report_built
from service.storage import ArtifactStore
from service.workers.models import Worker

# Drained attempts a realisation is given back before drains count against max_attempts.
MAX_UNCHARGED_DRAINS = 5
# Likewise attempts a worker could not launch for its site's reasons (work folder unwritable, Parsl
# refusing): the site's fault, not the realisation's; fewer, as a broken site may keep claiming.
MAX_UNCHARGED_SITE_ERRORS = 3
UNCHARGED_FAILURES = {"drained": MAX_UNCHARGED_DRAINS, "site_error": MAX_UNCHARGED_SITE_ERRORS}

log = logging.getLogger("mapcampaign.queue")


@dataclass
class HeldAttempt:
    """A realize task, its rows locked (campaign, then realisation), checked to be the caller's and current."""

    attempt: Attempt
    realization: Realization
    campaign: Campaign
    worker: Worker


def _parse(task_id: str) -> tuple[str, int, int | None]:
    parsed = parse_task_id(task_id)
    if parsed is None:
        raise TaskNotFound(f"task id {task_id!r} is not one this service hands out")
    return parsed


def _check_token(worker: Worker | None, principal: Principal, task_id: str) -> Worker:
    if worker is None or worker.token_id != principal.token_id:
        raise NotTaskHolder(f"task {task_id} is held by a worker registered with another token")
    return worker


def hold_attempt(*, session: Session, task_id: str, principal: Principal, for_result: bool = False) -> HeldAttempt:
    kind, attempt_id, _ = _parse(task_id)
    if kind != "realize":
        raise WrongTaskKind(f"task {task_id} is a preprocess task; report it with plan-built or failed")
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise TaskNotFound(f"task {task_id} not found (its campaign may have been deleted)")
    campaign = session.scalar(select(Campaign).where(Campaign.id == attempt.campaign_id).with_for_update())
    realization = session.scalar(select(Realization).where(Realization.id == attempt.realization_id).with_for_update())
    if campaign is None or realization is None:  # deleted between reading the attempt and locking its rows
        raise TaskNotFound(f"task {task_id} not found (its campaign was deleted)")
    session.refresh(attempt)
    worker = _check_token(session.get(Worker, attempt.worker_id) if attempt.worker_id else None, principal, task_id)
    if realization.state == RealizationState.SUCCEEDED and for_result:
        raise ResultAlreadyAccepted(
            f"realisation {realization.index} of campaign {campaign.id} already has an accepted result; "
            "this report changes nothing"
        )
    current = (
        realization.current_attempt_id == attempt.id
        and realization.lease_holder_id == attempt.worker_id
        and realization.state in LEASED_REALIZATION_STATES
        and attempt.ended_at is None
    )
    if not current:
        why = {
            RealizationState.CANCELLED: "the campaign was cancelled",
            RealizationState.FAILED: "the realisation failed",
        }.get(realization.state, "the lease expired and the task went back to the queue")
        raise LeaseLost(f"task {task_id} is no longer this worker's: {why}")
    return HeldAttempt(attempt=attempt, realization=realization, campaign=campaign, worker=worker)


def check_plan_user(*, session: Session, task_id: str, principal: Principal, plan_id: int) -> Worker:
    """The caller holds realize task ``task_id``, whose attempt was given plan ``plan_id``; return its worker.

    A read, without row locks: it only decides who may invalidate a plan, and
    a task that ends meanwhile does not make the plan any better.
    """
    kind, attempt_id, _ = _parse(task_id)
    if kind != "realize":
        raise WrongTaskKind(f"task {task_id} is a preprocess task; only a realize task can refuse a plan")
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise TaskNotFound(f"task {task_id} not found (its campaign may have been deleted)")
    worker = _check_token(session.get(Worker, attempt.worker_id) if attempt.worker_id else None, principal, task_id)
    realization = session.get(Realization, attempt.realization_id)
    if realization is None or realization.current_attempt_id != attempt.id or attempt.ended_at is not None:
        raise LeaseLost(f"task {task_id} is no longer this worker's")
    if attempt.plan_id != plan_id:
        raise ResultMismatch(f"task {task_id} was given plan {attempt.plan_id}, not plan {plan_id}")
    return worker


def record_cancelled_exit(
    *, session: Session, task_id: str, principal: Principal, report: TaskFailed
) -> RealizationState | None:
    """The worker's report on an attempt the service itself ended as cancelled: keep its exit code and log tail.

    Returns the realisation's state when the report was such a one (recorded once;
    a repeat changes nothing), else None.
    """
    kind, attempt_id, _ = _parse(task_id)
    if kind != "realize" or report.failure_class != "cancelled":
        return None
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.state != AttemptState.CANCELLED:
        return None
    _check_token(session.get(Worker, attempt.worker_id) if attempt.worker_id else None, principal, task_id)
    if attempt.exit_code is None and attempt.log_tail is None:
        session.execute(
            update(Attempt)
            .where(Attempt.id == attempt.id, Attempt.exit_code.is_(None), Attempt.log_tail.is_(None))
            .values(exit_code=report.exit_code, log_tail=report.log_tail or None)
            .execution_options(synchronize_session=False)
        )
    state = session.scalar(select(Realization.state).where(Realization.id == attempt.realization_id))
    session.commit()
    return state or RealizationState.CANCELLED


def report_started(
    *, session: Session, task_id: str, principal: Principal, report: TaskStarted, settings: Settings
) -> RealizationState | PlanState:
    kind, ident, build = _parse(task_id)
    if kind == "preprocess":
        plan = locked_build(
            session=session, plan_id=ident, build=build or 0, worker_id=_plan_worker(session, ident, principal, task_id)
        )
        plan.lease_expires_at = lease_expiry(settings.lease_s)
        session.commit()
        return plan.state
    held = hold_attempt(session=session, task_id=task_id, principal=principal)
    now = utcnow()
    if held.attempt.state == AttemptState.CLAIMED:
        advance(Entity.ATTEMPT, AttemptState.CLAIMED, AttemptState.RUNNING)
    held.attempt.started_at = held.attempt.started_at or now
    held.attempt.host = report.host or held.worker.host
    held.attempt.scheduler_job_id = report.scheduler_job_id
    held.realization.lease_expires_at = lease_expiry(settings.lease_s, now)
    if held.realization.state == RealizationState.CLAIMED:
        held.realization.updated_at = now
        transition(
            session,
            held.realization,
            to=RealizationState.RUNNING,
            event=EventKind.REALIZATION,
            data=RealizationStarted(attempt=held.attempt.number, worker=held.worker.name, host=held.attempt.host),
            owner_id=held.campaign.owner_id,
            campaign_id=held.campaign.id,
            realization=held.realization.index,
        )
    session.commit()
    return held.realization.state


def check_result(held: HeldAttempt, result: RealizationResult) -> None:
    if result.realization != held.realization.index:
        raise ResultMismatch(
            f"result.realization is {result.realization}, but task {realize_task_id(held.attempt.id)} "
            f"is realisation {held.realization.index}"
        )
    # The map-maker hashes the spec with today's models, defaults included; a campaign submitted before an
    # upgrade that added a spec field with a default keeps its stored hash, so today's hash of its stored
    # spec is accepted too (the spec itself is the same; only the defaults it is read with grew).
    if result.spec_hash != held.campaign.spec_hash and result.spec_hash != spec_hash(
        CampaignSpec.model_validate(held.campaign.spec)
    ):
        raise ResultMismatch("result.spec_hash does not match the campaign's spec hash")
    if result.scan_key != held.campaign.scan_key:
        raise ResultMismatch("result.scan_key does not match the campaign's scan key")
    for product in result.products:
        if product.kept is None:
            continue
        if product.name not in KEPT_ROLES:
            raise ResultMismatch(f"result.products: {product.name!r} cannot be kept at the site, only {', '.join(KEPT_ROLES)}")
        if product.kept.site != held.worker.site:
            raise ResultMismatch(
                f"result.products: {product.path!r} is kept at site {product.kept.site!r}, "
                f"but the worker is of site {held.worker.site!r}"
            )
        if not product.kept.path.startswith("/"):
            raise ResultMismatch(f"result.products: the kept path of {product.path!r} is not absolute")


def accept_result(*, session: Session, held: HeldAttempt, result: RealizationResult) -> None:
    """Record the success; the caller has put the products in place and commits."""
    now = utcnow()
    advance(Entity.ATTEMPT, held.attempt.state, AttemptState.SUCCEEDED)
    held.attempt.ended_at = now
    held.attempt.exit_code = 0
    held.attempt.started_at = held.attempt.started_at or now
    realization = held.realization
    transition(
        session,
        realization,
        to=RealizationState.SUCCEEDED,
        event=EventKind.REALIZATION,
        data=RealizationSucceeded(
            attempt=held.attempt.number,
            worker=held.worker.name,
            iterations=result.iterations,
            converged=result.converged,
        ),
        owner_id=held.campaign.owner_id,
        campaign_id=held.campaign.id,
        realization=realization.index,
    )
    realization.result = result.model_dump(mode="json")
    realization.finished_at = now
    realization.updated_at = now
    realization.lease_holder_id = None
    realization.lease_expires_at = None
    if held.attempt.plan_id is not None:
        session.execute(
            update(PreprocessingPlan)
            .where(PreprocessingPlan.id == held.attempt.plan_id)
            .values(uses=PreprocessingPlan.uses + 1)
            .execution_options(synchronize_session=False)
        )
    record_coupling_use(session=session, campaign=held.campaign, site=held.worker.site, result=result)
    settle_campaign(session=session, campaign=held.campaign)


def report_failed(
    *, database: Database, session: Session, task_id: str, principal: Principal, report: TaskFailed, settings: Settings
) -> RealizationState | PlanState:
    kind, ident, build = _parse(task_id)
    if kind == "preprocess":
        plan = locked_build(
            session=session, plan_id=ident, build=build or 0, worker_id=_plan_worker(session, ident, principal, task_id)
        )
        given_back = UNCHARGED_FAILURES.get(report.failure_class, 0)
        if plan.build_number - plan.build_attempts < given_back:
            # The worker was stopped under the build, or its site could not launch it: not the plan's
            # fault, the build is given back (the gap between builds started and builds charged bounds
            # how often, budget resets included).
            plan.build_attempts = max(plan.build_attempts - 1, 0)
        cause = f"{report.failure_class}" + (f" (exit code {report.exit_code})" if report.exit_code is not None else "")
        if report.message:
            cause += f": {report.message}"
        elif report.log_tail.strip():
            cause += ": " + report.log_tail.strip().splitlines()[-1][-500:]
        report_build_failed(
            database=database, session=session, plan=plan, cause=cause, max_builds=settings.max_plan_builds
        )
        return PlanState.FAILED
    recorded = record_cancelled_exit(session=session, task_id=task_id, principal=principal, report=report)
    if recorded is not None:
        return recorded
    held = hold_attempt(session=session, task_id=task_id, principal=principal)
    end_attempt(
        session=session,
        campaign=held.campaign,
        realization=held.realization,
        attempt=held.attempt,
        failure_class=report.failure_class,
        exit_code=report.exit_code,
        log_tail=report.log_tail,
        worker_name=held.worker.name,
    )
    session.commit()
    return held.realization.state


def campaign_of_attempt(*, session: Session, attempt_id: int) -> int | None:
    return session.scalar(select(Attempt.campaign_id).where(Attempt.id == attempt_id))


def end_attempt(
    *,
    session: Session,
    campaign: Campaign,
    realization: Realization,
    attempt: Attempt,
    failure_class: str,
    exit_code: int | None,
    log_tail: str | None,
    worker_name: str | None,
    settle: bool = True,
) -> None:
    """A failed attempt: back to the queue while attempts remain, else the realisation fails.

    ``settle=False`` leaves :func:`settle_campaign` (a count over the whole
    campaign) to the caller, who ends many attempts of one campaign at once.

    A ``drained`` attempt (its worker was stopped and ended it at the drain
    deadline) and a ``site_error`` one (the worker could not launch it at its
    site: work folder unwritable, Parsl refusing) are the site's doing, not
    the realisation's: they are given back to the budget, up to
    MAX_UNCHARGED_DRAINS and MAX_UNCHARGED_SITE_ERRORS times per realisation;
    beyond that they count like any other failure, so that no realisation
    goes round for ever.
    """
    now = utcnow()
    advance(Entity.ATTEMPT, attempt.state, attempt_state(started_at=None, ended_at=now, failure_class=failure_class))
    attempt.ended_at = now
    attempt.failure_class = failure_class
    attempt.exit_code = exit_code
    attempt.log_tail = log_tail
    realization.lease_holder_id = None
    realization.lease_expires_at = None
    realization.current_attempt_id = None
    realization.updated_at = now
    charged = True
    if failure_class in UNCHARGED_FAILURES:
        session.flush()  # this attempt's failure class is counted below
        earlier = (
            session.scalar(
                select(func.count()).where(
                    Attempt.realization_id == realization.id, Attempt.failure_class == failure_class
                )
            )
            or 0
        )
        if earlier <= UNCHARGED_FAILURES[failure_class]:
            realization.attempts = max(realization.attempts - 1, 0)
            charged = False
    exhausted = realization.attempts >= campaign.max_attempts
    if exhausted:
        realization.finished_at = now
    transition(
        session,
        realization,
        to=RealizationState.FAILED if exhausted else RealizationState.QUEUED,
        event=EventKind.REALIZATION,
        data=RealizationEnded(
            attempt=attempt.number,
            failure_class=failure_class,
            exit_code=exit_code,
            worker=worker_name,
            attempts_left=max(campaign.max_attempts - realization.attempts, 0),
            charged=charged,
        ),
        owner_id=campaign.owner_id,
        campaign_id=campaign.id,
        realization=realization.index,
    )
    if failure_class not in NOT_THE_SPECS_DOING:
        hold_if_failing_alike(session=session, campaign=campaign)
    if settle:
        settle_campaign(session=session, campaign=campaign)


def _plan_worker(session: Session, plan_id: int, principal: Principal, task_id: str) -> int:
    holder = session.scalar(select(PreprocessingPlan.lease_holder_id).where(PreprocessingPlan.id == plan_id))
    if holder is None:
        plan_exists = session.scalar(select(PreprocessingPlan.id).where(PreprocessingPlan.id == plan_id))
        if plan_exists is None:
            raise TaskNotFound(f"task {task_id} not found")
        raise LeaseLost(f"task {task_id} is no longer this worker's: the build lease ended")
    return _check_token(session.get(Worker, holder), principal, task_id).id


def report_plan_built(*, session: Session, task_id: str, principal: Principal, report: PlanBuilt) -> PlanState:
    kind, plan_id, build = _parse(task_id)
    if kind != "preprocess":
        raise WrongTaskKind(f"task {task_id} is a realize task; report it with succeeded or failed")
    problem = site_path_problem(report.path)
    if problem is not None:
        raise InvalidField(("body", "path"), problem)
    worker_id = _plan_worker(session, plan_id, principal, task_id)
    folder = session.scalar(select(Worker.data_dir).where(Worker.id == worker_id))
    if folder is not None and not PurePosixPath(report.path).is_relative_to(PurePosixPath(folder)):
        raise InvalidField(("body", "path"), f"must lie inside the site's data folder {folder} (the registration's)")
    plan = locked_build(session=session, plan_id=plan_id, build=build or 0, worker_id=worker_id)
    report_built(session=session, plan=plan, report=report)
    return plan.state


def heartbeat(
    *, session: Session, worker: Worker, running: list[str], settings: Settings, now: datetime
) -> HeartbeatAnswer:
    """Extend the leases of the tasks the worker still holds (its row locked and its heartbeat recorded at
    ``now`` by :func:`service.workers.service.hold_worker`); say which to cancel and which it lost."""
    expires = lease_expiry(settings.lease_s, now)
    attempt_ids: dict[int, str] = {}
    builds: dict[int, tuple[int, str]] = {}
    lost: list[str] = []
    for task_id in dict.fromkeys(running):
        parsed = parse_task_id(task_id)
        if parsed is None:
            lost.append(task_id)
        elif parsed[0] == "realize":
            attempt_ids[parsed[1]] = task_id
        else:
            builds[parsed[1]] = (parsed[2], task_id)
    extended: list[str] = []
    cancel: list[str] = []
    if attempt_ids:
        # Every realisation this worker holds, locked by id (set-based: no list of ids to bind); the
        # ones it still runs get their lease extended.
        holding = session.execute(
            select(Realization.id, Realization.current_attempt_id)
            .where(Realization.lease_holder_id == worker.id, Realization.state.in_(LEASED_REALIZATION_STATES))
            .order_by(Realization.id)
            .with_for_update()
        ).all()
        held = {attempt_id for _, attempt_id in holding if attempt_id in attempt_ids}
        extend = [realization_id for realization_id, attempt_id in holding if attempt_id in held]
        for chunk in in_chunks(extend):  # rows locked above: the chunks' order does not matter
            session.execute(
                update(Realization)
                .where(Realization.id.in_(chunk))
                .values(lease_expires_at=expires)
                .execution_options(synchronize_session=False)
            )
        ended: dict[int, str | None] = {}
        for chunk in in_chunks(a for a in attempt_ids if a not in held):
            ended.update(session.execute(select(Attempt.id, Attempt.failure_class).where(Attempt.id.in_(chunk))).all())
        for attempt_id, task_id in attempt_ids.items():
            if attempt_id in held:
                extended.append(task_id)
            elif attempt_id not in ended or ended[attempt_id] == "cancelled":
                cancel.append(task_id)  # campaign cancelled, failed or deleted
            else:
                lost.append(task_id)
    if builds:
        plans = {
            plan.id: plan
            for chunk in in_chunks(builds)  # ascending ids chunk after chunk: locked in id order
            for plan in session.scalars(
                select(PreprocessingPlan)
                .where(PreprocessingPlan.id.in_(chunk))
                .order_by(PreprocessingPlan.id)
                .with_for_update()
            )
        }
        for plan_id, (build, task_id) in builds.items():
            plan = plans.get(plan_id)
            if (
                plan is not None
                and plan.state == PlanState.BUILDING
                and plan.build_number == build
                and plan.lease_holder_id == worker.id
            ):
                plan.lease_expires_at = expires
                extended.append(task_id)
            else:
                lost.append(task_id)
    session.commit()
    return HeartbeatAnswer(
        lease_expires_at=expires, lease_s=settings.lease_s, extended=extended, cancel=cancel, lost=lost
    )


def report_succeeded(
    *,
    session: Session,
    task_id: str,
    principal: Principal,
    result: RealizationResult,
    store: ArtifactStore,
    settings: Settings,
) -> AcceptedResult:
    """Check the result and its uploaded products, move the products into place, record the success."""
    held = hold_attempt(session=session, task_id=task_id, principal=principal, for_result=True)
    check_result(held, result)
    campaign_id, attempt_id, index = held.campaign.id, held.attempt.id, held.realization.index
    store.check_products(campaign_id=campaign_id, attempt_id=attempt_id, products=result.products)
    undo = store.publish(campaign_id=campaign_id, attempt_id=attempt_id, index=index, products=result.products)
    try:
        accept_result(session=session, held=held, result=result)
        session.commit()
    except BaseException:
        session.rollback()
        undo()
        raise
    return AcceptedResult(
        campaign_id=campaign_id,
        realization=index,
        result=held.realization.result or {},
        product_dir=store.layout.realization_dir(campaign_id, index),
        settings=settings,
    )
