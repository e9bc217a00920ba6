"""Conditional GETs: an ETag on a JSON answer, and ``304 Not Modified`` when the client's copy is current.

The tag is a digest of the body's bytes, so it is right by construction: equal tags, equal answers,
whatever changed in the database to make them. A poller (the dashboard, ``mapcampaign watch``, a
script) that sends ``If-None-Match`` gets an empty 304 while nothing changed. The answer is still
computed (a tag of data not read cannot be known), so a 304 saves the transfer and the client's
parsing, not the queries. ``Cache-Control: no-cache``: a cache may keep the answer but must ask again
before each use.
"""

from __future__ import annotations

import hashlib
from typing import Any

from starlette.responses import Response

NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not Modified: the If-None-Match tag is the answer's current ETag"}
}


def etag_of(body: bytes) -> str:
    """A strong entity tag of ``body``: 128 bits of its SHA-256, quoted as RFC 9110 writes tags."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def tag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (or is ``*``); weak comparison, as RFC 9110 asks."""
    if not if_none_match:
        return False
    for candidate in if_none_match.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == etag:
            return True
    return False


def json_with_etag(body: bytes, if_none_match: str | None) -> Response:
    """``body`` (JSON) with its ETag, or an empty 304 with the same tag when ``if_none_match`` names it."""
    headers = {"ETag": etag_of(body), "Cache-Control": "no-cache"}
    if tag_matches(if_none_match, headers["ETag"]):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)
