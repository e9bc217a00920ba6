"""Who may call: ``CurrentUser`` for user endpoints, ``CurrentWorker`` for worker endpoints."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.auth.errors import InvalidToken, MissingToken, WrongTokenKind
from service.auth.service import Principal, principal_for_token
from service.db import ReadSessionDep, get_database

_bearer = HTTPBearer(auto_error=False, description="API token: `mapcampaign token create --user NAME [--worker]`")
# The Authorization header as given, unchecked (same security scheme): for an endpoint that checks the token
# itself, in its own database work (service.queue.router, the campaigns' read endpoints).
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def bearer_token(credentials: HTTPAuthorizationCredentials | None) -> str:
    """The token of an ``Authorization: Bearer`` header (unchecked); 401 when there is none."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise MissingToken("this endpoint needs a bearer token: Authorization: Bearer <token>")
    return credentials.credentials


def _known(request: Request, session: Session, token: str) -> Principal:
    principal = principal_for_token(session=session, token=token)
    if principal is None:
        raise InvalidToken("the bearer token is unknown or revoked")
    request.state.principal = principal
    return principal


def get_principal(request: Request, credentials: BearerCredentials) -> Principal:
    token = bearer_token(credentials)
    with get_database(request).session(write=False) as session:
        return _known(request, session, token)


def reading_user(request: Request, session: Session, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    """The user calling, checked with ``session``: for an async endpoint that does all its reading in one
    thread-pool turn (the token check, its queries, closing the connection) instead of four."""
    return require_user(_known(request, session, bearer_token(credentials)))


def get_reading_principal(request: Request, credentials: BearerCredentials, session: ReadSessionDep) -> Principal:
    """The caller, looked up in the request's own read session (FastAPI hands the endpoint the same one).

    A read then takes one connection from the pool, not two, and one thread-pool turn fewer than a token
    check with a connection of its own (a checkout with its ping, a query, a rollback).
    """
    return _known(request, session, bearer_token(credentials))


def require_user(principal: Principal) -> Principal:
    if principal.kind != "user":
        raise WrongTokenKind("worker tokens reach only the worker endpoints; use a user token")
    return principal


def require_worker(principal: Principal) -> Principal:
    if principal.kind != "worker":
        raise WrongTokenKind("this is a worker endpoint; it needs a worker token (token create --worker)")
    return principal


async def get_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    return require_user(principal)


async def get_worker(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    return require_worker(principal)


async def get_reading_user(principal: Annotated[Principal, Depends(get_reading_principal)]) -> Principal:
    return require_user(principal)


# The kind checks are async (no I/O): a sync dependency costs a turn through the thread pool.
CurrentUser = Annotated[Principal, Depends(get_user)]
# For endpoints that only read, through ReadSessionDep: the token is checked in that same session.
ReadingUser = Annotated[Principal, Depends(get_reading_user)]
CurrentWorker = Annotated[Principal, Depends(get_worker)]
