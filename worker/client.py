"""The service's worker protocol over HTTP (``schemas.api`` models in and out).

Connection errors and 502/503/504 answers are retried with backoff for up to
``retry_s`` seconds (:mod:`campaignlib.transport`, shared with the user's client);
other errors raise :class:`ServiceError` at once. A 409
is :class:`TaskGone`: the task is no longer this worker's (lease expired and
reaped, campaign cancelled, result already accepted), so a report about it
changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaignlib import transport
from schemas.api import (
    ARTIFACT_SHA256_HEADER,
    ClaimAnswer,
    ClaimRequest,
    HeartbeatAnswer,
    HeartbeatRequest,
    KeptFileFailure,
    KeptFileRequest,
    KeptFileRequests,
    PlanBuilt,
    PlanInvalid,
    SiteSumsReceipt,
    TaskFailed,
    TaskStarted,
    TaskSucceeded,
    WorkerInfo,
    WorkerRegistration,
)
from schemas.result import RealizationResult

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("mapcampaign.worker")

RETRY_STATUS = transport.RETRY_STATUS


class ServiceError(Exception):
    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class TaskGone(ServiceError):
    """409, or 404 ``task_not_found`` (its campaign was deleted): the task is no longer this worker's;
    nothing to report any more."""


class NotAuthorized(ServiceError):
    """401/403: the token is wrong, or not a worker token."""


STARTED_RETRY_S = 30.0
CLAIM_TIMEOUT_S = 90.0


def _file_chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(size):
            yield chunk


class ServiceClient:
    def __init__(self, api_url: str, token: str, *, timeout_s: float = 30.0, retry_s: float = 60.0):
        self.api_url = api_url.rstrip("/")
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self._http = transport.http_client(
            self.api_url, token, timeout_s=timeout_s, user_agent="mapcampaign-worker"
        )

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ transport (campaignlib.transport)

    def _request(self, method: str, path: str, *, retry_s: float | None = None, **kwargs: Any) -> httpx.Response:
        try:
            answer = transport.send(
                self._http, method, path, retry_s=self.retry_s if retry_s is None else retry_s, log=log, **kwargs
            )
        except transport.Unreachable as error:
            raise ServiceError(str(error)) from None
        return self._checked(answer, method, path)

    @staticmethod
    def _checked(answer: httpx.Response, method: str, path: str) -> httpx.Response:
        if answer.status_code < 400:
            return answer
        detail, code = transport.error_body(answer)
        message = f"{method} {path}: HTTP {answer.status_code}: {detail}"
        if answer.status_code == 409 or (answer.status_code == 404 and code == "task_not_found"):
            raise TaskGone(message, status=answer.status_code, code=code)
        if answer.status_code in (401, 403):
            raise NotAuthorized(message, status=answer.status_code, code=code)
        raise ServiceError(message, status=answer.status_code, code=code)

    def _post(self, path: str, model: Any | None = None, **kwargs: Any) -> httpx.Response:
        payload = model.model_dump(mode="json") if model is not None else None
        return self._request("POST", path, json=payload, **kwargs)

    # ------------------------------------------------------------------ protocol

    def register(self, registration: WorkerRegistration, *, retry_s: float | None = None) -> WorkerInfo:
        return WorkerInfo.model_validate(self._post("/workers", registration, retry_s=retry_s).json())

    def claim(self, worker_id: int, max_tasks: int) -> ClaimAnswer:
        # A claim the service commits but whose answer the worker stops waiting for strands its tasks until
        # their leases expire: wait well past the service's admission queue (30 s) before giving up.
        answer = self._post(
            f"/workers/{worker_id}/claim",
            ClaimRequest(max_tasks=max_tasks),
            retry_s=0,
            timeout=max(self.timeout_s, CLAIM_TIMEOUT_S),
        )
        return ClaimAnswer.model_validate(answer.json())

    def heartbeat(self, worker_id: int, running: list[str]) -> HeartbeatAnswer:
        answer = self._post(f"/workers/{worker_id}/heartbeat", HeartbeatRequest(running=running), retry_s=0)
        return HeartbeatAnswer.model_validate(answer.json())

    def started(self, task_id: str, report: TaskStarted) -> None:
        # Briefly: the main loop sends it, and the task's final report carries the news anyway.
        self._post(f"/tasks/{task_id}/started", report, retry_s=min(self.retry_s, STARTED_RETRY_S))

    def upload(self, task_id: str, name: str, path: Path, sha256: str) -> None:
        """PUT one product file, streamed in 1 MiB pieces, with its SHA-256 for the service to check."""
        size = path.stat().st_size
        self._request(
            "PUT",
            f"/tasks/{task_id}/artifacts/{name}",
            content=lambda: _file_chunks(path),
            headers={
                ARTIFACT_SHA256_HEADER: sha256,
                "Content-Type": "application/octet-stream",
                "Content-Length": str(size),
            },
        )

    def put_map_sums(self, worker_id: int, campaign_id: int, path: Path) -> SiteSumsReceipt:
        """PUT the site's partial map sums of a campaign (:mod:`campaignlib.sitesums`), streamed in 1 MiB pieces."""
        answer = self._request(
            "PUT",
            f"/workers/{worker_id}/campaigns/{campaign_id}/map-sums",
            content=lambda: _file_chunks(path),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(path.stat().st_size)},
        )
        return SiteSumsReceipt.model_validate(answer.json())

    def kept_file_requests(self, worker_id: int) -> KeptFileRequests:
        """The kept files of this site the service was asked for (``GET /workers/{id}/fetches``)."""
        return KeptFileRequests.model_validate(self._request("GET", f"/workers/{worker_id}/fetches", retry_s=0).json())

    def send_kept_file(self, worker_id: int, request: KeptFileRequest, path: Path) -> None:
        """PUT a requested kept file, streamed in 1 MiB pieces; the service checks its size and SHA-256."""
        self._request(
            "PUT",
            f"/workers/{worker_id}/fetches/{request.campaign_id}/{request.realization}/{request.role}",
            content=lambda: _file_chunks(path),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(path.stat().st_size)},
        )

    def kept_file_failed(self, worker_id: int, request: KeptFileRequest, reason: str) -> None:
        self._post(
            f"/workers/{worker_id}/fetches/{request.campaign_id}/{request.realization}/{request.role}/failed",
            KeptFileFailure(reason=reason[:1_000]),
        )

    def instrument_file(self, sha256: str) -> bytes:
        """The bytes of a file uploaded to the service (``GET /instrument-files/{sha256}``)."""
        return self._request("GET", f"/instrument-files/{sha256}").content

    def succeeded(self, task_id: str, result: RealizationResult) -> None:
        self._post(f"/tasks/{task_id}/succeeded", TaskSucceeded(result=result))

    def plan_built(self, task_id: str, report: PlanBuilt) -> None:
        self._post(f"/tasks/{task_id}/plan-built", report)

    def failed(self, task_id: str, report: TaskFailed) -> None:
        self._post(f"/tasks/{task_id}/failed", report)

    def plan_invalid(self, plan_id: int, report: PlanInvalid) -> None:
        self._post(f"/plans/{plan_id}/invalid", report)
