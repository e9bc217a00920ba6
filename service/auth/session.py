"""Cookie sessions for the browser (the dashboard's login): a signed cookie made from a user's API token, and
CSRF tokens.

The cookie holds ``base64url(payload).base64url(HMAC-SHA256(key, payload))``
with payload ``{"u": user id, "t": token id, "n": random nonce, "e": expiry}``.
It never holds the API token itself. Each request checks the signature, the
expiry, and that the token it was made from is still a live *user* token, so
revoking the token ends every session made with it.

The cookie is HttpOnly, SameSite=Lax, Path=/ (and Secure when
``MAPCAMPAIGN_COOKIE_SECURE``). Logging out clears it in the browser; a copy
taken earlier stays valid until it expires or its token is revoked (the
sessions are stateless: no table to strike them from).

Every POST made with the cookie carries a CSRF token, ``HMAC(key, "csrf:" +
nonce)``, in a form field or the ``X-CSRF-Token`` header, and must come from
this origin when the browser says where it comes from (``Origin``).

The signing key is ``MAPCAMPAIGN_SESSION_SECRET`` or, unset, 32 random bytes
kept in ``<data_dir>/session.key`` (mode 0600), made on first use; every API
process of the deployment shares it through the data folder.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.auth.errors import CsrfRejected, LoginRequired
from service.auth.models import ApiToken, User
from service.auth.service import Principal
from service.config import Settings
from service.db import get_database

COOKIE_NAME = "mapcampaign_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"

_key_lock = threading.Lock()


@dataclass(frozen=True)
class DashboardSession:
    principal: Principal
    nonce: str
    expires_at: float
    csrf_token: str

    @property
    def user_id(self) -> int:
        return self.principal.user_id

    @property
    def user_name(self) -> str:
        return self.principal.user_name


# --------------------------------------------------------------------------- key


def load_session_key(settings: Settings) -> bytes:
    """The signing key: the setting, or the key file in the data folder (made once, atomically)."""
    if settings.session_secret is not None:
        return hashlib.sha256(settings.session_secret.get_secret_value().encode()).digest()
    path = settings.session_key_path
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    try:
        os.link(partial, path)  # fails if another process published its key first; then use that one
    except FileExistsError:
        pass
    finally:
        partial.unlink(missing_ok=True)
    return _read_key(path)


def _read_key(path) -> bytes:
    raw = path.read_text().strip()
    if len(raw) < 32:
        raise RuntimeError(f"{path} holds no usable session key; delete it to make a new one")
    return hashlib.sha256(raw.encode()).digest()


def session_key(request: Request) -> bytes:
    state = request.app.state
    key = getattr(state, "dashboard_session_key", None)
    if key is None:
        with _key_lock:
            key = getattr(state, "dashboard_session_key", None)
            if key is None:
                key = load_session_key(state.settings)
                state.dashboard_session_key = key
    return key


# --------------------------------------------------------------------------- cookie


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def csrf_token_for(key: bytes, nonce: str) -> str:
    return _b64(_mac(key, b"csrf:" + nonce.encode()))


def login_form_token(key: bytes, nonce: str) -> str:
    """The token a login-link confirmation form carries, bound to the nonce in its own cookie.

    A form posted from another site cannot carry it: that site can neither read the page nor send the
    cookie (SameSite=Lax keeps it off cross-site POSTs), even in a browser that names no ``Origin``.
    """
    return _b64(_mac(key, b"login-form:" + nonce.encode()))


def make_cookie(key: bytes, *, principal: Principal, max_age_s: float, now: float | None = None) -> str:
    payload = {
        "u": principal.user_id,
        "t": principal.token_id,
        "n": secrets.token_urlsafe(16),
        "e": int((now if now is not None else time.time()) + max_age_s),
    }
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    return f"{_b64(body)}.{_b64(_mac(key, b'session:' + body))}"


def read_cookie(key: bytes, value: str | None, *, now: float | None = None) -> dict | None:
    """The payload of a cookie this service signed and that has not expired; None otherwise."""
    if not value or value.count(".") != 1 or len(value) > 1_000:
        return None
    body_text, mac_text = value.split(".")
    try:
        body, mac = _unb64(body_text), _unb64(mac_text)
    except (binascii.Error, ValueError):
        return None
    if not hmac.compare_digest(mac, _mac(key, b"session:" + body)):
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict) or not all(isinstance(payload.get(k), int) for k in ("u", "t", "e")):
        return None
    if not isinstance(payload.get("n"), str) or payload["e"] < (now if now is not None else time.time()):
        return None
    return payload


def live_user_principal(*, session: Session, user_id: int, token_id: int) -> Principal | None:
    """The principal of a session whose token is still a live user token of that user."""
    row = session.execute(
        select(User.name)
        .join(ApiToken, ApiToken.user_id == User.id)
        .where(
            ApiToken.id == token_id,
            ApiToken.user_id == user_id,
            ApiToken.kind == "user",
            ApiToken.revoked_at.is_(None),
        )
    ).first()
    if row is None:
        return None
    return Principal(user_id=user_id, user_name=row[0], token_id=token_id, kind="user")


def set_session_cookie(response, *, value: str, settings: Settings) -> None:
    response.set_cookie(
        COOKIE_NAME,
        value,
        max_age=int(settings.session_max_age_s),
        path="/",
        httponly=True,
        samesite="lax",
        secure=settings.cookie_secure,
    )


def clear_session_cookie(response, *, settings: Settings) -> None:
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="lax", secure=settings.cookie_secure)


# --------------------------------------------------------------------------- dependencies


def optional_session(request: Request) -> DashboardSession | None:
    cached: DashboardSession | None | bool = getattr(request.state, "dashboard_session", False)
    if not isinstance(cached, bool):
        return cached
    key = session_key(request)
    payload = read_cookie(key, request.cookies.get(COOKIE_NAME))
    found = None
    if payload is not None:
        with get_database(request).session(write=False) as session:
            principal = live_user_principal(session=session, user_id=payload["u"], token_id=payload["t"])
        if principal is not None:
            found = DashboardSession(
                principal=principal,
                nonce=payload["n"],
                expires_at=float(payload["e"]),
                csrf_token=csrf_token_for(key, payload["n"]),
            )
            request.state.principal = principal
    request.state.dashboard_session = found
    return found


def require_session(
    request: Request, session: Annotated[DashboardSession | None, Depends(optional_session)]
) -> DashboardSession:
    if session is None:
        # A page comes back after the login; a form post (its session expired) goes back to the overview.
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(next_path=target if request.method == "GET" else "/")
    return session


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from another origin (Origin, else Referer).

    A request that names no origin at all (not a browser, or an old one) passes here; the CSRF token,
    which only this site's pages carry, still has to match.
    """
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if not claimed:
        return True
    if claimed == "null":  # sandboxed frames, data: URLs, some cross-site redirects
        return False
    parts = urlsplit(claimed)
    return f"{parts.scheme}://{parts.netloc}" == f"{request.url.scheme}://{request.url.netloc}"


def check_csrf(request: Request, session: DashboardSession, submitted: str | None) -> None:
    if not same_origin(request):
        raise CsrfRejected("this request comes from another site")
    token = submitted or request.headers.get(CSRF_HEADER) or ""
    if not hmac.compare_digest(token.encode(), session.csrf_token.encode()):
        raise CsrfRejected("the form is out of date or was not sent by this dashboard; reload the page")


DashboardUser = Annotated[DashboardSession, Depends(require_session)]
MaybeDashboardUser = Annotated[DashboardSession | None, Depends(optional_session)]
