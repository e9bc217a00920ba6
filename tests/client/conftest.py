"""The Python client against a live ``mapcampaign serve``, on SQLite and PostgreSQL.

One service per database serves the whole module (``database_kind`` and ``live_service`` are module-scoped
here): starting one per test would cost more than the tests. Tests stay apart by working only on the
campaigns they submit; what a test leaves unfinished is cancelled after it, so the queue is empty for
the next. ``campaign_runner`` plays the worker (tests/support/fake_worker.py, over the real worker API).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

import mapcampaign
from mapcampaign.errors import Conflict
from schemas.api import ARTIFACT_SHA256_HEADER
from schemas.result import SPECTRA
from tests.conftest import DATABASE_KINDS
from tests.support.fake_worker import FakeWorker, fabricated_result, iqu_map_fits
from tests.support.live_service import LiveService, live_services
from tests.support.service_helpers import spec_data

ELL_MIN = [2, 12, 22]
ELL_MAX = [11, 21, 31]


@pytest.fixture(scope="module", params=DATABASE_KINDS)
def database_kind(request: pytest.FixtureRequest) -> str:
    """tests/conftest.py's, for a whole module (the collection hook marks the PostgreSQL case ``postgres``)."""
    return request.param


@pytest.fixture(scope="module")
def live_service(
    database_kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveService]:
    """A running ``mapcampaign serve`` on the database under test, for the whole module."""
    pg = request.getfixturevalue("pg_url") if database_kind == "postgresql" else None
    with live_services(tmp_path_factory.mktemp(f"client-{database_kind}"), pg) as make:
        yield make()


@pytest.fixture
def client(live_service: LiveService) -> Iterator[mapcampaign.Client]:
    """User ``local``'s client; campaigns the test left unfinished are cancelled after it."""
    with mapcampaign.Client(server=live_service.url, token=live_service.user_token, timeout=30.0) as user_client:
        yield user_client
        for campaign in user_client.list(state="queued") + user_client.list(state="running"):
            try:
                user_client.cancel(campaign.id, reason="left by a test")
            except Conflict:
                pass  # it ended in between


def small_spec(name: str, realizations: int = 2, **changes: Any) -> dict[str, Any]:
    """The demo spec with a test's own name and few realisations, one attempt each unless changed."""
    return spec_data(name=name, realizations=realizations, max_attempts=changes.pop("max_attempts", 1), **changes)


def spectra_record(index: int) -> dict[str, Any]:
    """Binned spectra of realisation ``index``: every spectrum ``(index + 1) * (k + 1) * 1e-12`` K^2 in bin k."""
    values = [(index + 1) * (k + 1) * 1e-12 for k in range(len(ELL_MIN))]
    return {
        "ell_min": ELL_MIN,
        "ell_max": ELL_MAX,
        "lmax": 47,
        "ell_bin_width": 10,
        "cl": {name: values for name in SPECTRA},
        "w2": 0.5,
        "fsky": 0.6,
        "apodization_deg": 5.0,
        "min_hits": 1,
        "signal": True,
        "noise": True,
    }


class CampaignRunner:
    """Plays the worker over the real worker API: builds plans, and ends the realisations it is told to."""

    def __init__(self, service: LiveService, name: str):
        self.worker = FakeWorker(service.api_url, service.worker_token, name=name)

    def close(self) -> None:
        self.worker.close()

    def next_task(self) -> dict[str, Any]:
        """The next realisation task, after reporting any plan it needs built."""
        task = self.worker.claim_one()
        if task["kind"] == "preprocess":
            self.worker.start(task)
            self.worker.client.post(
                f"/tasks/{task['task_id']}/plan-built",
                json={"path": "/scratch/plan", "checksum": "sha256:0", "size_bytes": 1, "build_time_s": 0.1},
            ).raise_for_status()
            task = self.worker.claim_one()
        self.worker.start(task)
        return task

    def succeed(self, task: dict[str, Any], *, with_map: bool = False, with_spectra: bool = False) -> None:
        """Report ``task`` succeeded, with the fake worker's I/Q/U map (seed ``index % 4``) and spectra if asked."""
        products = []
        if with_map:
            payload = iqu_map_fits(seed=task["realization"] % 4)
            digest = hashlib.sha256(payload).hexdigest()
            self.worker.client.put(
                f"/tasks/{task['task_id']}/artifacts/map_iqu.fits",
                content=payload,
                headers={ARTIFACT_SHA256_HEADER: digest, "Content-Type": "application/octet-stream"},
            ).raise_for_status()
            products.append({"name": "iqu", "path": "map_iqu.fits", "sha256": digest, "size_bytes": len(payload)})
        result = fabricated_result(task["spec"], task["realization"], products)
        if with_spectra:
            result["spectra"] = spectra_record(task["realization"])
        self.worker.client.post(f"/tasks/{task['task_id']}/succeeded", json={"result": result}).raise_for_status()

    def run_one(self, *, fail: bool = False, with_map: bool = False, with_spectra: bool = False) -> dict[str, Any]:
        """Claim the next realisation and end it (failed with a log tail, or succeeded); returns its task."""
        task = self.next_task()
        if fail:
            self.worker.fail(task, "app_error", exit_code=1, log_tail=f"realisation {task['realization']}\nboom\n")
        else:
            self.succeed(task, with_map=with_map, with_spectra=with_spectra)
        return task


@pytest.fixture
def campaign_runner(live_service: LiveService, request: pytest.FixtureRequest) -> Iterator[CampaignRunner]:
    runner = CampaignRunner(live_service, name="runner-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8])
    yield runner
    runner.close()
