"""SQLite: ids are never reused (AUTOINCREMENT), as on PostgreSQL.

Without AUTOINCREMENT SQLite hands out max(id) + 1, so deleting the newest
campaign gave its id -- and its attempts' ids, which are the task ids
``realize-<attempt id>`` -- to the next one: a stale report from a worker
about a task of the deleted campaign then ended another campaign's live
attempt. PostgreSQL's sequences never go back; this makes SQLite's ids do the
same. Every table is copied into one declared ``AUTOINCREMENT`` (Alembic's
batch mode; env.py runs SQLite migrations with foreign keys off, and checks
them afterwards). Nothing changes on PostgreSQL.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("users", "api_tokens", "workers", "campaigns", "realizations", "preprocessing_plans", "attempts", "events")


def _recreate(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass


def upgrade() -> None:
    _recreate(True)


def downgrade() -> None:
    _recreate(False)
