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

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
MAPCAMPAIGN = Path(sys.executable).with_name("mapcampaign")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mapcampaign_command(*args: str) -> list[str]:
    if MAPCAMPAIGN.exists():
        return [str(MAPCAMPAIGN), *args]
    return [sys.executable, "-c", "from service.cli import main; main()", *args]


@dataclass
class LiveService:
    url: str
    data_dir: Path
    database_url: str | None
    user_token: str
    worker_token: str
    env: dict[str, str]
    process: subprocess.Popen
    log_path: Path
    extra_tokens: dict[str, str] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return self.url + "/api/v1"

    def client(self, token: str | None = None, *, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout)

    def run_cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            mapcampaign_command(*args), env=self.env, capture_output=True, text=True, check=check, timeout=120
        )

    def create_token(self, user: str, *, worker: bool = False) -> str:
        """A new token made with ``mapcampaign token create`` against the service's database."""
        args = ["token", "create", "--user", user] + (["--worker"] if worker else [])
        return self.run_cli(*args).stdout.strip()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def service_env(data_dir: Path, port: int, database_url: str | None, extra: dict[str, str] | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAPCAMPAIGN_")}
    env.update(
        {
            "MAPCAMPAIGN_DATA_DIR": str(data_dir),
            "MAPCAMPAIGN_HOST": "127.0.0.1",
            "MAPCAMPAIGN_PORT": str(port),
            "MAPCAMPAIGN_LOG_LEVEL": "warning",
        }
    )
    if database_url is not None:
        env["MAPCAMPAIGN_DATABASE_URL"] = database_url
    env.update(extra or {})
    return env


def start_live_service(
    data_dir: Path, database_url: str | None = None, *, env: dict[str, str] | None = None, startup_timeout: float = 60.0
) -> LiveService:
    """Start ``mapcampaign serve`` and wait until /healthz answers.

    ``database_url=None`` is the embedded default (SQLite in ``data_dir``, tokens made on first start);
    any other URL is migrated with ``mapcampaign db upgrade`` and gets user ``local`` tokens from
    ``mapcampaign token create``.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    environment = service_env(data_dir, port, database_url, env)
    user_token = worker_token = ""
    if database_url is not None:
        for args in (
            ["db", "upgrade"],
            ["token", "create", "--user", "local"],
            ["token", "create", "--user", "local", "--worker"],
        ):
            done = subprocess.run(
                mapcampaign_command(*args), env=environment, check=False, capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                raise RuntimeError(f"mapcampaign {' '.join(args)} failed: {done.stderr}")
            if args[0] == "token":
                if "--worker" in args:
                    worker_token = done.stdout.strip()
                else:
                    user_token = done.stdout.strip()
    log_path = data_dir / f"serve-{port}.log"
    with open(log_path, "wb") as log_file:  # the child keeps its own descriptor
        process = subprocess.Popen(
            mapcampaign_command("serve"),
            env=environment,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    service = LiveService(
        url=url,
        data_dir=data_dir,
        database_url=database_url,
        user_token=user_token,
        worker_token=worker_token,
        env=environment,
        process=process,
        log_path=log_path,
    )
    deadline = time.monotonic() + startup_timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"mapcampaign serve exited with {process.returncode}:\n{service.log_tail()}")
        if is_healthy(url):
            break
        if time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"mapcampaign serve did not answer within {startup_timeout} s:\n{service.log_tail()}")
        time.sleep(0.1)
    if database_url is None:
        tokens = data_dir / "tokens"
        service.user_token = (tokens / "local-user.token").read_text().strip()
        service.worker_token = (tokens / "local-worker.token").read_text().strip()
    return service


def is_healthy(url: str) -> bool:
    """``GET url/healthz`` answers 200 (False while the service is not up or not listening)."""
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def live_services(base_dir: Path, database_url: str | None) -> Iterator[Callable[..., LiveService]]:
    """Factory ``make(env=None)`` of live services under ``base_dir`` on one database; every one stopped at the end.

    ``database_url=None`` is the embedded SQLite of each service; a PostgreSQL database is emptied
    before the first service starts and after the last one stops.
    """
    from tests.support.databases import empty_pg_tables

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
