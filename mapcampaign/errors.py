"""What the client raises: one hierarchy, so that ``except mapcampaign.errors.MapCampaignError`` catches it all.

An answer of the service that is not a success becomes an :class:`ApiError` with the HTTP status, the
service's stable error ``code`` (``not_found``, ``conflict``, ``invalid_request`` ...) and its ``detail``;
the subclasses name the statuses a program reacts to. Standard library only: the CLI imports it at start.
"""

from __future__ import annotations

from typing import Any


class MapCampaignError(Exception):
    """Base of every error of the client."""


class ConfigurationError(MapCampaignError, ValueError):
    """No usable server address or token from the arguments, the environment and the data folder."""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class ApiError(MapCampaignError):
    """The service answered with an error: ``status`` (HTTP; None when no answer came), ``code``, ``detail``."""

    def __init__(self, status: int | None, code: str, detail: Any, *, request: str = ""):
        self.status = status
        self.code = code
        self.detail = detail
        self.request = request  # "GET /campaigns/7", for the message
        where = f"{request}: " if request else ""
        super().__init__(f"{where}{detail} (HTTP {status}, {code})" if status else f"{where}{detail} ({code})")


class NotFound(ApiError):
    """404: no such campaign, realisation, plan or product of this user."""


class Unauthorized(ApiError):
    """401: the token is unknown or revoked."""


class Forbidden(ApiError):
    """403: the token may not do this (a worker token used as a user's)."""


class Conflict(ApiError):
    """409: the request does not fit the current state (cancel a finished campaign, retry with none failed)."""


class InvalidRequest(ApiError):
    """422 from the service, or a spec that does not validate locally.

    ``problems`` holds one ``(field path, message)`` pair per problem; the path is dotted and relative to
    the spec (``pixelization.nside``), empty for a problem of the whole request.
    """

    def __init__(
        self, status: int | None, code: str, detail: Any, *, problems: list[tuple[str, str]], request: str = ""
    ):
        self.problems = problems
        summary = "; ".join(f"{field}: {message}" if field else message for field, message in problems)
        super().__init__(status, code, summary or detail, request=request)
        self.detail = detail


class ServiceUnavailable(ApiError):
    """503 (the service is busy or its database is down), or no answer at all (``status`` None)."""


class WaitTimeout(MapCampaignError, TimeoutError):
    """:meth:`mapcampaign.Client.wait` gave up before the campaign finished; ``last`` is its last status."""

    def __init__(self, campaign_id: int, timeout_s: float, last: Any):
        super().__init__(f"campaign {campaign_id} did not finish within {timeout_s:g} s (state {last.state})")
        self.campaign_id = campaign_id
        self.timeout_s = timeout_s
        self.last = last


ERRORS_BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
    503: ServiceUnavailable,
}


def field_problems(detail: Any) -> list[tuple[str, str]]:
    """``(field path, message)`` pairs of a 422 answer's ``detail``, the path relative to the request body
    (``body.pixelization.nside`` -> ``pixelization.nside``) so that it names the field in the spec file."""
    if not isinstance(detail, list):
        return [("", str(detail))]
    problems = []
    for item in detail:
        if not isinstance(item, dict):
            problems.append(("", str(item)))
            continue
        field = str(item.get("field") or ".".join(str(part) for part in item.get("loc", [])))
        if field == "body" or field.startswith("body."):
            field = field.removeprefix("body").removeprefix(".")
        problems.append((field, str(item.get("msg", ""))))
    return problems


def api_error(status: int, body: Any, *, request: str = "") -> ApiError:
    """The exception for an error answer: ``body`` is its parsed JSON (``{"detail", "code"}``) or its text."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    code = str(body.get("code") or f"http_{status}") if isinstance(body, dict) else f"http_{status}"
    error_class = ERRORS_BY_STATUS.get(status, ApiError)
    if error_class is InvalidRequest:
        return InvalidRequest(status, code, detail, problems=field_problems(detail), request=request)
    return error_class(status, code, detail, request=request)
