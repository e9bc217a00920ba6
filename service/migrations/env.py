"""Alembic environment: the URL comes from the caller (service.migrate) or the settings."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import event

from service.config import Settings
from service.db import make_engine
from service.models import metadata

config = context.config
url = config.attributes.get("database_url") or Settings().effective_database_url


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=metadata, literal_binds=True, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(url, pool=False)
    sqlite = engine.dialect.name == "sqlite"
    if sqlite:
        # Batch mode copies a table and drops the old one; with foreign keys on, dropping a table that
        # others reference deletes their rows or fails. The pragma only works outside a transaction:
        # set it as the connection opens, and check every reference once the migrations are done.
        @event.listens_for(engine, "connect")
        def _foreign_keys_off(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.execute("PRAGMA foreign_keys=OFF")

    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=sqlite,  # SQLite alters tables by copying them
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
            if sqlite:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(f"migration left {len(broken)} broken foreign keys, first: {broken[0]}")
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
