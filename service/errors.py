"""Domain errors, and the one place where they become HTTP answers.

Services raise subclasses of :class:`DomainError`; the kind of the base class
decides the status code. Nothing else in the service builds an error response.
Whether an error is answered with JSON (the API, the pages' ``/ui`` endpoints)
or with the dashboard's HTML page (a browser on one of its addresses) is
decided once, by :func:`answers_with_page`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from schemas.io import format_location, plain_message, problem_message

log = logging.getLogger("mapcampaign.service")


class DomainError(Exception):
    status_code = 400
    code = "bad_request"
    headers: dict[str, str] | None = None  # sent with the answer (Retry-After, Connection)
    page_location: str | None = None  # a dashboard page answers with a redirect there instead of an error page

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"


class Unauthorized(DomainError):
    status_code = 401
    code = "unauthorized"

    def __init__(self, detail: str):
        super().__init__(detail)
        self.headers = {"WWW-Authenticate": "Bearer"}  # the API's tokens are bearer tokens


class Invalid(DomainError):
    """A request that parsed but makes no sense (a field-level problem is a 422 too)."""

    status_code = 422
    code = "invalid"


class InvalidFields(Invalid):
    """Fields of a request that parsed but hold values the service refuses; answered like a validation error:
    each problem is the field's location (``("body", "changes", "sky", "nside")``) and the reason."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]):
        super().__init__("; ".join(f"{format_location(loc)}: {message}" for loc, message in problems))
        self.problems = problems


class InvalidField(InvalidFields):
    """One field of a request that parsed but holds a value the service refuses; answered like a validation error."""

    def __init__(self, loc: tuple[str, ...], message: str):
        super().__init__([(loc, message)])
        self.loc = loc
        self.message = message


class UnsupportedMediaType(DomainError):
    status_code = 415
    code = "unsupported_media_type"


class TooLarge(DomainError):
    status_code = 413
    code = "too_large"


class RequestTimeout(DomainError):
    """The request's body did not arrive in time; the connection is closed (its unread rest is not waited for)."""

    status_code = 408
    code = "request_timeout"

    def __init__(self, detail: str):
        super().__init__(detail)
        self.headers = {"Connection": "close"}


class TooManyRequests(DomainError):
    """The caller already runs as many of this expensive request as it may; another user is not affected."""

    status_code = 429
    code = "too_many_requests"

    def __init__(self, detail: str, retry_after_s: int):
        super().__init__(detail)
        self.headers = {"Retry-After": str(retry_after_s)}


class InsufficientStorage(DomainError):
    """The service could not write a file it must keep (disk full, quota, file size limit, read-only)."""

    status_code = 507
    code = "insufficient_storage"


class Unavailable(DomainError):
    status_code = 503
    code = "unavailable"


# PostgreSQL's SQLSTATEs of errors a new attempt of the same transaction can outlive: class 08 (connection
# exception, matched by prefix), serialization failure, deadlock, lock timeout, too many connections, and
# the server shutting down or starting up.
RETRYABLE_SQLSTATE_CLASSES = ("08",)
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "55P03", "53300", "57P01", "57P02", "57P03"})
# SQLite: the write lock stayed taken for the whole busy timeout.
RETRYABLE_SQLITE_ERRORS = frozenset({"SQLITE_BUSY", "SQLITE_LOCKED"})


