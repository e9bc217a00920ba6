"""Opaque cursors for keyset pagination: base64url of a small JSON object."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from service.errors import Invalid


class BadCursor(Invalid):
    code = "bad_cursor"


def encode_cursor(position: dict[str, Any]) -> str:
    raw = json.dumps(position, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, *, keys: tuple[str, ...]) -> dict[str, Any] | None:
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        position = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BadCursor("cursor: not a cursor this service made; pass next_cursor from the previous page") from None
    if (
        not isinstance(position, dict)
        or set(position) != set(keys)
        or not all(isinstance(position[key], int) and not isinstance(position[key], bool) for key in keys)
    ):
        raise BadCursor("cursor: not a cursor of this listing; pass next_cursor from the previous page")
    return position
