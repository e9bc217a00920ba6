"""The site worker end to end: a live service (SQLite and PostgreSQL), real Parsl, real mpiexec, the real map-maker.

Every test starts ``mapcampaign serve`` and one or two ``mapcampaign worker`` processes on the
local site (Parsl LocalProvider + MPIExecutor), submits tiny campaigns through the REST API,
and checks what the API says and which processes are left.

The end-to-end test runs on both databases; every other scenario runs once, on one of them, so
that both databases see worker traffic and the whole file stays within a few minutes on two cores.
The worker's own faults (a SIGKILLed worker, a realisation past its wall time, a damaged plan) are
here and nowhere else: each also checks the fault invariants of tests/reliability
(:func:`assert_campaign_sound`) and records its figure in the reliability report.
"""

from __future__ import annotations

import hashlib
import signal
import time
from pathlib import Path

import pytest

from tests.support.campaign_checks import assert_campaign_sound
from tests.support.databases import on_database
from tests.support.figures import record
from tests.support.processes import task_processes, wait_for_no_task_processes
from tests.support.worker_helpers import (
    Api,
    long_spec,
    pid_alive,
    running_task_processes,
    start_worker,
    tiny_spec,
    wait_for,
    write_site,
)

pytestmark = [pytest.mark.integration, pytest.mark.mpi, pytest.mark.timeout(420)]


