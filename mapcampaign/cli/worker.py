"""``mapcampaign worker``: run the site worker (``worker`` package, imported only when the command runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mapcampaign.cli._utilities import fail


def worker(
    site: Annotated[
        Path | None, typer.Option("--site", help="Site file, e.g. deploy/sites/local.toml [env MAPCAMPAIGN_SITE]")
    ] = None,
    server: Annotated[
        str | None, typer.Option("--server", help="Service URL [env MAPCAMPAIGN_SERVER, default http://127.0.0.1:8765]")
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="Worker token file [env MAPCAMPAIGN_TOKEN_FILE, default <data dir>/tokens/local-worker.token]",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Worker name [env MAPCAMPAIGN_WORKER_NAME, default <site>@<host>]")
    ] = None,
) -> None:
    """Claim tasks from the service and run them as MPI jobs through Parsl on the site's provider.

    Runs until SIGTERM or Ctrl-C: then it stops claiming, lets running tasks finish for
    MAPCAMPAIGN_WORKER_DRAIN_S seconds, ends the rest and hands them back, and exits 0.
    """
    import logging

    from pydantic import ValidationError

    from mapcampaign.cli._client import global_options
    from worker.settings import WorkerSettings
    from worker.site import SiteError, load_site

    # `mapcampaign --server URL worker` means the same as `mapcampaign worker --server URL`.
    overrides: dict[str, Any] = {"site": site, "server": server or global_options.server, "token_file": token_file, "name": name}
    try:
        settings = WorkerSettings(**{key: value for key, value in overrides.items() if value is not None})
    except ValidationError as error:
        problems = "; ".join(
            f"{_setting_name(item['loc'])}: {item['msg'].removeprefix('Value error, ')}" for item in error.errors()
        )
        fail(f"bad settings: {problems}", code=2)
    if settings.site is None:
        fail("no site file", hint="pass --site deploy/sites/local.toml or set MAPCAMPAIGN_SITE", code=2)
    try:
        site_config = load_site(settings.site)
    except SiteError as error:
        fail(str(error), hint="the site file format is described in README.md, section Worker", code=2)
    token_path = settings.effective_token_file
    try:
        token = token_path.read_text().strip()
    except OSError as error:
        fail(
            f"cannot read the worker token file {token_path}: {error.strerror}",
            hint="make a token with `mapcampaign token create --user NAME --worker` and pass --token-file",
            code=2,
        )
    if not token:
        fail(f"the worker token file {token_path} is empty", code=2)

    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from worker.agent import run_worker

    raise typer.Exit(run_worker(settings, site_config, token))


def _setting_name(location: tuple[int | str, ...]) -> str:
    field = str(location[0]) if location else "settings"
    if field.startswith("MAPCAMPAIGN_"):
        return field
    options = {"site": "--site", "server": "--server", "token_file": "--token-file", "name": "--name"}
    return options.get(field, f"MAPCAMPAIGN_{field.upper()}")