def retry_can_succeed(error: DBAPIError) -> bool:
    """Whether the database error is transient (connection lost, lock contention), not the statement's own fault.

    A statement the database refuses (too many bind parameters, a missing table, a full disk on SQLite)
    fails again on every retry.
    """
    if error.connection_invalidated:
        return True  # the connection broke mid-statement
    sqlstate = getattr(error.orig, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate in RETRYABLE_SQLSTATES or sqlstate.startswith(RETRYABLE_SQLSTATE_CLASSES)
    sqlite_error = getattr(error.orig, "sqlite_errorname", None)
    if sqlite_error is not None:
        return sqlite_error in RETRYABLE_SQLITE_ERRORS
    # No code: psycopg's own errors. Without a statement, no connection could be made (server down).
    return isinstance(error, OperationalError) and error.statement is None


def error_response(status_code: int, detail: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status_code, headers=headers)


def invalid_request_response(problems: list[dict[str, Any]], body_model: type[BaseModel] | None = None) -> JSONResponse:
    """A 422 naming each field at fault: ``problems`` are pydantic's errors (``loc``, ``msg``, ``type``).
    With the request body's model, an unknown body field is answered with a close match ("did you mean")."""
    detail = []
    for item in problems:
        loc = tuple(item.get("loc", ()))
        message = plain_message(str(item.get("msg", "")))
        if body_model is not None and loc[:1] == ("body",):
            message = problem_message(body_model, {**item, "loc": loc[1:]})
        detail.append(
            {
                "field": format_location(loc),
                "loc": [part if isinstance(part, int) else str(part) for part in loc],
                "msg": message,
                "type": item.get("type", ""),
            }
        )
    return JSONResponse({"detail": detail, "code": "invalid_request"}, status_code=422)


def _body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model a route reads its JSON body into, if it has one."""
    body_field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(body_field, "field_info", None), "annotation", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


async def http_exception_json(_request: Request, error: StarletteHTTPException) -> JSONResponse:
    """Starlette's own errors (no route: 404, wrong method: 405) in the API's JSON shape."""
    code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(error.status_code, "http_error")
    return error_response(error.status_code, str(error.detail), code, getattr(error, "headers", None))


# The dashboard's HTML error page for (request, status code, detail); service.app passes it in, so that this
# module stays below the dashboard that draws it.
ErrorPage = Callable[[Request, int, str], Awaitable[Response]]

# Addresses that always answer JSON: the API, the dashboard pages' JSON and event stream, the static files.
JSON_PATHS = ("/api/", "/ui/", "/static/")


def answers_with_page(request: Request) -> bool:
    """Whether an error is answered with the dashboard's HTML page rather than JSON: the one place that decides.

    JSON under :data:`JSON_PATHS` and for the endpoints the OpenAPI description lists (``/healthz``,
    ``/metrics``). Every other address is the dashboard's (a page, a browser download, an address nobody
    serves): an HTML page, unless the client asks for JSON only (a script's ``Accept: application/json``).
    """
    route = request.scope.get("route")
    if request.url.path.startswith(JSON_PATHS) or getattr(route, "include_in_schema", False):
        return False
    accept = request.headers.get("accept", "")
    return "text/html" in accept or "application/json" not in accept


def page_redirect(url: str) -> RedirectResponse:
    """A 303 to a page of this site, never cached: after a form post, or to the login form."""
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


def install_error_handlers(app: FastAPI, error_page: ErrorPage | None = None) -> None:
    """Answer every error in one of two shapes: the API's JSON, or ``error_page`` (none: JSON everywhere)."""

    @app.exception_handler(DomainError)
    async def _domain(request: Request, error: DomainError) -> Response:
        if error_page is not None and answers_with_page(request):
            if error.page_location is not None:  # no session: the login form
                return page_redirect(error.page_location)
            return await error_page(request, error.status_code, error.detail)
        if isinstance(error, InvalidFields):
            return invalid_request_response(
                [{"loc": loc, "msg": message, "type": "value_error"} for loc, message in error.problems]
            )
        return error_response(error.status_code, error.detail, type(error).code, error.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError) -> Response:
        if error_page is not None and answers_with_page(request):  # e.g. /campaigns/99999999999999999999
            problems = "; ".join(
                f"{format_location(tuple(item.get('loc', ())))}: {item.get('msg', '')}" for item in error.errors()
            )
            return await error_page(request, 422, problems)
        return invalid_request_response(list(error.errors()), _body_model(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> Response:
        if error_page is not None and answers_with_page(request):  # e.g. a typo, an old bookmark
            detail = "There is no page at this address." if error.status_code == 404 else str(error.detail)
            return await error_page(request, error.status_code, detail)
        return await http_exception_json(request, error)

    @app.exception_handler(DBAPIError)
    async def _database_error(request: Request, error: DBAPIError) -> JSONResponse:
        if retry_can_succeed(error):
            log.warning(
                "database unavailable during %s %s: %s", request.method, request.url.path, type(error.orig).__name__
            )
            return error_response(
                503, "the database is busy or unreachable; try again", "database_unavailable", {"Retry-After": "1"}
            )
        # The same request would fail the same way: a 503 would have clients retry it for ever.
        log.error("database error during %s %s", request.method, request.url.path, exc_info=error)
        return error_response(500, "internal server error", "internal_error")

    # Every pooled connection stayed busy for the pool's timeout: the service is overloaded, not broken.
    @app.exception_handler(PoolTimeout)
    async def _pool_exhausted(request: Request, _error: PoolTimeout) -> JSONResponse:
        log.warning("no database connection free during %s %s: answered 503", request.method, request.url.path)
        return error_response(503, "the service is busy; try again", "busy", {"Retry-After": "2"})

    # A number past what the database stores is the client's mistake. Ids in paths and queries are
    # bounded where they are declared (service.deps.RowId: a 422 naming the parameter); this is the
    # backstop for any other: PostgreSQL raises DataError, the SQLite driver OverflowError.
    @app.exception_handler(DataError)
    @app.exception_handler(OverflowError)
    async def _out_of_range(request: Request, error: Exception) -> JSONResponse:
        log.info("value out of range during %s %s: %s", request.method, request.url.path, type(error).__name__)
        return error_response(
            422, "a number or value in the request is out of the range the service stores", "out_of_range"
        )

    @app.exception_handler(Exception)
    async def _catch_all(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error during %s %s", request.method, request.url.path)
        return error_response(500, "internal server error", "internal_error")
