from urllib.parse import urlencode

from service.errors import Forbidden, Unauthorized

LOGIN_PATH = "/login"  # the dashboard's login form (service.auth.pages)


class MissingToken(Unauthorized):
    code = "missing_token"


class InvalidToken(Unauthorized):
    code = "invalid_token"


class WrongTokenKind(Forbidden):
    code = "wrong_token_kind"


class LoginRequired(Unauthorized):
    """No valid session cookie: a page redirects to the login form (which comes back to ``next_path``), the
    pages' JSON under ``/ui`` answers 401."""

    code = "login_required"

    def __init__(self, next_path: str = "/"):
        super().__init__("log in to the dashboard first")
        self.headers = None  # a cookie session: no bearer challenge
        self.page_location = f"{LOGIN_PATH}?" + urlencode({"next": next_path})


class CsrfRejected(Forbidden):
    """A cookie-authenticated POST without a valid CSRF token, or from another origin."""

    code = "csrf_rejected"
