"""HTTP for workers: register, and the list of workers users see (the queue's routes are in service.queue.router)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, status

from schemas.api import ErrorBody, WorkerInfo, WorkerRegistration
from service.deps import CurrentUser, CurrentWorker, ReadSessionDep, SessionDep
from service.workers import service

_errors: dict[int | str, dict[str, Any]] = {401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}}
workers_router = APIRouter(prefix="/workers", tags=["workers"], responses=_errors)


@workers_router.post("", response_model=WorkerInfo, status_code=status.HTTP_200_OK)
def register(registration: WorkerRegistration, principal: CurrentWorker, session: SessionDep) -> WorkerInfo:
    return service.worker_info(service.register_worker(session=session, principal=principal, registration=registration))


@workers_router.get("", response_model=list[WorkerInfo])
def list_workers(_user: CurrentUser, session: ReadSessionDep) -> list[WorkerInfo]:
    return service.list_workers(session=session)
