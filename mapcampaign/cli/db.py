"""``mapcampaign db``: schema migrations."""

from __future__ import annotations

import typer

from mapcampaign.cli._utilities import fail, load_settings

app = typer.Typer(help="Database schema: upgrade, check.", no_args_is_help=True)


@app.command("upgrade")
def upgrade() -> None:
    """Migrate the database (MAPCAMPAIGN_DATABASE_URL, default the embedded SQLite file) to the latest schema."""
    settings = load_settings()
    from service.db import Database
    from service.migrate import check_schema
    from service.migrate import upgrade as run_upgrade
    from service.startup import prepare_data_dir

    prepare_data_dir(settings)
    database = Database(settings.effective_database_url, settings, pool=False)
    where = database.engine.url.render_as_string(hide_password=True)
    try:
        run_upgrade(database.url)
        revision = check_schema(database.engine)
    except Exception as error:  # noqa: BLE001 -- any failure is one line on stderr and exit 1
        fail(f"cannot migrate {where}: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
    finally:
        database.dispose()
    typer.echo(f"database {where} is at revision {revision} (latest)", err=True)


@app.command("check")
def check() -> None:
    """Exit 0 when the database is at the latest revision, 1 (with the fix) when not."""
    settings = load_settings()
    from service.db import Database
    from service.migrate import SchemaNotCurrent, check_schema

    database = Database(settings.effective_database_url, settings, pool=False)
    try:
        revision = check_schema(database.engine)
    except SchemaNotCurrent as error:
        fail(error.detail)
    finally:
        database.dispose()
    typer.echo(f"database is at revision {revision} (latest)", err=True)
