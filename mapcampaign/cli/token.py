"""``mapcampaign token``: API tokens, made directly in the database (an admin command on the service host)."""

from __future__ import annotations

from typing import Annotated

import typer

from mapcampaign.cli._utilities import fail, load_settings

app = typer.Typer(help="API tokens.", no_args_is_help=True)

USER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$"


@app.command("create")
def create(
    user: Annotated[str, typer.Option("--user", help="User name; created when new")],
    worker: Annotated[bool, typer.Option("--worker", help="A worker token (worker endpoints only)")] = False,
    label: Annotated[str, typer.Option(help="What the token is for")] = "",
) -> None:
    """Create a token and print it on stdout. It is stored hashed: this is the only time it is shown."""
    import re

    if not re.match(USER_NAME, user):
        fail(f"--user {user!r}: use 1-128 letters, digits and _.@+- starting with a letter or digit", code=2)
    settings = load_settings()
    from service.auth.service import create_token
    from service.db import Database
    from service.migrate import SchemaNotCurrent, check_schema

    database = Database(settings.effective_database_url, settings, pool=False)
    try:
        check_schema(database.engine)
        with database.session() as session:
            token = create_token(session=session, user_name=user, kind="worker" if worker else "user", label=label)
            session.commit()
    except SchemaNotCurrent as error:
        fail(error.detail)
    finally:
        database.dispose()
    typer.echo(token)
    typer.echo(f"{'worker' if worker else 'user'} token for {user!r} created; it is not shown again", err=True)
