"""Small builders for service tests: specs, results, and the worker steps."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from schemas.io import example_spec_path, load_spec
from schemas.spec import CampaignSpec, scan_key, spec_hash


def spec_data(**changes: Any) -> dict[str, Any]:
    """The demo spec as JSON data, with top-level or dotted changes (``"noise.f_knee_hz": 0.1``)."""
    data = load_spec(example_spec_path("demo")).model_dump(mode="json")
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    return data


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def result_for(spec: dict[str, Any], index: int, products: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    parsed = CampaignSpec.model_validate(spec)
    return {
        "realization": index,
        "spec_hash": spec_hash(parsed),
        "scan_key": scan_key(parsed),
        "ranks": parsed.resources.ranks,
        "threads_per_rank": 1,
        "samples": 1000,
        "observed_pixels": 100,
        "cut_pixels": 0,
        "iterations": 3,
        "converged": True,
        "residual_history": [1.0, 1e-3, 1e-7],
        "timing": {
            "calc": {"max": 1.0, "mean": 0.9},
            "comm": {"max": 0.1, "mean": 0.1},
            "io": {"max": 0.0, "mean": 0.0},
            "total": 1.2,
        },
        "communication": {
            "strategy": "alltoallv",
            "requested": "auto",
            "bytes_per_iteration": {"max": 10, "mean": 8},
            "messages_per_iteration": {"max": 1, "mean": 1},
            "reductions": 4,
            "bytes_counted": "payload bytes sent",
        },
        "peak_memory_mb": {"max": 100.0, "mean": 90.0},
        "rng_scheme": "philox(seed, realization, detector, interval)",
        "versions": {"mapmaker": "0.1.0"},
        "products": products or [],
    }


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
