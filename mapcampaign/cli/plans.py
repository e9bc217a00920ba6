"""``mapcampaign plans``: the overlap preprocessing plans the user's campaigns need (shared by every campaign
with their scan key and ranks)."""

from __future__ import annotations

from typing import Annotated

import typer

from mapcampaign.cli._client import ApiClient, duration, print_json, short_time, stdout_console


def plans(
    state: Annotated[str | None, typer.Option("--state", help="Only this state: building, ready, failed")] = None,
    site: Annotated[str | None, typer.Option("--site", help="Only this site")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="At most this many")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (for scripts)")] = False,
) -> None:
    """List the overlap preprocessing plans your campaigns need (a user in MAPCAMPAIGN_ADMIN_USERS: every
    plan): one per (scan key, ranks, site), built once and reused by every realisation that needs it."""
    params: dict[str, str | int] = {"limit": limit}
    if state:
        params["state"] = state
    if site:
        params["site"] = site
    with ApiClient() as client:
        items = client.get("/plans", params=params)["items"]
    if as_json:
        print_json(items)
        return
    if not items:
        typer.echo("no plans yet: a worker builds one when the first realisation of a scan key is claimed")
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("id", "scan key", "ranks", "site", "state", "uses", "build time", "size", "ready at"):
        table.add_column(column)
    for item in items:
        size = item.get("size_bytes")
        table.add_row(
            str(item["id"]),
            item["scan_key"][:16],
            str(item["ranks"]),
            item["site"],
            item["state"] + (f" ({item['last_error'][:60]})" if item.get("last_error") and item["state"] != "ready" else ""),
            str(item["uses"]),
            duration(item.get("build_time_s")),
            "-" if size is None else f"{size / 1024:.0f} KiB",
            short_time(item.get("ready_at")),
        )
    stdout_console().print(table)
