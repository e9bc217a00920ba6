"""The dependencies routers use, declared once."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from schemas.spec import MAX_REALIZATIONS
from service.auth.deps import CurrentUser, CurrentWorker
from service.config import Settings
from service.db import Database, ReadSessionDep, SessionDep, get_database


async def get_app_settings(request: Request) -> Settings:
    # async: no database, so no hop to the thread pool (a sync dependency costs one on every request)
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
DatabaseDep = Annotated[Database, Depends(get_database)]

# Ids in paths and queries, bounded by what the database stores (PostgreSQL's bigint, SQLite's INTEGER):
# a number past it is a 422 naming the parameter, not a driver error deep in a query.
MAX_ROW_ID = 2**63 - 1
RowId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="Id (1 to 2^63 - 1)")]
RowIdQuery = Annotated[int | None, Query(ge=1, le=MAX_ROW_ID, description="Id (1 to 2^63 - 1)")]
EventPosition = Annotated[int, Query(ge=0, le=MAX_ROW_ID, description="Start after this event id (0: from the start)")]
EventPositionQuery = Annotated[
    int | None, Query(ge=0, le=MAX_ROW_ID, description="Start after this event id (0: from the start)")
]
RealizationIndex = Annotated[
    int, Path(ge=0, lt=MAX_REALIZATIONS, description=f"Realisation index (0 to {MAX_REALIZATIONS - 1})")
]

__all__ = [
    "CurrentUser",
    "CurrentWorker",
    "DatabaseDep",
    "EventPosition",
    "EventPositionQuery",
    "ReadSessionDep",
    "RealizationIndex",
    "RowId",
    "RowIdQuery",
    "SessionDep",
    "SettingsDep",
]
