"""Alembic environment: the URL comes from the caller (service.migrate) or the settings."""

from __future__ import annotations

from alembic import context

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
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
