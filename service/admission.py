"""Admission control: at most a fixed number of requests use the database at once.

FastAPI runs sync endpoints and the enter *and exit* of sync ``yield`` dependencies
(our sessions) in one thread pool (40 threads). Under many concurrent readers that
pool and the connection pool can wait on each other: every thread sits in an
endpoint waiting for a connection, while every connection is held by a finished
request whose session close waits for a free thread -- a stall until the pool
timeout (seen with 200 readers on PostgreSQL). Here a request waits for a permit
on the event loop, holding neither a thread nor a connection, before it reaches
any of them; with permits at most half the connection pool (a request may hold
two sessions at once), an admitted request always finds a connection, so it
always finishes and hands both back. A request that waits longer than the
admission timeout is answered 503 busy with Retry-After, which clients retry.

Event streams (long-lived, their own brief sessions), the streamed uploads (product
files, instrument files, the map of ``POST /spectrum``: up to GiBs streamed with no
session held; they check the token and the caller's right in brief sessions of their
own, and their costly work has its own limits) and static files are not counted. Every
other request's body has been read whole before it reaches this middleware
(``service.limits``): a slow body waits there, holding no permit.
"""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from schemas.api import API_PREFIX
from service.errors import error_response
from service.limits import streamed

_UNCOUNTED_PATHS = frozenset({f"{API_PREFIX}/events", "/ui/events", "/healthz"})
_UNCOUNTED_PREFIXES = ("/static/", "/apidocs/")


def counted(path: str, method: str = "GET") -> bool:
    """Whether a ``method`` request to ``path`` takes a permit (it may use the database)."""
    if method in ("POST", "PUT") and streamed(path):
        return False
    return path not in _UNCOUNTED_PATHS and not path.startswith(_UNCOUNTED_PREFIXES)


class AdmissionMiddleware:
    def __init__(self, app: ASGIApp, *, permits: int, timeout_s: float):
        self.app = app
        self.permits = permits
        self.timeout_s = timeout_s
        self._semaphore: anyio.Semaphore | None = None  # made on first use, inside the server's event loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not counted(scope["path"], scope["method"]):
            await self.app(scope, receive, send)
            return
        if self._semaphore is None:
            self._semaphore = anyio.Semaphore(self.permits)
        try:
            self._semaphore.acquire_nowait()  # a permit is free (the common case): no timer to set up
            admitted = True
        except anyio.WouldBlock:
            admitted = False
            with anyio.move_on_after(self.timeout_s):
                await self._semaphore.acquire()
                admitted = True
        if not admitted:
            busy = error_response(503, "the service is busy; try again", "busy", headers={"Retry-After": "1"})
            await busy(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._semaphore.release()

