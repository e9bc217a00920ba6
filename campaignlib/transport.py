"""The HTTP transport every client of the REST API shares: the user's :class:`mapcampaign.Client` (and the
CLI on it) and the worker's protocol client (:mod:`worker.client`).

One place for what must not drift between them: the bearer-token header, the timeouts (a short connect
timeout within the request timeout), which failures are worth another try (no answer, 502/503/504) and
with what backoff, and how an error answer reads (``{"detail": ..., "code": ...}`` or plain text).
Each client maps the result onto its own exceptions.

httpx is imported when a client is made, not with this module: ``import mapcampaign`` stays light.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

# Answers a retry can turn into a success: a proxy or the service's admission queue (503) said "not now".
RETRY_STATUS = frozenset({502, 503, 504})
CONNECT_TIMEOUT_S = 10.0
FIRST_PAUSE_S = 0.2
LONGEST_PAUSE_S = 10.0


class Unreachable(Exception):
    """No usable answer within the retry budget: ``problem`` is the last transport error or status."""

    def __init__(self, message: str, problem: str):
        super().__init__(message)
        self.problem = problem


def http_client(
    base_url: str,
    token: str,
    *,
    timeout_s: float,
    user_agent: str | None = None,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """An httpx client on ``base_url`` (the API root, ``.../api/v1``) that sends ``token`` as a bearer token."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    if user_agent:
        headers["User-Agent"] = user_agent
    return httpx.Client(
        base_url=base_url.rstrip("/"),
        headers=headers,
        timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
        transport=transport,
    )


def send(
    http: httpx.Client,
    method: str,
    path: str,
    *,
    retry_s: float = 0.0,
    log: logging.Logger | None = None,
    sleep: Callable[[float], None] = time.sleep,
    **kwargs: Any,
) -> httpx.Response:
    """The first answer that is not a retryable status, trying again for up to ``retry_s`` seconds.

    A transport error or a 502/503/504 is tried again after a pause that doubles from 0.2 s to 10 s, while
    the next try would start within ``retry_s``. When the budget is spent, the last answer is returned (a
    503 carries the service's reason), or :class:`Unreachable` raised when no answer came at all.
    ``content`` may be a callable giving a fresh body for every try (a streamed upload). Error answers are
    returned, not raised: each client maps them onto its own exceptions (:func:`error_body`).
    """
    import httpx

    give_up = time.monotonic() + retry_s
    pause = FIRST_PAUSE_S
    body = kwargs.pop("content", None)
    while True:
        content = body() if callable(body) else body
        try:
            answer = http.request(method, path, content=content, **kwargs)
        except httpx.TransportError as error:
            problem = f"{type(error).__name__}: {error}"
        else:
            if answer.status_code not in RETRY_STATUS or time.monotonic() + pause > give_up:
                return answer
            problem = f"HTTP {answer.status_code}"
        if time.monotonic() + pause > give_up:
            raise Unreachable(f"{method} {path}: the service did not answer ({problem})", problem)
        if log is not None:
            log.warning("%s %s: %s; trying again in %.1f s", method, path, problem, pause)
        sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE_S)


def retry_after_s(answer: httpx.Response, *, default_s: float = 5.0, longest_s: float = 60.0) -> float:
    """The answer's Retry-After in seconds (a number of seconds), within [0.5, ``longest_s``]; ``default_s`` without one."""
    try:
        value = float(answer.headers.get("Retry-After", default_s))
    except ValueError:
        value = default_s
    return min(max(value, 0.5), longest_s)


def error_body(answer: httpx.Response) -> tuple[Any, str | None]:
    """``(detail, code)`` of an error answer: the service's JSON ``{"detail", "code"}``, else its text."""
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:2000], None
    if isinstance(body, dict):
        code = body.get("code")
        return body.get("detail", body), str(code) if code is not None else None
    return body, None
