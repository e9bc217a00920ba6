"""service.errors decides once whether an error is the API's JSON or the dashboard's page, and keeps each shape."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.testclient import TestClient

from service.auth.errors import InvalidToken, LoginRequired
from service.errors import NotFound, install_error_handlers

JSON_ONLY = {"Accept": "application/json"}
BROWSER = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


async def page(request: Request, status_code: int, detail: str) -> HTMLResponse:
    return HTMLResponse(f"<p>{status_code}: {detail}</p>", status_code=status_code)


def make_app(*, with_pages: bool = True) -> TestClient:
    app = FastAPI()
    install_error_handlers(app, error_page=page if with_pages else None)
    api = APIRouter(prefix="/api/v1")
    dashboard = APIRouter(include_in_schema=False)

    @api.get("/thing")
    def api_thing() -> None:
        raise NotFound("no thing")

    @app.get("/healthz")
    def operations() -> None:
        raise InvalidToken("bad token")

    @dashboard.get("/thing")
    def page_thing() -> None:
        raise NotFound("no thing")

    @dashboard.get("/ui/thing")
    def ui_thing() -> None:
        raise LoginRequired(next_path="/thing")

    @dashboard.get("/private")
    def private() -> None:
        raise LoginRequired(next_path="/private?x=1")

    app.include_router(api)
    app.include_router(dashboard)
    return TestClient(app)


def test_the_api_and_the_documented_endpoints_answer_json_even_to_a_browser():
    client = make_app()
    answer = client.get("/api/v1/thing", headers=BROWSER)
    assert answer.status_code == 404 and answer.json() == {"detail": "no thing", "code": "not_found"}
    answer = client.get("/healthz", headers=BROWSER)
    assert answer.status_code == 401 and answer.json()["code"] == "invalid_token"
    assert answer.headers["www-authenticate"] == "Bearer"
    assert client.get("/api/v1/nowhere", headers=BROWSER).json()["code"] == "not_found"


def test_a_dashboard_address_answers_a_page_unless_json_only_is_asked():
    client = make_app()
    for headers in (BROWSER, {}):
        answer = client.get("/thing", headers=headers)
        assert answer.status_code == 404 and answer.text == "<p>404: no thing</p>"
    answer = client.get("/thing", headers=JSON_ONLY)
    assert answer.status_code == 404 and answer.json()["code"] == "not_found"
    assert client.get("/nowhere", headers=BROWSER).text == "<p>404: There is no page at this address.</p>"


def test_without_a_session_a_page_goes_to_the_login_form_and_the_ui_json_says_401():
    client = make_app()
    answer = client.get("/private", headers=BROWSER, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/login?next=%2Fprivate%3Fx%3D1"
    assert answer.headers["cache-control"] == "no-store"
    answer = client.get("/ui/thing", headers=BROWSER)
    assert answer.status_code == 401 and answer.json() == {"detail": "log in to the dashboard first", "code": "login_required"}
    assert "www-authenticate" not in answer.headers  # a cookie session: no bearer challenge


def test_without_an_error_page_everything_is_json():
    client = make_app(with_pages=False)
    assert client.get("/thing", headers=BROWSER).json()["code"] == "not_found"
    assert client.get("/private", headers=BROWSER, follow_redirects=False).status_code == 401
