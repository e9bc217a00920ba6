"""Fixtures shared by every test folder: the two databases, and a live ``mapcampaign serve``.

* ``database_kind`` is parametrised over ``sqlite`` and ``postgresql``; a test
  that takes it (or ``database_url`` / ``live_service``) runs on both.
* PostgreSQL: one fresh, uniquely named database per test session on
  127.0.0.1:5432 (user postgres), migrated once, emptied after each test,
  dropped at the end. Unreachable PostgreSQL fails the test.
* ``live_service``: a real ``mapcampaign serve`` subprocess on a free port with a
  temporary data folder; see tests/support/live_service.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.databases import (
    create_pg_database,
    drop_pg_database,
    empty_pg_tables,
    fresh_sqlite_copy,
    migrated_sqlite_template,
)
from tests.support.figures import FIGURES, REPORT, report_text
from tests.support.live_service import LiveService, live_services

DATABASE_KINDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of this session's PostgreSQL database, migrated to the latest schema."""
    from service.migrate import upgrade

    url = create_pg_database()
    try:
        upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migrated_sqlite_template(tmp_path_factory.mktemp("sqlite-template"))


@pytest.fixture(params=DATABASE_KINDS)
def database_kind(request: pytest.FixtureRequest) -> str:
    if request.param == "postgresql":
        request.applymarker(pytest.mark.postgres)
    return request.param


@pytest.fixture
def database_url(database_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database of the kind under test."""
    if database_kind == "sqlite":
        yield fresh_sqlite_copy(request.getfixturevalue("sqlite_template"), tmp_path / "db")
        return
    url = request.getfixturevalue("pg_url")
    empty_pg_tables(url)
    try:
        yield url
    finally:
        empty_pg_tables(url)


@pytest.fixture
def make_live_service(
    database_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., LiveService]]:
    """Factory: ``make_live_service(env={"MAPCAMPAIGN_LEASE_S": "1"})`` starts a service on the database under test.

    SQLite uses the embedded default (tokens made on first start); PostgreSQL uses this
    session's database. Every service started is stopped at the end of the test.
    """
    pg = request.getfixturevalue("pg_url") if database_kind == "postgresql" else None
    with live_services(tmp_path, pg) as make:
        yield make


@pytest.fixture
def live_service(make_live_service: Callable[..., LiveService]) -> LiveService:
    """A running ``mapcampaign serve`` with ``user_token`` and ``worker_token`` of user ``local``."""
    return make_live_service()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    text = report_text()
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text + "\n")
    terminalreporter.section("reliability figures")
    terminalreporter.write_line(text)
    terminalreporter.write_line(f"(also written to {REPORT.relative_to(REPORT.parents[2])})")


# The quick tier (scripts/test --quick) leaves out what starts processes or servers. Tests that do so
# through these fixtures, modules or names are marked here, so their files need not know about tiers.
LIVE_FIXTURES = {"live_service", "make_live_service"}
MPI_FIXTURES = {"mapped"}  # tests/api/test_products_api.py: realisations run under mpiexec -n 2
LIVE_MODULES = {"test_live_service.py"}  # starts `mapcampaign serve` itself
MPI_TEST_NAMES = {"test_bench_hybrid_runs_every_split_under_mpiexec"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & LIVE_FIXTURES or item.path.name in LIVE_MODULES:
            item.add_marker(pytest.mark.live)
        if fixtures & MPI_FIXTURES or getattr(item, "originalname", "") in MPI_TEST_NAMES:
            item.add_marker(pytest.mark.mpi)
        # database_kind marks its PostgreSQL case only when the fixture runs, too late for -m selection
        callspec = getattr(item, "callspec", None)
        if "pg_url" in fixtures or (callspec is not None and callspec.params.get("database_kind") == "postgresql"):
            item.add_marker(pytest.mark.postgres)
