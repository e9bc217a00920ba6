"""Test databases: a fresh, uniquely named PostgreSQL database per test session, and SQLite files.

PostgreSQL runs at 127.0.0.1:5432 with trust auth (user postgres). A test that
needs it and cannot reach it fails; it never skips.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

PG_ADMIN_URL = os.environ.get("MAPCAMPAIGN_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_BASE_URL = PG_ADMIN_URL.rsplit("/", 1)[0]
TABLES = ("events", "attempts", "realizations", "campaigns", "preprocessing_plans", "workers", "api_tokens", "users")


def _admin_connection():
    import psycopg

    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        pytest.fail(
            f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {error}. Start it with "
            "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` (tests never skip it)",
            pytrace=False,
        )


def create_pg_database(prefix: str = "mapcampaign_test") -> str:
    """Create an empty database with a unique name; return its URL."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with _admin_connection() as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_BASE_URL}/{name}"


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with _admin_connection() as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def empty_pg_tables(url: str) -> None:
    import psycopg

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
