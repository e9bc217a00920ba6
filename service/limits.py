"""Request-body size limits: small for JSON, larger for result reports, largest for product uploads.

A body whose Content-Length is over the limit is refused before it is read;
a body without one is counted as it arrives and refused when it passes it.
"""

from __future__ import annotations

import re

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.api import API_PREFIX
from service.config import Settings
from service.errors import error_response

ARTIFACT_UPLOAD = re.compile(rf"^{API_PREFIX}/tasks/[^/]+/artifacts/[^/]+$")
_RESULT = re.compile(rf"^{API_PREFIX}/tasks/[^/]+/succeeded$")
SPECTRUM_UPLOAD = re.compile(rf"^{API_PREFIX}/spectrum$")  # a user's FITS map: as large as a product file
INSTRUMENT_UPLOAD = re.compile(rf"^{API_PREFIX}/instrument-files$")  # a TOAST focal plane or schedule


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.settings = settings

    def limit_for(self, path: str) -> int:
        if ARTIFACT_UPLOAD.match(path) or SPECTRUM_UPLOAD.match(path) or INSTRUMENT_UPLOAD.match(path):
            return self.settings.max_artifact_bytes
        if _RESULT.match(path):
            return self.settings.max_result_body_bytes
        return self.settings.max_json_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > limit
            except ValueError:
                too_large = False
            if too_large:
                refusal = error_response(
                    413, f"request body larger than the limit of {limit} bytes", "too_large", headers={"Connection": "close"}
                )
                await refusal(scope, receive, send)
                return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"request body larger than the limit of {limit} bytes")
            return message

        await self.app(scope, counted_receive, send)

