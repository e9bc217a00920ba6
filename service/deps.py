"""The dependencies routers use, declared once."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.auth.deps import CurrentUser, CurrentWorker
from service.config import Settings
from service.db import Database, ReadSessionDep, SessionDep, get_database


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
DatabaseDep = Annotated[Database, Depends(get_database)]

__all__ = ["CurrentUser", "CurrentWorker", "DatabaseDep", "ReadSessionDep", "SessionDep", "SettingsDep"]
