"""Start a real ``mapcampaign serve`` in a subprocess, on a free port, with its own data folder.

Later tests (worker, CLI, browser) reuse this::

    from tests.support.live_service import start_live_service

    service = start_live_service(tmp_path / "svc")                        # embedded SQLite
    service = start_live_service(tmp_path / "svc", database_url=pg_url)   # PostgreSQL (migrated here)
    with service.client(service.user_token) as client:
        client.post("/campaigns", json=spec)
    service.stop()

or take the ``live_service`` fixture from ``tests/conftest.py`` (parametrised over
both databases). ``service.url`` is the root (``/healthz``, ``/metrics``);
``service.api_url`` ends in ``/api/v1``; ``service.env`` holds the
``MAPCAMPAIGN_*`` variables a worker or CLI subprocess needs to reach it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks._support import (
    MAPCAMPAIGN,
    REPO,
    LiveService,
    free_port,
    is_healthy,
    mapcampaign_command,
    service_env,
    start_live_service,
)
from tests.support.databases import empty_pg_tables

__all__ = [
    "MAPCAMPAIGN",
    "REPO",
    "LiveService",
    "free_port",
    "is_healthy",
    "live_services",
    "mapcampaign_command",
    "service_env",
    "start_live_service",
]


@contextmanager
def live_services(base_dir: Path, database_url: str | None) -> Iterator[Callable[..., LiveService]]:
    """Factory ``make(env=None)`` of live services under ``base_dir`` on one database; every one stopped at the end.

    ``database_url=None`` is the embedded SQLite of each service; a PostgreSQL database is emptied
    before the first service starts and after the last one stops.
    """
    started: list[LiveService] = []
    if database_url:
        empty_pg_tables(database_url)

    def make(env: dict[str, str] | None = None) -> LiveService:
        service = start_live_service(base_dir / f"service-{len(started)}", database_url, env=env)
        started.append(service)
        return service

    try:
        yield make
    finally:
        for service in started:
            service.stop()
        if database_url:
            empty_pg_tables(database_url)
