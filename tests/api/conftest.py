"""In-process service fixtures: the real app (lifespan included) on a real database, driven by TestClient.

``make_api(**settings)`` builds an app with extra settings (a short lease, a small
body limit...); ``api`` is one with the defaults. Each has tokens for two users
(alice, bob) and a worker token for each. The reaper is left to the test
(``api.reap()``), so nothing happens behind a test's back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from schemas.api import API_PREFIX
from service import db
from service.app import create_app
from service.auth.service import create_token
from service.config import Settings
from service.queue.reaper import Reaped, reap_expired
from tests.support.service_helpers import auth, spec_data


class Api:
    def __init__(self, client: TestClient, app: FastAPI, settings: Settings):
        self.client = client
        self.app = app
        self.settings = settings
        self.database = app.state.database
        with self.database.session() as session:
            self.alice = create_token(session=session, user_name="alice", kind="user")
            self.alice_worker = create_token(session=session, user_name="alice", kind="worker")
            self.bob = create_token(session=session, user_name="bob", kind="user")
            self.bob_worker = create_token(session=session, user_name="bob", kind="worker")
            session.commit()

    def request(self, method: str, path: str, token: str | None, **kwargs: Any):
        headers = {**(auth(token) if token else {}), **kwargs.pop("headers", {})}
        return self.client.request(method, API_PREFIX + path, headers=headers, **kwargs)

    def get(self, path: str, token: str | None = None, **kwargs: Any):
        return self.request("GET", path, token if token is not None else self.alice, **kwargs)

    def post(self, path: str, token: str | None = None, **kwargs: Any):
        return self.request("POST", path, token if token is not None else self.alice, **kwargs)

    def wpost(self, path: str, token: str | None = None, **kwargs: Any):
        return self.request("POST", path, token if token is not None else self.alice_worker, **kwargs)

    # ------------------------------------------------------------------ user steps

    def create(self, token: str | None = None, **changes: Any) -> dict[str, Any]:
        answer = self.post("/campaigns", token, json=spec_data(**changes))
        assert answer.status_code == 201, answer.text
        return answer.json()

    def campaign(self, campaign_id: int, token: str | None = None) -> dict[str, Any]:
        answer = self.get(f"/campaigns/{campaign_id}", token)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def realization(self, campaign_id: int, index: int) -> dict[str, Any]:
        answer = self.get(f"/campaigns/{campaign_id}/realizations/{index}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    # ------------------------------------------------------------------ worker steps

    def register(self, name: str = "w1", site: str = "local", token: str | None = None, capacity: int = 4) -> int:
        answer = self.wpost(
            "/workers", token, json={"name": name, "site": site, "host": f"{name}.example", "capacity": capacity}
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["id"]

    def claim(self, worker_id: int, max_tasks: int = 1, token: str | None = None) -> list[dict[str, Any]]:
        answer = self.wpost(f"/workers/{worker_id}/claim", token, json={"max_tasks": max_tasks})
        assert answer.status_code == 200, answer.text
        return answer.json()["tasks"]

    def plan_built(self, task_id: str, token: str | None = None, path: str = "/plans/p.h5"):
        return self.wpost(
            f"/tasks/{task_id}/plan-built",
            token,
            json={"path": path, "checksum": "sha256:abc", "size_bytes": 123, "build_time_s": 0.5},
        )

    def build_plan(self, worker_id: int, token: str | None = None) -> dict[str, Any]:
        """Claim one task, which must be a plan build, and report the plan built; return the task."""
        tasks = self.claim(worker_id, max_tasks=1, token=token)
        assert [task["kind"] for task in tasks] == ["preprocess"], tasks
        assert self.plan_built(tasks[0]["task_id"], token).status_code == 200
        return tasks[0]

    def fail(self, task_id: str, failure_class: str = "app_error", exit_code: int | None = 1, token: str | None = None):
        return self.wpost(
            f"/tasks/{task_id}/failed",
            token,
            json={"failure_class": failure_class, "exit_code": exit_code, "log_tail": "Traceback: boom"},
        )

    def succeed(self, task: dict[str, Any], products: list[dict[str, Any]] | None = None, token: str | None = None):
        from tests.support.service_helpers import result_for

        result = result_for(task["spec"], task["realization"], products)
        return self.wpost(f"/tasks/{task['task_id']}/succeeded", token, json={"result": result})

    def reap(self) -> Reaped:
        return reap_expired(database=self.database, settings=self.settings)


class MovableClock:
    """The service's clock in a test: real time plus whatever :meth:`advance` added."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return db.system_clock() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> MovableClock:
    """Move the in-process service's time: ``clock.advance(lease_s + 1)`` expires every lease held now."""
    movable = MovableClock()
    monkeypatch.setattr(db, "clock", movable)
    return movable


@pytest.fixture
def make_api(database_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    clients: list[TestClient] = []

    def make(configure: Callable[[FastAPI], None] | None = None, **overrides: Any) -> Api:
        settings = Settings(
            data_dir=tmp_path / f"data-{len(clients)}",
            database_url=database_url,
            reaper_interval_s=3_600,
            auto_migrate=False,
            **overrides,
        )
        app = create_app(settings)
        if configure is not None:
            configure(app)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return Api(client, app, settings)

    try:
        yield make
    finally:
        for client in reversed(clients):
            client.__exit__(None, None, None)


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()
