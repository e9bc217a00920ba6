"""The CLI as a user runs it: ``mapcampaign`` subprocesses against a real ``mapcampaign serve`` (SQLite)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.live_service import LiveService, mapcampaign_command, start_live_service


def run_cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(mapcampaign_command(*args), env=env, check=False, capture_output=True, text=True, timeout=timeout)


def cli_env(service: LiveService, token: str) -> dict[str, str]:
    """What a user's shell would hold: the service and their token (the CLI's own variables)."""
    return {**service.env, "MAPCAMPAIGN_SERVER": service.url, "MAPCAMPAIGN_TOKEN": token}


def stdout_json(done: subprocess.CompletedProcess) -> Any:
    try:
        return json.loads(done.stdout)
    except ValueError as error:
        raise AssertionError(f"stdout is not JSON ({error}):\n{done.stdout}\nstderr:\n{done.stderr}") from None


def processes_using(data_dir: Path) -> list[str]:
    """Live processes started for this data folder (they inherit MAPCAMPAIGN_DATA_DIR): API, worker, Parsl,
    runners, mpiexec and ranks."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("MAPCAMPAIGN_DATA_DIR") == str(data_dir) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid} {' '.join(process.cmdline())[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


@pytest.fixture(scope="module")
def cli_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    service = start_live_service(tmp_path_factory.mktemp("cli-service"))
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def fresh_user(cli_service: LiveService, request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment of a new user with no campaigns yet."""
    name = "u" + str(abs(hash(request.node.nodeid)) % 10**9)
    return cli_env(cli_service, cli_service.create_token(name))


def drive_campaign(
    service: LiveService,
    campaign_id: int,
    *,
    fail_indexes: set[int] = frozenset(),
    name: str = "t",
    after_step: Callable[[], None] | None = None,
) -> None:
    """Play the worker (tests/support/fake_worker.py, over the real worker API) until ``campaign_id`` ends:
    plans are reported built, its realisations in ``fail_indexes`` fail (app_error) and the others succeed.
    Tasks of other campaigns in the shared service are failed on the way, so they never block the queue.
    ``after_step`` runs after each of the campaign's realisations ended (a watcher waits until it showed it)."""
    import time

    from tests.support.fake_worker import FakeWorker

    worker = FakeWorker(service.api_url, service.worker_token, name=f"fake-{name}")
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            tasks = worker.claim(1)
            if not tasks:
                return
            task = tasks[0]
            worker.start(task)
            if task["kind"] == "preprocess":
                worker.client.post(
                    f"/tasks/{task['task_id']}/plan-built",
                    json={"path": "/scratch/plan", "checksum": "sha256:0", "size_bytes": 1, "build_time_s": 0.1},
                ).raise_for_status()
            elif task["campaign_id"] == campaign_id and task["realization"] not in fail_indexes:
                worker.succeed(task, with_map=False)
            else:
                worker.fail(task, "app_error", exit_code=1, log_tail=f"realisation {task['realization']}\nTraceback: boom\n")
            if task.get("campaign_id") == campaign_id and after_step is not None:
                after_step()
        raise AssertionError(f"campaign {campaign_id} did not end within 120 s")
    finally:
        worker.close()
