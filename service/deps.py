"""The dependencies routers use, declared once: bounded ids here; callers, sessions and settings gathered from
service.auth.deps and service.db, which never import this module (imports run one way).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query

from schemas.spec import MAX_REALIZATIONS
from service.auth.deps import CurrentUser, CurrentWorker, ReadingUser
from service.db import Database, ReadSessionDep, SessionDep, SettingsDep, get_database

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
    "ReadingUser",
    "RealizationIndex",
    "RowId",
    "RowIdQuery",
    "SessionDep",
    "SettingsDep",
]