FAST = {"MAPCAMPAIGN_LEASE_S": "10", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.5"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def succeeded_attempts(realization: dict) -> list[dict]:
    return [a for a in realization["attempt_history"] if a["ended_at"] and a["failure_class"] is None]


def test_campaign_runs_end_to_end(make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    campaign = api.create(tiny_spec("end to end", realizations=4))
    worker = start_worker(service, write_site(tmp_path / "site.toml", max_tasks=2), "w-e2e")
    try:
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, timeout=240, worker=worker)
        assert done["state"] == "succeeded", worker.log_tail()
        worker.remember_descendants()
        assert done["progress"]["counts"]["succeeded"] == 4

        products_root = service.data_dir / "campaigns" / str(campaign["id"]) / "realizations"
        for realization in api.realizations(campaign["id"]):
            assert realization["state"] == "succeeded"
            [attempt] = realization["attempt_history"]
            assert (
                attempt["exit_code"] == 0 and attempt["host"] and attempt["started_at"] and attempt["worker"] == "w-e2e"
            )
            result = realization["result"]
            assert result["realization"] == realization["index"] and result["ranks"] == 2 and result["converged"]
            assert result["plan_checksum"]
            names = {product["path"] for product in result["products"]}
            # The mask goes with the coupling: realisation 0 and those that built the site's coupling file.
            built = result["spectra"]["bandpowers"]["coupling_source"] == "built"
            with_mask = {"mask.fits"} if realization["index"] == 0 or built else set()
            assert names == {"map_iqu.fits", "hits.fits", "rcond.fits", "spectra.npz"} | with_mask
            for product in result["products"]:  # uploaded, checked and published by the service
                stored = products_root / str(realization["index"]) / product["path"]
                assert stored.stat().st_size == product["size_bytes"] and sha256(stored) == product["sha256"]
            # The site's own copy: the attempt's folder, complete, with result.json.
            site_copy = (
                worker.site_data / "campaigns" / str(campaign["id"]) / "realizations" / str(realization["index"])
            )
            assert sorted(p.name for p in site_copy.iterdir()) == ["attempt-1"]
            assert (site_copy / "attempt-1" / "result.json").is_file()

        # The bandpowers' coupling: one file at the site for the campaign's scan and products settings,
        # built by the first realisations (two run at once), read by the later ones.
        assert len(list((worker.site_data / "couplings").glob("*.npz"))) == 1
        sources = [r["result"]["spectra"]["bandpowers"]["coupling_source"] for r in api.realizations(campaign["id"])]
        assert "file" in sources and sources.count("built") <= 2, sources
        # ... and the service's record of it: every realisation counted, the file's checksum and size.
        [coupling_file] = (worker.site_data / "couplings").glob("*.npz")
        [coupling] = api.client.get("/couplings").json()["items"]
        assert coupling["uses"] == 4 and coupling["site"] == "local" and coupling["build_time_s"] > 0
        assert coupling["file_sha256"] == sha256(coupling_file) and coupling["size_bytes"] == coupling_file.stat().st_size
        assert [c["id"] for c in coupling["campaigns"]] == [campaign["id"]]
        # The default preconditioner (auto) of a campaign of several realisations is the two-level one, its coarse
        # operator one file at the site, built by the first realisations, read by the later ones; those that read
        # it time it against block-diagonal, the records beside the file.
        assert len(list((worker.site_data / "coarse").glob("*.npz"))) == 1
        results = [r["result"] for r in api.realizations(campaign["id"])]
        coarse = [(result["preconditioner"]["name"], (result["coarse"] or {}).get("source")) for result in results]
        assert ("two-level", "file") in coarse and coarse.count(("two-level", "built")) <= 2, coarse
        timed = [result["preconditioner"]["name"] for result in results if result["preconditioner"]["timed"]]
        assert len(list((worker.site_data / "coarse").glob("*.npz.timings/*.json"))) == len(timed) >= 1

        [plan] = api.plans()
        assert (plan["state"], plan["uses"], plan["build_attempts"], plan["ranks"]) == ("ready", 4, 1, 2)
        assert Path(plan["path"]).parent == worker.site_data / "plans" and Path(plan["path"]).is_file()
        # Work folders of succeeded tasks are removed right after their report, which may come
        # a moment after the service saw the campaign finish.
        work = worker.site_data / "work"
        deadline = time.monotonic() + 30
        while list(work.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftover = {folder.name: sorted(entry.name for entry in folder.iterdir()) for folder in work.iterdir()}
        assert leftover == {}, worker.log_tail()
        workers = service.client(service.user_token).get("/workers").json()
        assert [(w["name"], w["site"], w["capacity"]) for w in workers] == [("w-e2e", "local", 2)]
    finally:
        code = worker.stop(signal.SIGTERM, timeout=60)
        api.close()
    assert code == 0, worker.log_tail()
    # Parsl's interchange and block went with the worker.
    wait_for(lambda: not any(pid_alive(p.pid) for p in worker.descendants), 30, "the worker's processes to end")


@on_database("postgresql")
def test_preprocessing_runs_once_and_plans_are_shared_by_scan_and_ranks(make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    one_rank = {"resources.ranks": 1}  # one process per realisation: they stay cheap on two cores
    # Six realisations on two slots: claims go on while the plan is built and each slot is reused.
    several = api.create(tiny_spec("several", realizations=6, **one_rank))
    # Same scan pattern and ranks, different noise, sky and seeds: the same plan.
    sibling = api.create(
        tiny_spec(
            "sibling",
            realizations=2,
            seed=99,
            **one_rank,
            **{"sky.seed": 5, "noise.net_k_sqrt_s": 300e-6, "noise.f_knee_hz": 0.05},
        )
    )
    finer = api.create(
        tiny_spec("nside 16", realizations=1, **one_rank, **{"pixelization.nside": 16})
    )  # other scan key
    two_ranks = api.create(tiny_spec("two ranks", realizations=1))  # another rank count
    assert several["scan_key"] == sibling["scan_key"] == two_ranks["scan_key"] != finer["scan_key"]
    worker = start_worker(service, write_site(tmp_path / "site.toml", max_tasks=2), "w-plans")
    try:
        for campaign in (several, sibling, finer, two_ranks):
            assert api.wait_state(campaign["id"], {"succeeded", "failed"}, 400, worker)["state"] == "succeeded"
    finally:
        assert worker.stop(timeout=60) == 0
    plans = {(plan["scan_key"], plan["ranks"]): plan for plan in api.plans()}
    assert set(plans) == {(several["scan_key"], 1), (finer["scan_key"], 1), (several["scan_key"], 2)}
    assert all(plan["state"] == "ready" and plan["build_attempts"] == 1 for plan in plans.values())
    assert plans[(several["scan_key"], 1)]["uses"] == 8
    assert plans[(finer["scan_key"], 1)]["uses"] == 1 and plans[(several["scan_key"], 2)]["uses"] == 1
    builds = [e for e in api.events() if e["kind"] == "plan" and e["state"] == "building"]
    assert len(builds) == 3  # one build per (scan key, ranks): never a second one
    checksums = {r["result"]["plan_checksum"] for c in (several, sibling) for r in api.realizations(c["id"])}
    assert len(checksums) == 1
    assert len(list((worker.site_data / "plans").glob("*.plan"))) == 3
    # One coupling per (scan key, ranks, products settings), whatever the noise or seeds.
    assert len(list((worker.site_data / "couplings").glob("*.npz"))) == 3
    api.close()


@on_database("postgresql")
def test_killed_worker_its_tasks_end_and_another_worker_finishes(make_live_service, tmp_path):
    service = make_live_service(env={"MAPCAMPAIGN_LEASE_S": "5", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.5"})
    api = Api(service)
    campaign = api.create(long_spec("killed", realizations=2))
    site = write_site(tmp_path / "site.toml", max_tasks=2, liveness_timeout_s=3)
    first = start_worker(service, site, "w-doomed")
    try:
        wait_for(lambda: running_task_processes(first), 240, "a realisation's ranks", worker=first)
        first.remember_descendants()
        first.kill()  # SIGKILL: no drain, no report, no cleanup
        # Dead-man switch: the orphaned tasks end themselves, every rank included.
        assert wait_for_no_task_processes(first.marker_prefix, timeout=30) == []
        # Parsl's interchange dies with the worker (parent-death signal), the pool after its heartbeat threshold.
        wait_for(
            lambda: not any(pid_alive(p.pid) for p in first.descendants), 60, "the killed worker's processes to end"
        )

        second = start_worker(service, site, "w-rescue")
        try:
            assert api.wait_state(campaign["id"], {"succeeded", "failed"}, 300, second)["state"] == "succeeded"
        finally:
            assert second.stop(timeout=60) == 0
    finally:
        if first.process.poll() is None:
            first.kill()
    lost = 0
    for realization in api.realizations(campaign["id"]):
        assert realization["state"] == "succeeded" and realization["result"]["realization"] == realization["index"]
        [success] = succeeded_attempts(realization)  # succeeded exactly once
        assert success["worker"] == "w-rescue"
        others = [a for a in realization["attempt_history"] if a is not success]
        assert all(a["failure_class"] == "lost_worker" and a["worker"] == "w-doomed" for a in others)
        lost += len(others)
    assert lost >= 1
    assert task_processes(first.marker_prefix) == []
    assert_campaign_sound(api, service, campaign["id"], [first.marker_prefix])
    record("faults", f"SIGKILL of the worker: {lost} attempt(s) lost_worker, campaign succeeded on a second worker")
    api.close()


@on_database("sqlite")
def test_crashing_realisation_is_retried_then_failed_with_class_and_log_tail(make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    skies = tmp_path / "skies"
    (skies / "broken").mkdir(parents=True)
    # A map the site declares (so the submit passes) that the map-maker cannot read: the realisation crashes.
    (skies / "broken" / "sky.fits").write_bytes(b"not a FITS file\n" * 100)
    spec = tiny_spec("crash", realizations=1, max_attempts=2, sky={"kind": "map", "path": "broken/sky.fits"})
    worker = start_worker(service, write_site(tmp_path / "site.toml", sky_root=skies), "w-crash")
    try:
        wait_for(lambda: api.client.get("/workers").json(), 60, "the worker's registration", worker=worker)
        campaign = api.create(spec)
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, 240, worker)
    finally:
        assert worker.stop(timeout=60) == 0
    assert done["state"] == "failed" and "1 of 1 realisations failed" in done["failure_cause"]
    [realization] = api.realizations(campaign["id"])
    assert realization["state"] == "failed" and realization["attempts"] == 2
    attempts = realization["attempt_history"]
    assert [a["failure_class"] for a in attempts] == ["app_error", "app_error"]
    assert all(a["exit_code"] == 2 for a in attempts)
    assert all("cannot read an IQU map" in a["log_tail"] and "sky.fits" in a["log_tail"] for a in attempts)
    assert task_processes(worker.marker_prefix) == []
    api.close()


@on_database("postgresql")
def test_walltime_kills_the_whole_task_and_retries_per_policy(make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    # A solve that cannot converge (tol 1e-30): killed mid-solve, never racing its own last write to the limit
    # (on a fast machine the plain long spec finished its products right at 2 s, and left them behind).
    spec = long_spec("too slow", realizations=1, max_attempts=2, **{"resources.walltime_s": 2.0})
    spec["solver"] = {"tol": 1e-30, "max_iter": 10_000}
    campaign = api.create(spec)
    worker = start_worker(service, write_site(tmp_path / "site.toml"), "w-walltime")
    try:
        wait_for(lambda: running_task_processes(worker), 240, "the ranks of the first attempt", worker=worker)
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, 240, worker)
        assert task_processes(worker.marker_prefix) == []  # no survivor, right when the service hears of it
    finally:
        assert worker.stop(timeout=60) == 0
    assert done["state"] == "failed"
    [realization] = api.realizations(campaign["id"])
    attempts = realization["attempt_history"]
    assert [a["failure_class"] for a in attempts] == ["walltime", "walltime"]
    assert all("walltime" in a["log_tail"] for a in attempts)
    attempt_dirs = worker.site_data / "campaigns" / str(campaign["id"]) / "realizations" / "0"
    assert not any(attempt_dirs.glob("attempt-*")) and not any(attempt_dirs.glob(".attempt-*"))  # nothing half-written
    assert "1 of 1 realisations failed" in done["failure_cause"]
    assert_campaign_sound(api, service, campaign["id"], [worker.marker_prefix])
    record("faults", f"wall time exceeded: campaign failed, cause {done['failure_cause']!r}, attempts walltime x2")
    api.close()


@on_database("postgresql")
def test_cancelled_campaign_kills_its_running_tasks(make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    campaign = api.create(long_spec("cancel me", realizations=3))
    worker = start_worker(service, write_site(tmp_path / "site.toml", max_tasks=2), "w-cancel")
    try:
        running = wait_for(lambda: running_task_processes(worker), 240, "running ranks", worker=worker)
        launched = {marker.rsplit(":", 1)[1] for _, marker, _ in running}  # task ids whose ranks are up
        answer = api.client.post(f"/campaigns/{campaign['id']}/cancel", json={"reason": "test"})
        assert answer.status_code == 200, answer.text
        assert wait_for_no_task_processes(worker.marker_prefix, timeout=30) == []

        def reported() -> dict[str, dict]:
            attempts = {a["task_id"]: a for r in api.realizations(campaign["id"]) for a in r["attempt_history"]}
            done = all(attempts[task]["exit_code"] is not None for task in launched if task in attempts)
            return attempts if done and launched <= set(attempts) else {}

        attempts = wait_for(reported, 30, "the worker's reports of the killed attempts", worker=worker)
        assert all(a["failure_class"] == "cancelled" for a in attempts.values())
        for task in launched:  # the worker's report adds the exit code and log tail of each killed job
            assert "cancelled" in attempts[task]["log_tail"] and "ending every process" in attempts[task]["log_tail"]
        assert api.state(campaign["id"]) == "cancelled"
        assert {r["state"] for r in api.realizations(campaign["id"])} == {"cancelled"}
        # The worker goes on: a new campaign still runs.
        after = api.create(tiny_spec("after the cancel", realizations=1))
        assert api.wait_state(after["id"], {"succeeded", "failed"}, 240, worker)["state"] == "succeeded"
    finally:
        assert worker.stop(timeout=60) == 0
    api.close()


@on_database("sqlite")
def test_sigterm_drains_running_tasks_then_hands_back_what_is_left(make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    campaign = api.create(long_spec("drain", realizations=2, max_attempts=1))
    site = write_site(tmp_path / "site.toml", max_tasks=1)

    # A drain long enough: the running realisation finishes and is reported; nothing new is claimed.
    patient = start_worker(service, site, "w-patient", env={"MAPCAMPAIGN_WORKER_DRAIN_S": "300"})
    wait_for(lambda: running_task_processes(patient), 240, "the first realisation running", worker=patient)
    started = time.monotonic()
    assert patient.stop(signal.SIGTERM, timeout=240) == 0, patient.log_tail()
    assert time.monotonic() - started < 240
    states = [r["state"] for r in api.realizations(campaign["id"])]
    assert states == ["succeeded", "queued"], patient.log_tail()

    # A drain too short: the running realisation is ended and handed back to the queue, uncharged:
    # with max_attempts 1 it is queued again rather than failed.
    hasty = start_worker(service, site, "w-hasty", env={"MAPCAMPAIGN_WORKER_DRAIN_S": "0.5"})
    wait_for(lambda: running_task_processes(hasty), 240, "the second realisation running", worker=hasty)
    assert hasty.stop(signal.SIGTERM, timeout=120) == 0, hasty.log_tail()
    assert task_processes(hasty.marker_prefix) == []
    realization = api.realization(campaign["id"], 1)
    assert realization["state"] == "queued"
    [attempt] = realization["attempt_history"]
    assert attempt["failure_class"] == "drained" and attempt["worker"] == "w-hasty"
    assert "drain" in attempt["log_tail"]
    api.close()


@on_database("sqlite")
def test_sigterm_hands_back_at_once_a_task_still_waiting_for_its_block(make_live_service, tmp_path):
    """A block that takes minutes to start (``worker_init`` sleeps, as a batch job waits in the queue):
    the claimed plan build is handed back as ``drained`` at SIGTERM, not after the 300 s drain."""
    service = make_live_service(env=FAST)
    api = Api(service)
    campaign = api.create(tiny_spec("waits for a block", realizations=1))
    site = write_site(tmp_path / "site.toml", max_tasks=1)
    site.write_text(site.read_text().replace('kind = "local"', 'kind = "local"\nworker_init = "sleep 600"', 1))
    worker = start_worker(service, site, "w-queued", env={"MAPCAMPAIGN_WORKER_DRAIN_S": "300"})
    wait_for(api.plans, 120, "the plan build claimed", worker=worker)
    started = time.monotonic()
    assert worker.stop(signal.SIGTERM, timeout=120) == 0, worker.log_tail()
    assert time.monotonic() - started < 100, "the worker waited for the drain instead of handing the build back"
    [plan] = api.plans()
    assert plan["state"] == "failed" and "drained" in plan["last_error"], plan
    assert plan["build_attempts"] == 0  # not charged
    assert api.campaign(campaign["id"])["state"] == "queued"
    api.close()


@on_database("sqlite")
def test_refused_plan_is_invalidated_rebuilt_and_the_attempt_retried(make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    site = write_site(tmp_path / "site.toml", max_tasks=1)
    first = api.create(tiny_spec("builds the plan", realizations=1))
    worker = start_worker(service, site, "w-plan-1")
    try:
        assert api.wait_state(first["id"], {"succeeded", "failed"}, 240, worker)["state"] == "succeeded"
    finally:
        assert worker.stop(timeout=60) == 0
    [plan] = api.plans()
    plan_file = Path(plan["path"])
    damaged = bytearray(plan_file.read_bytes())
    middle = len(damaged) // 2
    damaged[middle : middle + 64] = bytes(64)  # damage a section in place: same size, wrong contents
    plan_file.write_bytes(bytes(damaged))

    second = api.create(tiny_spec("gets the damaged plan", realizations=1, seed=8))
    worker = start_worker(service, site, "w-plan-2")
    try:
        assert api.wait_state(second["id"], {"succeeded", "failed"}, 240, worker)["state"] == "succeeded"
    finally:
        assert worker.stop(timeout=60) == 0
    [realization] = api.realizations(second["id"])
    refused, success = realization["attempt_history"]
    assert (refused["failure_class"], refused["exit_code"]) == ("app_error", 3)
    assert "plan refused" in refused["log_tail"]
    assert success["failure_class"] is None and success["exit_code"] == 0
    [rebuilt] = api.plans()
    assert rebuilt["id"] == plan["id"] and rebuilt["state"] == "ready" and rebuilt["path"] != plan["path"]
    assert Path(rebuilt["path"]).is_file() and rebuilt["build_attempts"] == 1  # a fresh budget for the rebuild
    invalidated = [e for e in api.events() if e["kind"] == "plan" and e["data"].get("invalidated")]
    assert len(invalidated) == 1 and "w-plan-2" in invalidated[0]["data"]["error"]
    builds = [e for e in api.events() if e["kind"] == "plan" and e["state"] == "building"]
    assert len(builds) == 2
    assert_campaign_sound(api, service, second["id"], [worker.marker_prefix])
    record("faults", "damaged plan file: the attempt refused it (exit 3), plan rebuilt once, campaign succeeded")
    api.close()


@on_database("sqlite")
def test_refused_coupling_file_is_removed_rebuilt_and_recorded_leaving_the_plan_alone(make_live_service, tmp_path):
    """A damaged coupling file: the map-maker refuses it (exit 4), the worker removes it and reports ``site_error``
    (no attempt used), the plan stays ready, the retry builds the coupling again, and the service's couplings
    record counts both accepted realisations."""
    service = make_live_service(env=FAST)
    api = Api(service)
    site = write_site(tmp_path / "site.toml", max_tasks=1)
    first = api.create(tiny_spec("builds the coupling", realizations=1))
    worker = start_worker(service, site, "w-coupling-1")
    try:
        assert api.wait_state(first["id"], {"succeeded", "failed"}, 240, worker)["state"] == "succeeded"
    finally:
        assert worker.stop(timeout=60) == 0
    [plan] = api.plans()
    [coupling_file] = (worker.site_data / "couplings").glob("*.npz")
    [recorded] = api.client.get("/couplings").json()["items"]
    assert recorded["uses"] == 1 and recorded["file_sha256"] == hashlib.sha256(coupling_file.read_bytes()).hexdigest()
    assert recorded["size_bytes"] == coupling_file.stat().st_size and recorded["build_time_s"] > 0
    coupling_file.write_bytes(b"not a coupling any more")

    second = api.create(tiny_spec("gets the damaged coupling", realizations=1, seed=8))
    worker = start_worker(service, site, "w-coupling-2")
    try:
        assert api.wait_state(second["id"], {"succeeded", "failed"}, 240, worker)["state"] == "succeeded"
    finally:
        assert worker.stop(timeout=60) == 0
    [realization] = api.realizations(second["id"])
    refused, success = realization["attempt_history"]
    assert (refused["failure_class"], refused["exit_code"]) == ("site_error", 4)
    assert "is not a readable coupling file" in refused["log_tail"]
    assert success["failure_class"] is None and success["exit_code"] == 0
    assert realization["result"]["spectra"]["bandpowers"]["coupling_source"] == "built"
    [still] = api.plans()  # the overlap plan was not in question: not invalidated, not rebuilt, used again
    assert {**still, "uses": plan["uses"]} == plan and still["uses"] == 2
    assert not [e for e in api.events() if e["kind"] == "plan" and e["data"].get("invalidated")]
    # The same mask and binning give the same bytes: the rebuilt file is the one recorded, so no checksum warning.
    rebuilt = hashlib.sha256(coupling_file.read_bytes()).hexdigest()
    [coupling] = api.client.get("/couplings").json()["items"]
    assert coupling["id"] == recorded["id"] and coupling["uses"] == 2
    assert coupling["file_sha256"] == rebuilt == recorded["file_sha256"]
    assert [c["id"] for c in coupling["campaigns"]] == [second["id"], first["id"]]
    assert not [e for e in api.events() if e["kind"] == "coupling"]
    assert_campaign_sound(api, service, second["id"], [worker.marker_prefix])
    api.close()
