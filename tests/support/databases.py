"""Test databases: a fresh, uniquely named PostgreSQL database per test session, and SQLite files.

PostgreSQL runs at 127.0.0.1:5432 with trust auth (user postgres). A test that
needs it and cannot reach it fails; it never skips.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event

from benchmarks import _support

TABLES = (
    "events",
    "attempts",
    "realizations",
    "campaigns",
    "preprocessing_plans",
    "couplings",
    "instrument_uploads",
    "workers",
    "api_tokens",
    "users",
)


def on_database(kind: str) -> pytest.MarkDecorator:
    """Run a test (or, in ``pytestmark``, a module) on one database only: ``"sqlite"`` or ``"postgresql"``."""
    return pytest.mark.parametrize("database_kind", [kind], indirect=True)


def create_pg_database(prefix: str = "mapcampaign_test") -> str:
    """:func:`benchmarks._support.create_pg_database`; an unreachable PostgreSQL fails the test."""
    try:
        return _support.create_pg_database(prefix)
    except _support.DatabaseUnreachable as error:
        pytest.fail(f"{error} (tests never skip it)", pytrace=False)


def drop_pg_database(url: str) -> None:
    _support.drop_pg_database(url)


def empty_pg_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")


def migrated_sqlite_template(folder: Path) -> Path:
    """A migrated SQLite file to copy for each test (faster than migrating every time)."""
    from service.migrate import upgrade

    path = folder / "template.sqlite3"
    if not path.exists():
        upgrade(f"sqlite:///{path}")
    return path


def fresh_sqlite_copy(template: Path, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "mapcampaign.sqlite3"
    shutil.copyfile(template, target)
    return f"sqlite:///{target}"


@contextmanager
def statements_sent(engine: Engine) -> Iterator[list[str]]:
    """The SQL text of every statement ``engine`` sends inside the block, in order (SQLite's own ``BEGIN``
    included): what a test counts round trips with."""
    sent: list[str] = []

    def record(_connection: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)
