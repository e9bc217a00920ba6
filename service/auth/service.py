"""Tokens: made, hashed, looked up. A token is never logged or stored in clear."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.auth.models import ApiToken, User

TOKEN_PREFIX = {"user": "mcu_", "worker": "mcw_"}


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so one SHA-256 is enough (no slow hash needed).
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's user and its kind."""

    user_id: int
    user_name: str
    token_id: int
    kind: str


def get_or_create_user(*, session: Session, name: str) -> User:
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        user = User(name=name)
        session.add(user)
        session.flush()
    return user


def create_token(*, session: Session, user_name: str, kind: str, label: str = "") -> str:
    """Create a token for ``user_name`` (made if missing); return the token, which is not stored."""
    if kind not in TOKEN_PREFIX:
        raise ValueError(f"token kind must be 'user' or 'worker', not {kind!r}")
    user = get_or_create_user(session=session, name=user_name)
    token = TOKEN_PREFIX[kind] + secrets.token_urlsafe(32)
    session.add(ApiToken(user_id=user.id, kind=kind, token_hash=hash_token(token), prefix=token[:8], label=label))
    session.flush()
    return token


def principal_for_token(*, session: Session, token: str) -> Principal | None:
    row = session.execute(
        select(ApiToken.id, ApiToken.kind, User.id, User.name)
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    token_id, kind, user_id, user_name = row
    return Principal(user_id=user_id, user_name=user_name, token_id=token_id, kind=kind)
