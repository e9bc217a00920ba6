"""Faults on a running campaign on PostgreSQL, with the real ``mapcampaign serve`` and ``mapcampaign worker``.

After each fault the campaign finishes or fails visibly with its cause, no realisation succeeds
twice, no accepted result is lost (its products are on disk with the stored checksum), and no
process of the worker's tasks (mpiexec, ranks) is left (:func:`assert_campaign_sound`).
Specs are tiny: nside 8-16, two realisations, one rank.

The faults of the worker's own tasks -- a SIGKILLed worker, a realisation past its wall time, a
damaged plan file -- are full Parsl + MPI scenarios run once, in tests/integration, with the same
invariants checked and their figures recorded here.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.campaign_checks import assert_campaign_sound
from tests.support.figures import record
from tests.support.live_service import REPO, LiveService, is_healthy, mapcampaign_command
from tests.support.worker_helpers import (
    Api,
    long_spec,
    running_task_processes,
    start_worker,
    tiny_spec,
    wait_for,
    write_site,
)

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.mpi, pytest.mark.timeout(600)]

FAST = {"MAPCAMPAIGN_LEASE_S": "10", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.5"}
ONE_RANK = {"resources.ranks": 1}


def restart_service(service: LiveService) -> LiveService:
    """``mapcampaign serve`` again on the same port, data folder and database (the worker keeps its URL)."""
    with open(service.log_path, "ab") as log_file:  # the child keeps its own descriptor
        process = subprocess.Popen(
            mapcampaign_command("serve"), env=service.env, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO,
            start_new_session=True,
        )
    service.process = process
    wait_for(lambda: _healthy(service), 60, "the restarted service")
    return service


def _healthy(service: LiveService) -> bool:
    if service.process.poll() is not None:
        raise AssertionError(f"the service exited ({service.process.returncode}):\n{service.log_tail()}")
    return is_healthy(service.url)


def test_sigkill_of_the_api_and_a_restart(make_pg_service, tmp_path):
    service = make_pg_service(env=FAST)
    api = Api(service)
    campaign = api.create(long_spec("api killed", realizations=2, **ONE_RANK))
    worker = start_worker(service, write_site(tmp_path / "site.toml", max_tasks=1), "w-api-kill")
    try:
        wait_for(lambda: running_task_processes(worker, minimum=2), 240, "a realisation's rank", worker=worker)
        service.process.send_signal(signal.SIGKILL)  # no shutdown, no flush
        service.process.wait(timeout=30)
        down_at = time.monotonic()
        logged = worker.log_path.stat().st_size

        def worker_found_the_api_gone() -> bool:  # its heartbeat (every few seconds), claim or report met the closed port
            said = worker.log_path.read_bytes()[logged:]
            return any(words in said for words in (b"trying again", b"heartbeat failed", b"claim failed"))

        wait_for(worker_found_the_api_gone, 60, "the worker to find the API gone", worker=worker)
        restart_service(service)
        outage_s = time.monotonic() - down_at
        api.client = service.client(service.user_token)
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, 300, worker)
    finally:
        assert worker.stop(timeout=60) == 0, worker.log_tail()
    assert done["state"] == "succeeded", worker.log_tail()
    assert_campaign_sound(api, service, campaign["id"], [worker.marker_prefix])
    record("faults", f"SIGKILL of the API, restarted after {outage_s:.0f} s: campaign {done['state']}")
    api.close()


def restart_postgresql() -> None:
    version = next(Path("/etc/postgresql").iterdir()).name
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True, capture_output=True, timeout=120,
    )


def test_postgresql_restart(make_pg_service, tmp_path):
    service = make_pg_service(env=FAST)
    api = Api(service)
    campaign = api.create(long_spec("database restarted", realizations=2, **ONE_RANK))
    worker = start_worker(service, write_site(tmp_path / "site.toml", max_tasks=1), "w-pg-restart")
    try:
        wait_for(lambda: running_task_processes(worker, minimum=2), 240, "a realisation's rank", worker=worker)
        restart_postgresql()
        # Readers see the service come back by itself: no restart of the API or the worker.
        wait_for(lambda: _answers(api, campaign["id"]), 60, "the API to read the database again")
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, 300, worker)
    finally:
        assert worker.stop(timeout=60) == 0, worker.log_tail()
    assert done["state"] == "succeeded", worker.log_tail() + service.log_tail()
    assert_campaign_sound(api, service, campaign["id"], [worker.marker_prefix])
    record("faults", f"PostgreSQL restarted under a running campaign: campaign {done['state']}")
    api.close()


def _answers(api: Api, campaign_id: int) -> bool:
    return api.client.get(f"/campaigns/{campaign_id}").status_code == 200


def test_service_cannot_write_products(make_pg_service, tmp_path):
    """The service's product writes fail (file size limit: EFBIG, the ENOSPC path), then succeed again.

    Root ignores file permissions, so the fault is RLIMIT_FSIZE set on the live ``serve`` process with
    prlimit(2): CPython ignores SIGXFSZ, so a write past the limit fails with ``File too large``.
    """
    service = make_pg_service(env=FAST)
    api = Api(service)
    pid = service.process.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (1_024, hard))  # a product file (a FITS map) is larger
    campaign = api.create(tiny_spec("no room for products", realizations=2, max_attempts=4, **ONE_RANK))
    worker = start_worker(service, write_site(tmp_path / "site.toml", max_tasks=1), "w-no-space")
    realizations_dir = service.data_dir / "campaigns" / str(campaign["id"]) / "realizations"
    try:
        refused = wait_for(lambda: _failed_attempts(api, campaign["id"]), 240, "a failed attempt", worker=worker)
        accepted_during = api.campaign(campaign["id"])["progress"]["counts"].get("succeeded", 0)
        leftovers = _kept_files(realizations_dir, {attempt["id"] for attempt in refused})
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))  # space returns
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, 300, worker)
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
        assert worker.stop(timeout=60) == 0, worker.log_tail()
    assert accepted_during == 0, "no result accepted while its products could not be written"
    assert leftovers == [], f"files kept from failed writes: {leftovers}"
    assert done["state"] == "succeeded", worker.log_tail() + service.log_tail()
    assert_campaign_sound(api, service, campaign["id"], [worker.marker_prefix])
    failures = [a for r in api.realizations(campaign["id"]) for a in r["attempt_history"] if a["failure_class"]]
    assert failures and all(
        a["failure_class"] == "app_error" and "507" in a["log_tail"] and "File too large" in a["log_tail"]
        for a in failures
    ), failures
    assert not list(realizations_dir.rglob(".upload-*")) and not any((realizations_dir / ".staging").glob("*/*"))
    record(
        "faults",
        f"product writes of the service failing (RLIMIT_FSIZE 1 KiB: EFBIG): uploads answered 507, "
        f"{len(failures)} attempt(s) app_error naming 'File too large', none accepted; limit lifted: "
        f"campaign {done['state']}",
    )
    api.close()


def _failed_attempts(api: Api, campaign_id: int) -> list[dict]:
    return [a for r in api.realizations(campaign_id) for a in r["attempt_history"] if a["failure_class"]]


def _kept_files(realizations_dir: Path, failed_attempt_ids: set[int]) -> list[str]:
    """Files published, or staged by a failed attempt (not those of an attempt uploading right now)."""
    failed = {f"attempt-{n}" for n in failed_attempt_ids}
    kept = []
    for path in realizations_dir.rglob("*"):
        parts = path.relative_to(realizations_dir).parts
        if path.is_file() and (parts[0] != ".staging" or parts[1] in failed):
            kept.append("/".join(parts))
    return kept
