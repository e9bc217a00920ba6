"""HTTP for workers: register, claim, heartbeat, and reports on the tasks they hold (worker tokens only)."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Request, status

from schemas.api import (
    ARTIFACT_SHA256_HEADER,
    ArtifactReceipt,
    ClaimAnswer,
    ClaimRequest,
    ErrorBody,
    HeartbeatAnswer,
    HeartbeatRequest,
    PlanBuilt,
    TaskAnswer,
    TaskFailed,
    TaskStarted,
    TaskSucceeded,
    WorkerInfo,
    WorkerRegistration,
    parse_task_id,
)
from service.campaigns.hooks import run_result_hooks
from service.db import get_database
from service.deps import CurrentUser, CurrentWorker, DatabaseDep, ReadSessionDep, RowId, SessionDep, SettingsDep
from service.errors import DomainError, InsufficientStorage
from service.queue import tasks
from service.queue.claim import claim_tasks
from service.storage import ArtifactStore
from service.workers import service

_errors = {401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}}
workers_router = APIRouter(prefix="/workers", tags=["workers"], responses=_errors)
tasks_router = APIRouter(prefix="/tasks", tags=["workers"], responses=_errors)


@workers_router.post("", response_model=WorkerInfo, status_code=status.HTTP_200_OK)
def register(registration: WorkerRegistration, principal: CurrentWorker, session: SessionDep) -> WorkerInfo:
    return service.worker_info(service.register_worker(session=session, principal=principal, registration=registration))


@workers_router.get("", response_model=list[WorkerInfo])
def list_workers(_user: CurrentUser, session: ReadSessionDep) -> list[WorkerInfo]:
    return service.list_workers(session=session)


@workers_router.post("/{worker_id}/claim", response_model=ClaimAnswer)
def claim(
    worker_id: RowId, request_body: ClaimRequest, principal: CurrentWorker, session: SessionDep, settings: SettingsDep
) -> ClaimAnswer:
    worker = service.worker_for(session=session, principal=principal, worker_id=worker_id, lock=True)
    found = claim_tasks(session=session, worker=worker, max_tasks=request_body.max_tasks, settings=settings)
    return ClaimAnswer(tasks=found, lease_s=settings.lease_s)


@workers_router.post("/{worker_id}/heartbeat", response_model=HeartbeatAnswer)
def heartbeat(
    worker_id: RowId, request_body: HeartbeatRequest, principal: CurrentWorker, session: SessionDep, settings: SettingsDep
) -> HeartbeatAnswer:
    worker = service.worker_for(session=session, principal=principal, worker_id=worker_id, lock=True)
    return tasks.heartbeat(session=session, worker=worker, running=request_body.running, settings=settings)


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
    return TaskAnswer(task_id=task_id, state="succeeded")


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
            request.stream(),
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
