"""Reliability fixtures: a live service on PostgreSQL and database row counts.

Every test here runs against the real ``mapcampaign serve`` subprocess (tests/support/live_service.py)
on this session's PostgreSQL database unless it says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

# The browser fixtures (Chromium through Playwright) for the escaping test.
from tests.browser.conftest import chromium, dash, page  # noqa: F401
from tests.support.databases import TABLES
from tests.support.live_service import LiveService, live_services


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
