"""Request bodies: a size limit per endpoint and a time limit, applied before a request takes a turn.

Two kinds of body, each read one way:

- **Streamed bodies** (a product file, a site's partial map sums, an instrument file, the map of ``POST /spectrum``): the endpoint
  checks the token, the caller's right and the media type from the headers first, then reads the body
  itself with :func:`stream_body`, chunk by chunk to a file, under its own limit (``max_artifact_bytes``,
  ``max_upload_bytes``, ``max_spectrum_bytes``) and an idle timeout (``upload_idle_timeout_s``: 408 when
  nothing arrives for that long). These endpoints take no admission permit (``service.admission``): a
  slow upload holds a connection and a file, never a turn of the database.
- **Every other body** (JSON: a submission, a claim, a heartbeat, a result): read whole here, under its
  limit (``max_json_body_bytes``, ``max_result_body_bytes``) and within ``body_timeout_s`` (else 408),
  *before* the admission middleware (inside this one) hands out a permit, then replayed to the app. A
  client that declares a body and sends it slowly waits here, holding no permit, so it cannot starve
  the requests that use the database.

A body whose Content-Length is over its endpoint's limit is refused (413) before a byte of it is read.
A refusal of a body not read to its end closes the connection, so the rest is never read either.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.api import API_PREFIX
from service.config import Settings
from service.errors import DomainError, InsufficientStorage, RequestTimeout, TooLarge, error_response

ARTIFACT_UPLOAD = re.compile(rf"^{API_PREFIX}/tasks/[^/]+/artifacts/[^/]+$")
_RESULT = re.compile(rf"^{API_PREFIX}/tasks/[^/]+/succeeded$")
SPECTRUM_UPLOAD = re.compile(rf"^{API_PREFIX}/spectrum$")  # a user's HEALPix FITS map
INSTRUMENT_UPLOAD = re.compile(rf"^{API_PREFIX}/instrument-files$")  # a TOAST focal plane or schedule
# a site's partial map sums, a kept file the service asked a site for
SITE_SUMS_UPLOAD = re.compile(rf"^{API_PREFIX}/workers/[^/]+/(campaigns/[^/]+/map-sums|fetches/[^/]+/[^/]+/[^/]+)$")

_CLOSE = {"Connection": "close"}


class BodyTooLarge(TooLarge):
    """A body over its endpoint's limit; the connection is closed rather than its rest read."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.headers = dict(_CLOSE)


class BodyIncomplete(DomainError):
    code = "body_incomplete"


def streamed(path: str) -> bool:
    """Whether the endpoint at ``path`` reads its own body (:func:`stream_body`) instead of having it read here."""
    return bool(
        ARTIFACT_UPLOAD.match(path)
        or SPECTRUM_UPLOAD.match(path)
        or INSTRUMENT_UPLOAD.match(path)
        or SITE_SUMS_UPLOAD.match(path)
    )


def body_limit(settings: Settings, path: str) -> int:
    """The largest body, in bytes, the endpoint at ``path`` accepts."""
    if ARTIFACT_UPLOAD.match(path) or SITE_SUMS_UPLOAD.match(path):
        return settings.max_artifact_bytes
    if SPECTRUM_UPLOAD.match(path):
        return settings.max_spectrum_bytes
    if INSTRUMENT_UPLOAD.match(path):
        return settings.max_upload_bytes
    if _RESULT.match(path):
        return settings.max_result_body_bytes
    return settings.max_json_body_bytes


def too_large_message(limit: int) -> str:
    return f"request body larger than the limit of {limit} bytes"


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None without a valid one."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _has_body(scope: Scope) -> bool:
    length = declared_length(scope)
    if length is not None:
        return length > 0
    return any(name == b"transfer-encoding" for name, _ in scope.get("headers") or ())


async def stream_body(request: Request, *, max_bytes: int, idle_timeout_s: float) -> AsyncIterator[bytes]:
    """The request body in chunks as they arrive, for an endpoint that writes them to a file.

    Raises :class:`BodyTooLarge` (413) when more than ``max_bytes`` arrive, :class:`RequestTimeout` (408)
    when nothing arrives for ``idle_timeout_s`` seconds; both close the connection.
    """
    chunks = request.stream().__aiter__()
    size = 0
    while True:
        with anyio.move_on_after(idle_timeout_s) as waiting:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except ClientDisconnect:  # nobody reads the answer; it ends the request without an error logged
                raise BodyIncomplete("the client closed the connection before the body was complete") from None
        if waiting.cancelled_caught:
            raise RequestTimeout(f"the request body stopped arriving: nothing for {idle_timeout_s:g} s")
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(too_large_message(max_bytes))
        if chunk:
            yield chunk


@dataclass(frozen=True)
class ReceivedFile:
    """A streamed body in a temporary file, with its SHA-256 (hex) and size in bytes."""

    path: Path
    sha256: str
    size_bytes: int


async def receive_to_file(chunks: AsyncIterator[bytes], *, folder: Path) -> ReceivedFile:
    """Write a streamed body (:func:`stream_body`) to a new temporary ``.upload-*`` file in ``folder`` as it
    arrives, hashing it; the file is removed again on any error (a refused body, a full disk: 507)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=folder, prefix=".upload-")
    except OSError as error:
        raise InsufficientStorage(f"cannot write the request body: {error.strerror or error}") from None
    path = Path(name)
    digest = hashlib.sha256()
    size = 0
    try:
        # Each chunk is written as it arrives, between awaits of the body (a local file, chunks of 64 KiB).
        with os.fdopen(handle, "wb") as stream:
            async for chunk in chunks:
                digest.update(chunk)
                size += len(chunk)
                stream.write(chunk)
    except OSError as error:
        path.unlink(missing_ok=True)
        raise InsufficientStorage(f"cannot write the request body: {error.strerror or error}") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return ReceivedFile(path, digest.hexdigest(), size)


class _Disconnected(Exception):
    pass


async def _read_whole(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(too_large_message(limit))
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


class BodyLimitMiddleware:
    """Refuses a body over its endpoint's limit; reads every body that is not streamed whole and in time.

    Placed outside :class:`service.admission.AdmissionMiddleware`, so that a body is read before its
    request waits for a permit.
    """

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        limit = body_limit(self.settings, path)
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await error_response(413, too_large_message(limit), "too_large", headers=_CLOSE)(scope, receive, send)
            return
        if streamed(path) or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        try:
            with anyio.fail_after(self.settings.body_timeout_s):
                body = await _read_whole(receive, limit)
        except TimeoutError:
            refusal = error_response(
                408,
                f"the request body did not arrive within {self.settings.body_timeout_s:g} s",
                RequestTimeout.code,
                headers=_CLOSE,
            )
            await refusal(scope, receive, send)
            return
        except BodyTooLarge as error:
            await error_response(413, error.detail, "too_large", headers=_CLOSE)(scope, receive, send)
            return
        except (_Disconnected, ClientDisconnect):
            return  # nobody to answer
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)
