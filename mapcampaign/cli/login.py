"""``mapcampaign login``: a new one-time dashboard login link from the running service, which keeps running."""

from __future__ import annotations

from typing import Annotated

import typer

from mapcampaign.cli._client import ApiClient, print_json, short_time


def login(
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (for scripts)")] = False,
) -> None:
    """Print a new one-time link that logs a browser into the dashboard as the token's user (by default the
    local user of `mapcampaign up`). The link shows a page that asks to confirm; it works once and expires
    after ten minutes. The service keeps running: nothing is restarted.

    Exit status: 0 a link was made, 1 the service cannot be reached, 2 no usable user token.
    """
    with ApiClient(timeout=30.0) as client:
        link = client.request("POST", "/login-links", expected=(201,)).json()
    if as_json:
        print_json(link)
        return
    typer.echo(link["url"])
    typer.echo(
        f"a one-time dashboard login link for {client.server}: open it in a browser and confirm; "
        f"it works once, until {short_time(link['expires_at'])} UTC",
        err=True,
    )
