"""Invariants every campaign must keep after a fault, checked through the API and on disk."""

from __future__ import annotations

import hashlib

from tests.support.live_service import LiveService
from tests.support.processes import wait_for_no_task_processes
from tests.support.worker_helpers import Api


def assert_campaign_sound(api: Api, service: LiveService, campaign_id: int, worker_prefixes: list[str]) -> dict:
    """The invariants every fault must keep; returns the campaign."""
    campaign = api.campaign(campaign_id)
    assert campaign["state"] in ("succeeded", "failed"), campaign["state"]
    if campaign["state"] == "failed":
        assert campaign["failure_cause"], "a failed campaign names its cause"
    for realization in api.realizations(campaign_id):
        successes = [a for a in realization["attempt_history"] if a["ended_at"] and a["failure_class"] is None]
        assert len(successes) <= 1, f"realisation {realization['index']} succeeded {len(successes)} times"
        if realization["state"] == "succeeded":
            assert len(successes) == 1 and realization["result"]["realization"] == realization["index"]
            folder = service.data_dir / "campaigns" / str(campaign_id) / "realizations" / str(realization["index"])
            for product in realization["result"]["products"]:  # no accepted result without its files
                stored = folder / product["path"]
                assert hashlib.sha256(stored.read_bytes()).hexdigest() == product["sha256"], stored
    for prefix in worker_prefixes:
        assert wait_for_no_task_processes(prefix, timeout=30) == [], f"processes of {prefix} left behind"
    return campaign
