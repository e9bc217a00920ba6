"""Alembic, driven from code: the scripts ship inside the package, so this works from an install."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from service.errors import DomainError

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
UPGRADE_COMMAND = "mapcampaign db upgrade"


class SchemaNotCurrent(DomainError):
    status_code = 503
    code = "schema_not_current"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Date-and-slug file names: 2026_11_21_1740-<rev>_<slug>.py
    config.set_main_option(
        "file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(hour).2d%%(minute).2d-%%(rev)s_%%(slug)s"
    )
    config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def head_revisions() -> set[str]:
    return set(ScriptDirectory(str(MIGRATIONS_DIR)).get_heads())


def current_revisions(bind: Engine | Connection) -> set[str]:
    """The database's schema revisions (empty: never migrated), on ``bind``'s connection or a new one."""
    if isinstance(bind, Connection):
        return set(MigrationContext.configure(bind).get_current_heads())
    with bind.connect() as connection:
        return current_revisions(connection)


def check_schema(engine: Engine) -> str:
    """Return the current revision, or raise :class:`SchemaNotCurrent` saying how to fix the database."""
    current = current_revisions(engine)
    heads = head_revisions()
    if current == heads:
        return ",".join(sorted(current))
    where = engine.url.render_as_string(hide_password=True)
    if not current:
        problem = f"the database {where} has no MapCampaign tables (it was never migrated)"
    elif current - heads and not _known(current):
        problem = f"the database {where} is at revision {', '.join(sorted(current))}, newer than this version knows"
        raise SchemaNotCurrent(f"{problem}; upgrade MapCampaign instead of the database")
    else:
        at, latest = ", ".join(sorted(current)), ", ".join(sorted(heads))
        problem = f"the database {where} is at revision {at}, not the latest {latest}"
    raise SchemaNotCurrent(f"{problem}. Run: {UPGRADE_COMMAND}  (with the same MAPCAMPAIGN_DATABASE_URL)")


def _known(revisions: set[str]) -> bool:
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    try:
        return all(script.get_revision(revision) is not None for revision in revisions)
    except Exception:  # noqa: BLE001 -- a revision alembic cannot resolve, however it says so, is unknown
        return False
