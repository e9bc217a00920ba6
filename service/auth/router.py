"""HTTP of the auth room: one-time dashboard login links (the tokens themselves are made by the CLI)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from schemas.api import ErrorBody, LoginLinkInfo
from service.auth.deps import CurrentUser
from service.auth.login_links import LINK_PATH, create_login_link
from service.db import SessionDep

router = APIRouter(
    prefix="/login-links", tags=["auth"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}}
)


@router.post("", response_model=LoginLinkInfo, status_code=201)
def new_login_link(request: Request, user: CurrentUser, session: SessionDep) -> LoginLinkInfo:
    """A one-time link that logs a browser into the dashboard as this token's user (``mapcampaign up`` prints
    one, ``mapcampaign login`` another). Opening it shows a page that names the user; its button logs in.
    The link works once and expires after ten minutes; revoking the token ends it."""
    secret, expires_at = create_login_link(session=session, principal=user)
    session.commit()
    base = str(request.base_url).rstrip("/")
    return LoginLinkInfo(url=f"{base}{LINK_PATH}?secret={secret}", expires_at=expires_at)
