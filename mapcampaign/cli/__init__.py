"""The ``mapcampaign`` command: one module per command group, heavy imports deferred to the command bodies.

Exit codes: 0 done; 1 the work failed (a campaign with failed or cancelled realisations, the service
unreachable, the database not migrated); 2 bad usage or input (an invalid spec names the file, the
field path and the reason).
"""

from __future__ import annotations

from typing import Annotated

import typer

from mapcampaign.cli import campaigns as campaign_commands
from mapcampaign.cli import db as db_commands
from mapcampaign.cli import instruments as instrument_commands
from mapcampaign.cli import login as login_commands
from mapcampaign.cli import plans as plan_commands
from mapcampaign.cli import products as products_commands
from mapcampaign.cli import serve as serve_commands
from mapcampaign.cli import spectrum as spectrum_commands
from mapcampaign.cli import token as token_commands
from mapcampaign.cli import up as up_commands
from mapcampaign.cli import watch as watch_commands
from mapcampaign.cli import worker as worker_commands
from mapcampaign.cli._client import global_options

app = typer.Typer(
    name="mapcampaign",
    help=(
        "MapCampaign: Monte Carlo CMB map-making campaigns.\n\n"
        "Start with `mapcampaign demo`, or `mapcampaign up` and then `mapcampaign submit SPEC` and "
        "`mapcampaign watch ID` in another terminal. Exit status: 0 done, 1 the work failed, 2 bad usage or input."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: re-wrapped paragraphs, no type badges
)


@app.callback()
def connection(
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            metavar="URL",
            envvar="MAPCAMPAIGN_SERVER",
            show_envvar=True,
            help=(
                "Service root URL [default: the `mapcampaign up` running on this data folder, else "
                "http://MAPCAMPAIGN_HOST:MAPCAMPAIGN_PORT, i.e. http://127.0.0.1:8765]"
            ),
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            metavar="TOKEN",
            envvar="MAPCAMPAIGN_TOKEN",
            show_envvar=True,
            help="User API token [default: the file MAPCAMPAIGN_TOKEN_FILE, else <data dir>/tokens/local-user.token]",
        ),
    ] = None,
) -> None:
    global_options.server = server
    global_options.token = token


# Running things
app.command("up")(up_commands.up)
app.command("demo")(up_commands.demo)
app.command("serve")(serve_commands.serve)
app.command("worker")(worker_commands.worker)
app.command("login")(login_commands.login)
# Campaigns
app.command("submit")(campaign_commands.submit)
app.command("list")(campaign_commands.list_campaigns)
app.command("status")(campaign_commands.status)
app.command("watch")(watch_commands.watch)
app.command("cancel")(campaign_commands.cancel)
app.command("retry")(campaign_commands.retry)
app.command("extend")(campaign_commands.extend)
app.command("clone")(campaign_commands.clone)
app.command("delete")(campaign_commands.delete)
app.command("logs")(campaign_commands.logs)
app.command("plans")(plan_commands.plans)
app.command("products")(products_commands.products)
app.command("spectrum")(spectrum_commands.spectrum)
# Instruments
app.command("upload")(instrument_commands.upload)
# Administration on the service host
app.add_typer(token_commands.app, name="token")
app.add_typer(db_commands.app, name="db")


def main() -> None:
    app(prog_name="mapcampaign")  # the same usage line from the console script and `python -m mapcampaign`
