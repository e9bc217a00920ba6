"""One-time login links for the dashboard: ``mapcampaign up`` prints one, as Jupyter prints its token URL.

A user token asks for a link (``POST /api/v1/login-links``); the answer holds
``<server>/login/link?secret=mcl_...``; ``mapcampaign login`` asks for another
while the service runs. Opening it in a browser shows a confirmation page that
names the user; its button POSTs the secret (in the form body), which logs that
user in (the dashboard sets its usual session cookie, made from the same token)
and goes to the overview, so nobody pastes a token. A bare GET logs nobody in
and spends nothing: a link sent to someone else cannot log them into the
sender's account behind their back (login CSRF). The link:

* works once: the POST marks it used in one conditional UPDATE, so of two
  logins (two API processes included) exactly one goes through;
* expires after :data:`LINK_TTL_S` seconds (on the service's clock);
* dies with its token: a revoked token's links log nobody in.

Only the SHA-256 of the secret is stored (256 random bits, as the API tokens).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from service.auth.models import ApiToken, LoginLink, User
from service.auth.service import Principal, hash_token
from service.db import utcnow

LINK_TTL_S = 600.0  # long enough to open the printed link, short enough not to linger in a scrollback
LINK_PREFIX = "mcl_"
LINK_PATH = "/login/link"
KEEP_SPENT_S = 86_400.0  # used and expired links are deleted a day after they expire


def create_login_link(*, session: Session, principal: Principal) -> tuple[str, datetime]:
    """A new link secret for this user token, and when it expires. Only user tokens get links."""
    if principal.kind != "user":
        raise ValueError("login links are made for user tokens only")
    now = utcnow()
    session.execute(delete(LoginLink).where(LoginLink.expires_at < now - timedelta(seconds=KEEP_SPENT_S)))
    secret = LINK_PREFIX + secrets.token_urlsafe(32)
    expires_at = now + timedelta(seconds=LINK_TTL_S)
    session.add(LoginLink(token_id=principal.token_id, secret_hash=hash_token(secret), expires_at=expires_at))
    session.flush()
    return secret, expires_at


def _checkable(secret: str) -> bool:
    return secret.startswith(LINK_PREFIX) and len(secret) <= 200


def login_link_user(*, session: Session, secret: str) -> str | None:
    """The name of the user a live link would log in (unused, unexpired, its token live); None otherwise.

    Reads only: the confirmation page shows whom the link logs in without spending it.
    """
    if not _checkable(secret):
        return None
    return session.scalar(
        select(User.name)
        .join(ApiToken, ApiToken.user_id == User.id)
        .join(LoginLink, LoginLink.token_id == ApiToken.id)
        .where(
            LoginLink.secret_hash == hash_token(secret),
            LoginLink.used_at.is_(None),
            LoginLink.expires_at > utcnow(),
            ApiToken.kind == "user",
            ApiToken.revoked_at.is_(None),
        )
    )


def redeem_login_link(*, session: Session, secret: str) -> Principal | None:
    """The user a link logs in, marking it used; None for an unknown, used, expired or revoked one.

    The caller commits: the link is spent only if the login goes through.
    """
    if not _checkable(secret):
        return None
    now = utcnow()
    spent = session.execute(
        update(LoginLink)
        .where(LoginLink.secret_hash == hash_token(secret), LoginLink.used_at.is_(None), LoginLink.expires_at > now)
        .values(used_at=now)
        .returning(LoginLink.token_id)
    ).first()
    if spent is None:
        return None
    row = session.execute(
        select(ApiToken.id, User.id, User.name)
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.id == spent[0], ApiToken.kind == "user", ApiToken.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    token_id, user_id, user_name = row
    return Principal(user_id=user_id, user_name=user_name, token_id=token_id, kind="user")
