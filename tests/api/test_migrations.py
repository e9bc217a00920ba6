"""Migrations build the schema from nothing; the service refuses a database that is not at the latest revision."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from service.app import create_app
from service.config import Settings
from service.db import make_engine
from service.migrate import SchemaNotCurrent, check_schema, head_revisions, upgrade
from service.models import metadata
from tests.support.databases import create_pg_database, drop_pg_database
from tests.support.live_service import free_port, mapcampaign_command, service_env


@pytest.fixture
def empty_database(database_kind: str, tmp_path: Path) -> Iterator[str]:
    """A database with no tables at all."""
    if database_kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    url = create_pg_database("mapcampaign_empty")
    try:
        yield url
    finally:
        drop_pg_database(url)


def test_migrations_build_the_schema_from_scratch(empty_database):
    upgrade(empty_database)
    engine = make_engine(empty_database)
    try:
        assert check_schema(engine) == ",".join(sorted(head_revisions()))
        assert set(inspect(engine).get_table_names()) >= {
            "users",
            "api_tokens",
            "campaigns",
            "realizations",
            "attempts",
            "preprocessing_plans",
            "workers",
            "events",
        }
        with engine.connect() as connection:
            differences = compare_metadata(
                MigrationContext.configure(connection, opts={"compare_type": True}), metadata
            )
        assert differences == [], "the models and the migrations disagree: add a migration"
        upgrade(empty_database)  # a second upgrade is a no-op
    finally:
        engine.dispose()


def test_service_refuses_an_unmigrated_database(empty_database, tmp_path):
    settings = Settings(data_dir=tmp_path / "data", database_url=empty_database, auto_migrate=False)
    with pytest.raises(SchemaNotCurrent, match="mapcampaign db upgrade"), TestClient(create_app(settings)):
        pass
    env = service_env(tmp_path / "data", free_port(), empty_database, None)
    refused = subprocess.run(
        mapcampaign_command("serve"), env=env, capture_output=True, check=False, text=True, timeout=60
    )
    assert refused.returncode == 1
    assert "never migrated" in refused.stderr and "Run: mapcampaign db upgrade" in refused.stderr
    token = subprocess.run(
        mapcampaign_command("token", "create", "--user", "x"),
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    assert token.returncode == 1 and "mapcampaign db upgrade" in token.stderr
    assert (
        subprocess.run(
            mapcampaign_command("db", "check"), env=env, capture_output=True, check=False, timeout=60
        ).returncode
        == 1
    )
    migrated = subprocess.run(
        mapcampaign_command("db", "upgrade"), env=env, capture_output=True, check=False, text=True, timeout=120
    )
    assert migrated.returncode == 0, migrated.stderr
    assert (
        subprocess.run(
            mapcampaign_command("db", "check"), env=env, capture_output=True, check=False, timeout=60
        ).returncode
        == 0
    )


def test_service_refuses_a_database_from_a_newer_version(empty_database, tmp_path):
    upgrade(empty_database)
    engine = make_engine(empty_database)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'f00dcafe'"))
    try:
        with pytest.raises(SchemaNotCurrent, match="newer than this version"):
            check_schema(engine)
    finally:
        engine.dispose()


def test_bad_settings_fail_fast(tmp_path):
    env = service_env(tmp_path, free_port(), None, {"MAPCAMPAIGN_LEASE_S": "-5", "MAPCAMPAIGN_PORT": "99999"})
    refused = subprocess.run(
        mapcampaign_command("serve"), env=env, capture_output=True, check=False, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "MAPCAMPAIGN_LEASE_S" in refused.stderr and "MAPCAMPAIGN_PORT" in refused.stderr
    with pytest.raises(ValueError, match="database_url"):
        Settings(data_dir=tmp_path, database_url="mysql://x")


def test_the_sqlite_id_migration_keeps_rows_and_references(tmp_path):
    """0001 -> head on a SQLite database holding rows: every table is copied (AUTOINCREMENT), nothing lost."""
    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    upgrade(url, "0001")
    engine = make_engine(url)
    now = "2026-11-21 12:00:00"
    with engine.begin() as connection:
        connection.execute(text(f"INSERT INTO users (id, name, created_at) VALUES (7, 'alice', '{now}')"))
        connection.execute(
            text(
                "INSERT INTO api_tokens (id, user_id, kind, token_hash, prefix, label, created_at) "
                f"VALUES (3, 7, 'user', 'h', 'p', 'l', '{now}')"
            )
        )
    engine.dispose()
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            assert connection.execute(text("SELECT id, name FROM users")).fetchall() == [(7, "alice")]
            assert connection.execute(text("SELECT id, user_id FROM api_tokens")).fetchall() == [(3, 7)]
            tables = dict(
                connection.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'table'")).fetchall()
            )
            for table in ("users", "api_tokens", "campaigns", "realizations", "attempts", "events", "workers"):
                assert "AUTOINCREMENT" in tables[table], table
            assert connection.execute(text("PRAGMA foreign_key_check")).fetchall() == []
            assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1  # the service's own connections
            connection.execute(text("DELETE FROM users WHERE id = 7"))  # cascades to the token
            assert connection.execute(text("SELECT count(*) FROM api_tokens")).scalar() == 0
            connection.execute(text(f"INSERT INTO users (name, created_at) VALUES ('bob', '{now}')"))
            assert connection.execute(text("SELECT id FROM users")).scalar() == 8  # not 7 again
    finally:
        engine.dispose()
