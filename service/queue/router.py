"""HTTP for the queue: workers claim tasks, keep their leases alive and report on what they hold; users read
the preprocessing plans their campaigns need (an admin, ``MAPCAMPAIGN_ADMIN_USERS``, reads all of them) and the
mode couplings their campaigns used, and workers report a ready plan unusable."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request, status
from sqlalchemy.orm import Session

from schemas.api import (
    ARTIFACT_SHA256_HEADER,
    ArtifactReceipt,
    ClaimAnswer,
    ClaimRequest,
    CouplingPage,
    ErrorBody,
    HeartbeatAnswer,
    HeartbeatRequest,
    PlanBuilt,
    PlanInfo,
    PlanInvalid,
    PlanPage,
    TaskAnswer,
    TaskFailed,
    TaskStarted,
    TaskSucceeded,
    parse_task_id,
)
from schemas.states import PlanState, RealizationState
from service.auth.deps import BearerCredentials, get_principal, require_worker
from service.auth.service import Principal
from service.campaigns.hooks import run_result_hooks
from service.config import Settings
from service.db import get_database, utcnow
from service.deps import CurrentUser, CurrentWorker, DatabaseDep, ReadSessionDep, RowId, SessionDep, SettingsDep
from service.errors import DomainError, InsufficientStorage
from service.limits import stream_body
from service.pagination import decode_cursor, encode_cursor
from service.queue import couplings, plans, tasks
from service.queue.claim import claim_tasks
from service.storage import ArtifactStore
from service.workers import service as workers
from service.workers.models import Worker

_worker_errors: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    404: {"model": ErrorBody},
    409: {"model": ErrorBody},
}
router = APIRouter(prefix="/plans", tags=["plans"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})
couplings_router = APIRouter(
    prefix="/couplings", tags=["plans"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}}
)
claims_router = APIRouter(prefix="/workers", tags=["workers"], responses=_worker_errors)
tasks_router = APIRouter(prefix="/tasks", tags=["workers"], responses=_worker_errors)


def plans_visible_to(user: Principal, settings: Settings) -> int | None:
    """The user id whose plans a user may read, or None for an admin, who reads every plan.

    Plans are shared by every campaign with the same pointing, but a plan's row names the site and the path
    where it was built: a user sees the plans their own campaigns need, as on the dashboard's plans page.
    """
    return None if user.user_name in settings.admin_user_names else user.user_id


@router.get("", response_model=PlanPage)
def list_plans(
    user: CurrentUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    state: PlanState | None = None,
    scan_key: Annotated[str | None, Query(max_length=64)] = None,
    site: Annotated[str | None, Query(max_length=128)] = None,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> PlanPage:
    position = decode_cursor(cursor, keys=("after_id",))
    """The overlap plans the caller's campaigns need, by id (an admin: every plan)."""
    items = plans.list_plans(
        session=session,
        visible_to=plans_visible_to(user, settings),
        state=state,
        scan_key=scan_key,
        site=site,
        after_id=position["after_id"] if position else None,
        limit=limit + 1,
    )
    next_cursor = encode_cursor({"after_id": items[limit - 1].id}) if len(items) > limit else None
    return PlanPage(items=items[:limit], next_cursor=next_cursor)


@couplings_router.get("", response_model=CouplingPage)
def list_couplings(
    user: CurrentUser,
    session: ReadSessionDep,
    scan_key: Annotated[str | None, Query(max_length=64)] = None,
    site: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 200,
) -> CouplingPage:
    """The bandpowers' mode-coupling files the caller's campaigns used, newest first.

    One per (site, coupling key), recorded as realisation results are accepted: the file's SHA-256 and
    size, the build time, how many accepted results of every user used it, and the caller's campaigns
    among them.
    """
    return CouplingPage(
        items=couplings.list_couplings(
            session=session, owner_id=user.user_id, site=site, scan_key=scan_key, limit=limit
        )
    )


