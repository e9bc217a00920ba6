"""What the client commands share: where the service is, the user token, HTTP calls that fail readably, output.

Where the service is and which token to use: :mod:`mapcampaign._connection` (the Python client's own
defaults), with ``--server`` and ``--token`` of the top-level command first.

Exit codes: 4xx answers are bad usage or input (2), an unreachable service or a 5xx is 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Self

import typer

from mapcampaign import _connection, errors
from mapcampaign._connection import API_PREFIX
from mapcampaign.cli._utilities import fail
from mapcampaign.errors import ConfigurationError

if TYPE_CHECKING:
    import httpx


@dataclass
class GlobalOptions:
    server: str | None = None
    token: str | None = None


# mapcampaign/cli/_stack.py reads these from here.
local_server_url = _connection.local_server_url
up_record_path = _connection.up_record_path

# Set once by the top-level callback (``mapcampaign --server URL --token T COMMAND``).
global_options = GlobalOptions()


def server_url(explicit: str | None = None) -> str:
    try:
        return _connection.server_url(explicit or global_options.server)
    except ConfigurationError as error:
        fail(str(error), hint=error.hint, code=2)


def user_token(token_file: Path | None = None) -> str:
    try:
        return _connection.user_token(global_options.token, token_file)
    except ConfigurationError as error:
        fail(str(error), hint=error.hint, code=2)


class ApiClient:
    """A user's httpx client on ``<server>/api/v1``; every failure ends the command with a readable message."""

    def __init__(self, server: str | None = None, token: str | None = None, *, timeout: float = 60.0):
        from campaignlib import transport

        self.server = server_url(server)
        self.token = token or user_token()
        self.http = transport.http_client(
            self.server + API_PREFIX, self.token, timeout_s=timeout, user_agent="mapcampaign-cli"
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, expected: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        """The answer when its status is ``expected``; otherwise the command fails (see :func:`fail_on_answer`)."""
        from campaignlib import transport

        try:
            answer = transport.send(self.http, method, path, **kwargs)
        except transport.Unreachable as error:
            self.unreachable(error)
        if answer.status_code not in expected:
            fail_on_answer(answer, f"{method} {path}")
        return answer

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs).json()

    def unreachable(self, error: Exception) -> NoReturn:
        problem = getattr(error, "problem", None) or f"{type(error).__name__}: {error}"
        fail(
            f"cannot reach the service at {self.server}: {problem}",
            hint="is it running (`mapcampaign up`)? otherwise pass --server URL or set MAPCAMPAIGN_SERVER",
        )


def answer_detail(answer: httpx.Response) -> Any:
    from campaignlib import transport

    return transport.error_body(answer)[0]


def field_problems(answer: httpx.Response) -> list[tuple[str, str]]:
    """(dotted field path, reason) pairs of a 422 answer, the path naming the field in the spec file
    (:func:`mapcampaign.errors.field_problems`, which the Python client uses too)."""
    return errors.field_problems(answer_detail(answer))


def fail_on_answer(answer: httpx.Response, what: str) -> NoReturn:
    status = answer.status_code
    if status == 422:
        reasons = "; ".join(f"{field}: {msg}" if field else msg for field, msg in field_problems(answer))
        fail(f"{what}: refused (HTTP 422): {reasons}", code=2)
    hint = {
        401: "the token is unknown or revoked: pass --token or set MAPCAMPAIGN_TOKEN",
        403: "use a user token, not a worker token",
        404: (
            "no such realisation: `mapcampaign status ID` says how many the campaign has"
            if "/realizations/" in what
            else "no such campaign of yours: `mapcampaign list` shows them"
        ),
    }.get(status)
    fail(f"{what}: {answer_detail(answer)} (HTTP {status})", hint=hint, code=2 if 400 <= status < 500 else 1)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=None, default=str))


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def stdout_console() -> Any:
    """Tables on stdout; wide when piped, so that a log or a pager gets whole rows."""
    import sys

    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def short_time(value: str | None) -> str:
    """``2026-11-21T20:47:03.123+00:00`` -> ``2026-11-21 20:47:03``."""
    if not value:
        return "-"
    return value.replace("T", " ")[:19]


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")
