"""The browser's login and logout: the login form, one-time login links, and the logout button.

The pages are drawn by the dashboard (its templates ``login.html`` and ``login_link.html``, in its layout):
``login_pages(render)`` takes its page renderer, so that this room stays below the dashboard that imports it.
A login sets the session cookie of :mod:`service.auth.session`; a logout clears it.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Form, Query, Request, Response
from fastapi.responses import HTMLResponse

from service.auth.errors import LOGIN_PATH, CsrfRejected
from service.auth.login_links import LINK_PATH, LINK_TTL_S, login_link_user, redeem_login_link
from service.auth.service import principal_for_token
from service.auth.session import (
    DashboardUser,
    MaybeDashboardUser,
    check_csrf,
    clear_session_cookie,
    login_form_token,
    make_cookie,
    same_origin,
    session_key,
    set_session_cookie,
)
from service.db import ReadSessionDep, SessionDep, SettingsDep
from service.errors import page_redirect

LOGGED_OUT = "logged-out"  # the login form's ?notice= after a logout
NOTICES = {LOGGED_OUT: "You are logged out."}
LINK_FORM_COOKIE = "mapcampaign_login_form"
LINK_REFUSED = "This login link was used already, has expired or was never made here."


class RenderPage(Protocol):
    """The dashboard's page renderer: a template of its folder drawn with ``context`` (service.dashboard.router)."""

    def __call__(
        self, request: Request, name: str, context: dict[str, Any], *, user: Any = None, status_code: int = 200
    ) -> HTMLResponse: ...


def safe_next(target: str | None) -> str:
    """Only a path of this site: never another origin (``//host``, ``/\\host``, ``https://``)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def login_pages(render: RenderPage) -> APIRouter:
    """The routes ``/login`` (form and POST), :data:`LINK_PATH` (confirmation page and POST) and ``/logout``."""
    pages = APIRouter(include_in_schema=False)

    def link_refused(request: Request) -> HTMLResponse:
        context = {"next": "/", "error": LINK_REFUSED, "notice": "", "link_refused": True}
        return render(request, "login.html", context, status_code=401)

    @pages.get(LOGIN_PATH, response_class=HTMLResponse)
    def login_form(
        request: Request, user: MaybeDashboardUser, next: Annotated[str | None, Query(max_length=2_000)] = None
    ) -> Response:
        if user is not None:
            return page_redirect(safe_next(next))
        notice = NOTICES.get(request.query_params.get("notice", ""), "")
        return render(request, "login.html", {"next": safe_next(next), "error": "", "notice": notice})

    @pages.post(LOGIN_PATH, response_class=HTMLResponse)
    def login(
        request: Request,
        session: ReadSessionDep,
        settings: SettingsDep,
        token: Annotated[str, Form(max_length=500)] = "",
        next: Annotated[str, Form(max_length=2_000)] = "/",
    ) -> Response:
        if not same_origin(request):
            raise CsrfRejected("this login form was not sent by this dashboard")
        principal = principal_for_token(session=session, token=token.strip()) if token.strip() else None
        error = ""
        if principal is None:
            error = "That token is unknown or revoked. Paste the contents of a user token file."
        elif principal.kind != "user":
            error = "That is a worker token; log in with a user token (mapcampaign token create --user NAME)."
        if error or principal is None:
            context = {"next": safe_next(next), "error": error, "notice": ""}
            return render(request, "login.html", context, status_code=401)
        response = page_redirect(safe_next(next))
        cookie = make_cookie(session_key(request), principal=principal, max_age_s=settings.session_max_age_s)
        set_session_cookie(response, value=cookie, settings=settings)
        return response

    @pages.get(LINK_PATH, response_class=HTMLResponse)
    def confirm_login_link(
        request: Request,
        session: ReadSessionDep,
        settings: SettingsDep,
        user: MaybeDashboardUser,
        secret: Annotated[str, Query(max_length=200)] = "",
    ) -> Response:
        """A one-time login link (``mapcampaign up`` and ``mapcampaign login`` print one): a page naming the user
        the link logs in, whose button POSTs the secret. Opening the link spends nothing and sets no session, so
        a link from someone else cannot log a browser into their account unseen (login CSRF)."""
        link_user = login_link_user(session=session, secret=secret)
        if link_user is None:
            return link_refused(request)
        nonce = secrets.token_urlsafe(16)
        form_token = login_form_token(session_key(request), nonce)
        context = {"secret": secret, "link_user": link_user, "login_path": LINK_PATH, "form_token": form_token}
        response = render(request, "login_link.html", context, user=user)
        response.set_cookie(
            LINK_FORM_COOKIE,
            nonce,
            max_age=int(LINK_TTL_S),
            path=LINK_PATH,
            httponly=True,
            samesite="lax",
            secure=settings.cookie_secure,
        )
        return response

    @pages.post(LINK_PATH, response_class=HTMLResponse)
    def login_with_link(
        request: Request,
        session: SessionDep,
        settings: SettingsDep,
        secret: Annotated[str, Form(max_length=200)] = "",
        csrf_token: Annotated[str, Form(max_length=200)] = "",
    ) -> Response:
        """The confirmation page's button: log in as the link's user, once."""
        nonce = request.cookies.get(LINK_FORM_COOKIE, "")
        expected = login_form_token(session_key(request), nonce) if nonce else ""
        if not same_origin(request) or not expected or not hmac.compare_digest(csrf_token.encode(), expected.encode()):
            raise CsrfRejected("this login form was not sent by this dashboard; open the login link again")
        principal = redeem_login_link(session=session, secret=secret)
        if principal is None:
            return link_refused(request)
        session.commit()
        response = page_redirect("/")
        cookie = make_cookie(session_key(request), principal=principal, max_age_s=settings.session_max_age_s)
        set_session_cookie(response, value=cookie, settings=settings)
        response.delete_cookie(
            LINK_FORM_COOKIE, path=LINK_PATH, httponly=True, samesite="lax", secure=settings.cookie_secure
        )
        return response

    @pages.post("/logout")
    def logout(
        request: Request,
        user: DashboardUser,
        settings: SettingsDep,
        csrf_token: Annotated[str, Form(max_length=200)] = "",
    ) -> Response:
        check_csrf(request, user, csrf_token)
        response = page_redirect(f"{LOGIN_PATH}?notice={LOGGED_OUT}")
        clear_session_cookie(response, settings=settings)
        return response

    return pages