@router.get("/{plan_id}", response_model=PlanInfo, responses={404: {"model": ErrorBody}})
def get_plan(plan_id: RowId, user: CurrentUser, session: ReadSessionDep, settings: SettingsDep) -> PlanInfo:
    """One plan a campaign of the caller's needs (an admin: any plan); 404 for another user's."""
    return plans.get_plan(session=session, plan_id=plan_id, visible_to=plans_visible_to(user, settings))


@router.post(
    "/{plan_id}/invalid",
    response_model=PlanInfo,
    tags=["workers"],
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
def invalidate_plan(plan_id: RowId, report: PlanInvalid, principal: CurrentWorker, session: SessionDep) -> PlanInfo:
    """A ready plan was refused (``realize`` exit 3) or its file is gone: it goes to ``failed`` and is built again.

    The caller must hold ``task_id``, a realize task that was given this plan. Idempotent: a plan
    that is no longer ready with ``checksum`` is left alone.
    """
    worker = tasks.check_plan_user(session=session, task_id=report.task_id, principal=principal, plan_id=plan_id)
    cause = f"invalidated by worker {worker.name!r} ({report.task_id}): {report.reason or 'plan refused'}"
    plans.invalidate_plan(session=session, plan_id=plan_id, checksum=report.checksum, cause=cause)
    return plans.get_plan(session=session, plan_id=plan_id, visible_to=None)  # workers build every user's plans


@dataclass(frozen=True)
class HeldWorker:
    """The caller's worker row, locked with its heartbeat set at ``now``; or, when the one-statement check
    found nothing, the checked caller (``worker`` None), for :func:`_the_worker` to say why."""

    worker_id: int
    now: datetime
    worker: Worker | None
    principal: Principal | None


def hold_calling_worker(
    worker_id: RowId, request: Request, credentials: BearerCredentials, session: SessionDep
) -> HeldWorker:
    """Claims and heartbeats, the calls every worker makes most: the token checked, the worker's row locked
    and its heartbeat recorded in one statement of the request's session. Any refusal comes from the
    ordinary checks, in their order: the token's (here, before the body is read), then the worker's."""
    now = utcnow()
    if credentials is not None and credentials.scheme.lower() == "bearer" and credentials.credentials:
        worker = workers.hold_worker_by_token(
            session=session, token=credentials.credentials, worker_id=worker_id, now=now
        )
        if worker is not None:
            return HeldWorker(worker_id=worker_id, now=now, worker=worker, principal=None)
    principal = require_worker(get_principal(request, credentials))
    return HeldWorker(worker_id=worker_id, now=now, worker=None, principal=principal)


CallingWorker = Annotated[HeldWorker, Depends(hold_calling_worker)]


def _the_worker(held: HeldWorker, session: Session) -> Worker:
    if held.worker is not None:
        return held.worker
    assert held.principal is not None
    return workers.hold_worker(session=session, principal=held.principal, worker_id=held.worker_id, now=held.now)


@claims_router.post("/{worker_id}/claim", response_model=ClaimAnswer)
def claim(request_body: ClaimRequest, held: CallingWorker, session: SessionDep, settings: SettingsDep) -> ClaimAnswer:
    worker = _the_worker(held, session)
    found = claim_tasks(
        session=session, worker=worker, max_tasks=request_body.max_tasks, settings=settings, now=held.now
    )
    return ClaimAnswer(tasks=found, lease_s=settings.lease_s)


@claims_router.post("/{worker_id}/heartbeat", response_model=HeartbeatAnswer)
def heartbeat(
    request_body: HeartbeatRequest, held: CallingWorker, session: SessionDep, settings: SettingsDep
) -> HeartbeatAnswer:
    worker = _the_worker(held, session)
    return tasks.heartbeat(
        session=session, worker=worker, running=request_body.running, settings=settings, now=held.now
    )


@tasks_router.post("/{task_id}/started", response_model=TaskAnswer)
def started(
    task_id: str,
    principal: CurrentWorker,
    session: SessionDep,
    settings: SettingsDep,
    report: TaskStarted | None = None,
) -> TaskAnswer:
    state = tasks.report_started(
        session=session, task_id=task_id, principal=principal, report=report or TaskStarted(), settings=settings
    )
    return TaskAnswer(task_id=task_id, state=state)


@tasks_router.post(
    "/{task_id}/succeeded",
    response_model=TaskAnswer,
    responses={422: {"description": "Result does not match the task, or products were not uploaded"}},
)
def succeeded(
    task_id: str, report: TaskSucceeded, principal: CurrentWorker, session: SessionDep, settings: SettingsDep
) -> TaskAnswer:
    accepted = tasks.report_succeeded(
        session=session,
        task_id=task_id,
        principal=principal,
        result=report.result,
        store=ArtifactStore(settings.products_dir),
        settings=settings,
    )
    run_result_hooks(accepted)
    return TaskAnswer(task_id=task_id, state=RealizationState.SUCCEEDED)


@tasks_router.post("/{task_id}/plan-built", response_model=TaskAnswer)
def plan_built(task_id: str, report: PlanBuilt, principal: CurrentWorker, session: SessionDep) -> TaskAnswer:
    state = tasks.report_plan_built(session=session, task_id=task_id, principal=principal, report=report)
    return TaskAnswer(task_id=task_id, state=state)


@tasks_router.post("/{task_id}/failed", response_model=TaskAnswer)
def failed(
    task_id: str,
    report: TaskFailed,
    principal: CurrentWorker,
    session: SessionDep,
    settings: SettingsDep,
    database: DatabaseDep,
) -> TaskAnswer:
    state = tasks.report_failed(
        database=database, session=session, task_id=task_id, principal=principal, report=report, settings=settings
    )
    kind, attempt_id, _ = parse_task_id(task_id) or ("", 0, None)
    if kind == "realize":
        campaign_id = tasks.campaign_of_attempt(session=session, attempt_id=attempt_id)
        if campaign_id is not None:
            ArtifactStore(settings.products_dir).discard(campaign_id=campaign_id, attempt_id=attempt_id)
    return TaskAnswer(task_id=task_id, state=state)


@tasks_router.put(
    "/{task_id}/artifacts/{name}",
    response_model=ArtifactReceipt,
    status_code=status.HTTP_201_CREATED,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
    responses={413: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
async def upload_artifact(
    task_id: str,
    name: str,
    request: Request,
    principal: CurrentWorker,
    settings: SettingsDep,
    sha256: Annotated[str | None, Header(alias=ARTIFACT_SHA256_HEADER)] = None,
) -> ArtifactReceipt:
    """Upload one product file of a realize task (raw bytes); the success report then names it in ``products``."""
    store = ArtifactStore(settings.products_dir)
    store.check_name(name)
    digest = store.check_sha256(sha256)

    def current_attempt() -> tuple[int, int]:
        with get_database(request).session() as session:
            held = tasks.hold_attempt(session=session, task_id=task_id, principal=principal, for_result=True)
            ids = held.campaign.id, held.attempt.id
            session.rollback()
            return ids

    campaign_id, attempt_id = await anyio.to_thread.run_sync(current_attempt)

    async def still_current() -> None:
        """The upload can take minutes: the attempt may have ended meanwhile (its staging cleared, or
        cleared before this upload made it again); then nothing it staged may stay."""
        try:
            await anyio.to_thread.run_sync(current_attempt)
        except DomainError:
            store.discard(campaign_id=campaign_id, attempt_id=attempt_id)
            raise

    try:
        size = await store.receive(
            stream_body(request, max_bytes=settings.max_artifact_bytes, idle_timeout_s=settings.upload_idle_timeout_s),
            campaign_id=campaign_id,
            attempt_id=attempt_id,
            name=name,
            sha256=digest,
            max_bytes=settings.max_artifact_bytes,
        )
    except InsufficientStorage:
        # An attempt that ended during the upload has had its staging folder removed under it, which
        # fails the write: the cause to report is the ended attempt (409/404), not a full disk.
        await still_current()
        raise
    await still_current()
    return ArtifactReceipt(task_id=task_id, name=name, sha256=digest, size_bytes=size)
