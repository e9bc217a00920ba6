"""Who may call: ``CurrentUser`` for user endpoints, ``CurrentWorker`` for worker endpoints."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.auth.errors import InvalidToken, MissingToken, WrongTokenKind
from service.auth.service import Principal, principal_for_token
from service.db import get_database

_bearer = HTTPBearer(auto_error=False, description="API token: `mapcampaign token create --user NAME [--worker]`")
# The Authorization header as given, unchecked (same security scheme): for an endpoint that checks the token
# in its own statement and calls get_principal only when that finds nothing (service.queue.router).
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def get_principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise MissingToken("this endpoint needs a bearer token: Authorization: Bearer <token>")
    with get_database(request).session(write=False) as session:
        principal = principal_for_token(session=session, token=credentials.credentials)
    if principal is None:
        raise InvalidToken("the bearer token is unknown or revoked")
    request.state.principal = principal
    return principal


def get_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if principal.kind != "user":
        raise WrongTokenKind("worker tokens reach only the worker endpoints; use a user token")
    return principal


def get_worker(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if principal.kind != "worker":
        raise WrongTokenKind("this is a worker endpoint; it needs a worker token (token create --worker)")
    return principal


CurrentUser = Annotated[Principal, Depends(get_user)]
CurrentWorker = Annotated[Principal, Depends(get_worker)]
