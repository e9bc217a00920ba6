"""Browser fixtures: Debian's Chromium driven by Playwright against a live ``mapcampaign serve``.

Chromium is ``/usr/bin/chromium`` (``scripts/install-system-deps`` installs it;
never ``playwright install``), headless, with the flags that keep it off the
network. Playwright gives every launch a fresh temporary profile.

``dash`` is a live service (the ``live_service`` fixture) with helpers to log
in, create campaigns and play a worker. ``page`` is a new browser context per
test that fails the test on a JavaScript error, a Content Security Policy
violation, or any request to another origin (the dashboard must work offline). Screenshots go to ``artifacts/screenshots/`` (gitignored).

Each file runs on one database (``on_database`` in its ``pytestmark``), half of them on each: the
in-process dashboard tests of tests/api run every page's queries on both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_worker import FakeWorker
from tests.support.live_service import REPO, LiveService
from tests.support.service_helpers import spec_data

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
VIEWPORT = {"width": 1360, "height": 900}


# Module scope, not package: tests/browser is no Python package, so a "package" fixture would live to
# the end of the session, and Playwright's sync API keeps an asyncio loop running in the main thread
# while it is started -- every later asyncio.run() (load test, anyio tests) would then fail.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-system-deps as root (apt chromium)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class PageWatch:
    """What a page did that a test must not let pass: script errors, policy violations, foreign requests."""

    origin: str
    errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)

    def on_console(self, message: Any) -> None:
        if message.type == "error" and ("Content Security Policy" in message.text or "Refused to" in message.text):
            self.errors.append(f"console: {message.text}")

    def on_page_error(self, error: Any) -> None:
        self.errors.append(f"page error: {error}")

    def on_request(self, request: Any) -> None:
        url = request.url
        if not url.startswith((self.origin + "/", "data:", "blob:", "about:")):
            self.foreign_requests.append(url)


@dataclass
class Dashboard:
    service: LiveService
    database_kind: str
    workers: list[FakeWorker] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.service.url

    def api(self, token: str | None = None) -> httpx.Client:
        return self.service.client(token or self.service.user_token)

    def create_campaign(self, token: str | None = None, **changes: Any) -> dict[str, Any]:
        with self.api(token) as client:
            answer = client.post("/campaigns", json=spec_data(**changes))
        assert answer.status_code == 201, answer.text
        return answer.json()

    def campaign(self, campaign_id: int, token: str | None = None) -> dict[str, Any]:
        with self.api(token) as client:
            answer = client.get(f"/campaigns/{campaign_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def worker(self, name: str = "w1", **kwargs: Any) -> FakeWorker:
        worker = FakeWorker(self.service.api_url, self.service.worker_token, name=name, **kwargs)
        self.workers.append(worker)
        return worker

    def login(self, page: Any, token: str | None = None) -> None:
        page.goto(self.url + "/login")
        page.fill("#token", token or self.service.user_token)
        page.click("form[action='/login'] button[type=submit]")
        page.wait_for_url(self.url + "/")

    def screenshot(self, page: Any, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}-{self.database_kind}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def dash(live_service: LiveService, database_kind: str) -> Iterator[Dashboard]:
    dashboard = Dashboard(service=live_service, database_kind=database_kind)
    try:
        yield dashboard
    finally:
        for worker in dashboard.workers:
            worker.close()


@pytest.fixture
def page(chromium: Any, dash: Dashboard) -> Iterator[Any]:
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(15_000)
    page = context.new_page()
    watch = PageWatch(origin=dash.url)
    page.on("console", watch.on_console)
    page.on("pageerror", watch.on_page_error)
    page.on("request", watch.on_request)
    page.watch = watch
    try:
        yield page
    finally:
        context.close()
    assert not watch.errors, watch.errors
    assert not watch.foreign_requests, f"the dashboard reached outside the service: {watch.foreign_requests}"


def new_page(chromium: Any, dash: Dashboard) -> Any:
    """A second, separate browser (own cookies), e.g. for another user; the caller closes its context."""
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(15_000)
    return context.new_page()


def texts(locator: Any) -> list[str]:
    return [re.sub(r"\s+", " ", text).strip() for text in locator.all_text_contents()]
