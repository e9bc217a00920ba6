"""``mapcampaign serve``: run the API with uvicorn on the configured host and port."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from mapcampaign.cli._utilities import fail, load_settings


def serve(
    host: Annotated[str | None, typer.Option(help="Listen address [env MAPCAMPAIGN_HOST, default 127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="Port [env MAPCAMPAIGN_PORT, default 8765]")] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="API processes (each runs a reaper; safe)")] = 1,
) -> None:
    """Serve the REST API. The embedded SQLite database is migrated on start; any other must be migrated first."""
    settings = load_settings(host=host, port=port)
    # The app factory reads settings from the environment, in this process and in every uvicorn worker.
    if host is not None:
        os.environ["MAPCAMPAIGN_HOST"] = host
    if port is not None:
        os.environ["MAPCAMPAIGN_PORT"] = str(port)

    import uvicorn

    from service.db import Database
    from service.migrate import SchemaNotCurrent
    from service.startup import ensure_local_tokens, prepare_database

    database = Database(settings.effective_database_url, settings, pool=False)
    try:
        prepare_database(database, settings)
        if settings.embedded:
            tokens = ensure_local_tokens(database, settings)
            typer.echo(f"user token (user 'local'):   {tokens.user_token_file}", err=True)
            typer.echo(f"worker token (user 'local'): {tokens.worker_token_file}", err=True)
    except SchemaNotCurrent as error:
        fail(error.detail)
    except Exception as error:  # noqa: BLE001 -- any failure is one line on stderr and exit 1
        where = database.engine.url.render_as_string(hide_password=True)
        fail(
            f"cannot open the database {where}: {type(error).__name__}: {str(error).splitlines()[0][:300]}",
            hint="check MAPCAMPAIGN_DATABASE_URL and that the database server is running",
        )
    finally:
        database.dispose()
    typer.echo(
        f"MapCampaign API on http://{settings.host}:{settings.port}{'/api/v1'}  (data: {settings.data_dir})", err=True
    )
    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        log_level=settings.log_level,
        timeout_graceful_shutdown=3,
        timeout_keep_alive=settings.keep_alive_s,
        # Behind a TLS reverse proxy: client address and scheme from its X-Forwarded-* headers, from it only.
        proxy_headers=settings.forwarded_allow_ips is not None,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
