"""HTTP for preprocessing plans: reads for users (plans are shared, so every user sees them), and the
worker's report that a ready plan is unusable."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from schemas.api import ErrorBody, PlanInfo, PlanInvalid, PlanPage, PlanState
from service.deps import CurrentUser, CurrentWorker, ReadSessionDep, RowId, SessionDep
from service.pagination import decode_cursor, encode_cursor
from service.queue import plans, tasks

router = APIRouter(prefix="/plans", tags=["plans"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})


@router.get("", response_model=PlanPage)
def list_plans(
    _user: CurrentUser,
    session: ReadSessionDep,
    state: PlanState | None = None,
    scan_key: Annotated[str | None, Query(max_length=64)] = None,
    site: Annotated[str | None, Query(max_length=128)] = None,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> PlanPage:
    position = decode_cursor(cursor, keys=("after_id",))
    items = plans.list_plans(
        session=session,
        state=state,
        scan_key=scan_key,
        site=site,
        after_id=position["after_id"] if position else None,
        limit=limit + 1,
    )
    next_cursor = encode_cursor({"after_id": items[limit - 1].id}) if len(items) > limit else None
    return PlanPage(items=items[:limit], next_cursor=next_cursor)


@router.get("/{plan_id}", response_model=PlanInfo, responses={404: {"model": ErrorBody}})
def get_plan(plan_id: RowId, _user: CurrentUser, session: ReadSessionDep) -> PlanInfo:
    return plans.get_plan(session=session, plan_id=plan_id)


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
    return plans.get_plan(session=session, plan_id=plan_id)
