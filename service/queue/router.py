"""HTTP for preprocessing plans (read-only; user tokens). Plans are shared, so every user sees them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from schemas.api import ErrorBody, PlanInfo, PlanPage, PlanState
from service.deps import CurrentUser, ReadSessionDep
from service.pagination import decode_cursor, encode_cursor
from service.queue import plans

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
def get_plan(plan_id: int, _user: CurrentUser, session: ReadSessionDep) -> PlanInfo:
    return plans.get_plan(session=session, plan_id=plan_id)
