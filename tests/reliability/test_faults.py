"""Faults on a running campaign on PostgreSQL, with the real ``mapcampaign serve`` and ``mapcampaign worker``.

Issue 10, part 1. After each fault the campaign finishes or fails visibly with its cause, no
realisation succeeds twice, no accepted result is lost (its products are on disk with the
stored checksum), and no process of the worker's tasks (mpiexec, ranks) is left.
Specs are tiny: nside 8-16, two realisations, one rank.
"""

from __future__ import annotations

import hashlib
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.reliability.figures import record
from tests.support.live_service import REPO, LiveService, is_healthy, mapcampaign_command
from tests.support.processes import wait_for_no_task_processes
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


def restart_service(service: LiveService) -> LiveService:
    """``mapcampaign serve`` again on the same port, data folder and database (the worker keeps its URL)."""
    log_file = open(service.log_path, "ab")
    process = subprocess.Popen(
        mapcampaign_command("serve"), env=service.env, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO,
        start_new_session=True,
    )
    log_file.close()
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
        time.sleep(3)  # the worker's report or heartbeat meets a closed port
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


def test_sigkill_of_the_worker(make_pg_service, tmp_path):
    service = make_pg_service(env={"MAPCAMPAIGN_LEASE_S": "5", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.5"})
    api = Api(service)
    campaign = api.create(long_spec("worker killed", realizations=2, **ONE_RANK))
    site = write_site(tmp_path / "site.toml", max_tasks=1, liveness_timeout_s=3)
    doomed = start_worker(service, site, "w-doomed")
    try:
        wait_for(lambda: running_task_processes(doomed, minimum=2), 240, "a realisation's rank", worker=doomed)
        doomed.kill()
        assert wait_for_no_task_processes(doomed.marker_prefix, timeout=30) == []  # its ranks end themselves
        rescue = start_worker(service, site, "w-rescue")
        try:
            done = api.wait_state(campaign["id"], {"succeeded", "failed"}, 300, rescue)
        finally:
            assert rescue.stop(timeout=60) == 0
    finally:
        if doomed.process.poll() is None:
            doomed.kill()
    assert done["state"] == "succeeded"
    assert_campaign_sound(api, service, campaign["id"], [doomed.marker_prefix])
    lost = [a for r in api.realizations(campaign["id"]) for a in r["attempt_history"] if a["failure_class"]]
    assert lost and all(a["failure_class"] == "lost_worker" and a["worker"] == "w-doomed" for a in lost)
    record("faults", f"SIGKILL of the worker: {len(lost)} attempt(s) lost_worker, campaign {done['state']} on a second worker")
    api.close()


def test_realisation_past_its_wall_time(make_pg_service, tmp_path):
    service = make_pg_service(env=FAST)
    api = Api(service)
    spec = long_spec("too slow", realizations=1, max_attempts=2, **ONE_RANK, **{"resources.walltime_s": 2.0})
    campaign = api.create(spec)
    worker = start_worker(service, write_site(tmp_path / "site.toml"), "w-walltime")
    try:
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, 300, worker)
    finally:
        assert worker.stop(timeout=60) == 0
    assert done["state"] == "failed" and "1 of 1 realisations failed" in done["failure_cause"]
    assert_campaign_sound(api, service, campaign["id"], [worker.marker_prefix])
    [realization] = api.realizations(campaign["id"])
    assert [a["failure_class"] for a in realization["attempt_history"]] == ["walltime", "walltime"]
    record("faults", f"wall time exceeded: campaign failed, cause {done['failure_cause']!r}, attempts walltime x2")
    api.close()


def test_corrupted_plan_file(make_pg_service, tmp_path):
    service = make_pg_service(env=FAST)
    api = Api(service)
    site = write_site(tmp_path / "site.toml", max_tasks=1)
    worker = start_worker(service, site, "w-plan")
    try:
        first = api.create(tiny_spec("builds the plan", realizations=1, **ONE_RANK))
        assert api.wait_state(first["id"], {"succeeded", "failed"}, 240, worker)["state"] == "succeeded"
        [plan] = api.plans()
        plan_file = Path(plan["path"])
        plan_file.write_bytes(plan_file.read_bytes()[: plan_file.stat().st_size // 2])  # truncated mid-write
        second = api.create(tiny_spec("meets the damaged plan", realizations=2, seed=8, **ONE_RANK))
        done = api.wait_state(second["id"], {"succeeded", "failed"}, 300, worker)
    finally:
        assert worker.stop(timeout=60) == 0
    assert done["state"] == "succeeded", worker.log_tail()
    assert_campaign_sound(api, service, second["id"], [worker.marker_prefix])
    refused = [a for r in api.realizations(second["id"]) for a in r["attempt_history"] if a["failure_class"]]
    assert refused and all("plan refused" in a["log_tail"] for a in refused)
    [rebuilt] = api.plans()
    assert rebuilt["state"] == "ready" and rebuilt["path"] != plan["path"]
    record("faults", f"truncated plan file: {len(refused)} attempt(s) refused it, plan rebuilt, campaign succeeded")
    api.close()


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
