"""``mapcampaign upload FILE [--kind KIND]``: keep a TOAST focal plane or schedule at the service, by checksum.

The service checks the file as it checks a campaign's (``POST /api/v1/instrument-files``) and keeps it once
under its instrument_root as ``uploads/<sha256>.h5`` or ``.ecsv``; the command prints the ``file`` and
``sha256`` a spec names it by (``--json``: the service's record).

Exit status: 0 kept (or already there); 2 bad usage, an unreadable file, or a file the service refuses (the
message names the column); 1 the service cannot be reached or failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from mapcampaign.cli._client import ApiClient, print_json
from mapcampaign.cli._utilities import fail

Kind = Literal["focal-plane", "ground-schedule", "satellite-schedule"]


def upload(
    path: Annotated[Path, typer.Argument(metavar="FILE", help="TOAST focal plane (.h5) or schedule (.ecsv)")],
    kind: Annotated[
        Kind | None,
        typer.Option("--kind", help="focal-plane (the default for .h5/.hdf5), ground-schedule or satellite-schedule"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (for scripts)")] = False,
) -> None:
    """Upload a TOAST focal-plane or schedule file; print the file and sha256 a spec names it by."""
    from schemas.api import INSTRUMENT_MEDIA_TYPES

    if kind is None:
        if path.suffix.lower() not in (".h5", ".hdf5"):
            fail(f"{path.name}: pass --kind ground-schedule or --kind satellite-schedule for a schedule", code=2)
        kind = "focal-plane"
    try:
        content = path.read_bytes()
    except OSError as unreadable:
        fail(f"cannot read {path}: {unreadable.strerror or unreadable}", code=2)
    with ApiClient(timeout=300.0) as client:
        answer = client.request(
            "POST",
            "/instrument-files",
            expected=(200, 201),
            params={"kind": kind},
            content=content,
            headers={"Content-Type": INSTRUMENT_MEDIA_TYPES[kind]},
        )
    record = answer.json()
    if as_json:
        print_json(record)
        return
    count = f"{record['detectors']} detectors" if record["detectors"] is not None else f"{record['scans']} scans"
    state = "kept" if answer.status_code == 201 else "already kept"
    typer.echo(f"{path.name}: {state} as {record['file']} ({count}, {record['size_bytes']} bytes)")
    typer.echo(f'file = "{record["file"]}"')
    typer.echo(f'sha256 = "{record["sha256"]}"')
