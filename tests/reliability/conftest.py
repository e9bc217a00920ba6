"""Reliability fixtures: a live service on PostgreSQL, database row counts, and the figures report.

Every test here runs against the real ``mapcampaign serve`` subprocess (tests/support/live_service.py)
on this session's PostgreSQL database unless it says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.reliability.figures import FIGURES, REPORT, report_text
from tests.support.databases import TABLES
from tests.support.live_service import LiveService, live_services

# The browser fixtures (Chromium through Playwright) for the escaping test.
from tests.browser.conftest import chromium, dash, page  # noqa: F401,E402


@pytest.fixture
def make_pg_service(pg_url: str, tmp_path: Path) -> Iterator[Callable[..., LiveService]]:
    """Factory of live services on this session's PostgreSQL database (emptied before and after)."""
    with live_services(tmp_path, pg_url) as make:
        yield make


@pytest.fixture
def pg_service(make_pg_service: Callable[..., LiveService]) -> LiveService:
    return make_pg_service()


def row_counts(url: str) -> dict[str, int]:
    """Rows in every table of the service: what a refused request must leave unchanged."""
    with psycopg.connect(url, autocommit=True) as connection:
        return {table: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TABLES}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    text = report_text()
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text + "\n")
    terminalreporter.section("reliability figures")
    terminalreporter.write_line(text)
    terminalreporter.write_line(f"(also written to {REPORT.relative_to(REPORT.parents[2])})")
