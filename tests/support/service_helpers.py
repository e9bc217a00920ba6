"""Small builders for service tests: specs, results, and the worker steps."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from benchmarks._support import result_for, spec_data

__all__ = ["auth", "dumps", "product", "result_for", "sha256", "spec_data"]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def product(name: str, payload: bytes) -> dict[str, Any]:
    return {
        "name": name.split(".")[0],
        "path": name,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "size_bytes": len(payload),
    }


def sha256(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def dumps(data: Any) -> str:
    return json.dumps(data)
