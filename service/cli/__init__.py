"""The ``mapcampaign`` command: one module per command group, heavy imports deferred to the command bodies.

Exit codes: 0 success, 1 failed work (e.g. the database is not migrated), 2 bad usage or settings.
"""

from __future__ import annotations

import typer

from service.cli import db as db_commands
from service.cli import products as products_commands
from service.cli import serve as serve_commands
from service.cli import token as token_commands
from service.cli import worker as worker_commands

app = typer.Typer(
    name="mapcampaign",
    help="MapCampaign: Monte Carlo CMB map-making campaigns.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve")(serve_commands.serve)
app.add_typer(db_commands.app, name="db")
app.add_typer(token_commands.app, name="token")
app.command("products")(products_commands.products)
app.command("worker")(worker_commands.worker)


def main() -> None:
    app()
