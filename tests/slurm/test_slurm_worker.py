"""The site worker on a real batch scheduler: live service, ``mapcampaign worker`` with a Slurm site
(Parsl SlurmProvider + MPIExecutor), the single-node Slurm of deploy/slurm/start-local-slurm.

* a campaign finishes through Slurm with ``srun`` (deploy/sites/slurm.toml), and every attempt records
  the block's Slurm job id; the other tests run Hydra's ``mpiexec`` inside the block (slurm-mpiexec.toml),
  the scancel one through to a successful retry;
* a block cancelled with ``scancel`` under a running realisation: ``lost_worker``, back to the queue,
  retried in a new block;
* a block that reaches its Slurm time limit under a running realisation: ``walltime``, back to the queue.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.local_slurm import scancel, scontrol_job
from tests.support.worker_helpers import Api, long_spec, start_worker, tiny_spec, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.mpi, pytest.mark.timeout(600)]

FAST = {"MAPCAMPAIGN_LEASE_S": "30", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.5"}
VENV_BIN = Path(sys.executable).parent
SITES = Path(__file__).resolve().parents[2] / "deploy" / "sites"


def on_sqlite() -> pytest.MarkDecorator:
    # The worker's protocol runs on both databases in tests/integration; here the scheduler is under test.
    return pytest.mark.parametrize("database_kind", ["sqlite"], indirect=True)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def write_slurm_site(
    path: Path,
    *,
    partition: str,
    launcher: str = "mpiexec",
    walltime: str = "00:10:00",
    python: Path | None = None,
) -> Path:
    """The bundled deploy/sites/slurm{,-mpiexec}.toml, with test-sized timings: the files users start from."""
    bundled = SITES / ("slurm.toml" if launcher == "srun" else "slurm-mpiexec.toml")
    site = tomllib.loads(bundled.read_text())
    site["name"] = "slurm-test"
    if python is not None:
        site["python"] = str(python)
    site["provider"].update(partition=partition, walltime=walltime)
    site["executor"].update(
        heartbeat_period_s=1,  # a lost block is noticed in seconds
        heartbeat_threshold_s=10,
        max_idletime_s=5,
        strategy_period_s=0.5,
    )
    site["runner"].update(kill_grace_s=1, liveness_timeout_s=60)  # grace below Slurm's KillWait (5 s here)
    lines = [f"{key} = {toml_value(value)}" for key, value in site.items() if not isinstance(value, dict)]
    for table, values in site.items():
        if isinstance(values, dict):
            lines += [f"[{table}]", *(f"{key} = {toml_value(value)}" for key, value in values.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def job_ids(realization: dict) -> list[str | None]:
    return [attempt["scheduler_job_id"] for attempt in realization["attempt_history"]]


@on_sqlite()
@pytest.mark.parametrize("launcher", ["srun"])  # the scancel and time-limit tests below run the mpiexec site
def test_campaign_runs_through_slurm(local_slurm, make_live_service, tmp_path, launcher):
    service = make_live_service(env=FAST)
    api = Api(service)
    spec = tiny_spec(f"slurm {launcher}", realizations=2, **{"pixelization.nside": 16, "resources.ranks": 2})
    campaign = api.create(spec)
    site = write_slurm_site(tmp_path / "slurm.toml", partition=local_slurm.partition, launcher=launcher)
    worker = start_worker(service, site, f"w-slurm-{launcher}", site="slurm-test")
    try:
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, timeout=400, worker=worker)
        assert done["state"] == "succeeded", worker.log_tail()
        for realization in api.realizations(campaign["id"]):
            [attempt] = realization["attempt_history"]
            job_id = attempt["scheduler_job_id"]
            assert job_id and job_id.isdigit(), realization
            job = scontrol_job(job_id)  # the block: a batch job Parsl submitted for this worker
            assert job.get("JobName", "").startswith("parsl."), job
            assert realization["result"]["ranks"] == 2
        assert worker.stop() == 0, worker.log_tail()
    finally:
        worker.stop()
        api.close()


def write_sleeping_python(path: Path) -> Path:
    """A stand-in for the nodes' Python whose map-maker ranks sleep: a realisation that outlives its block.

    Everything else (the task runner, the interchange, the worker pool) runs the real Python.
    """
    path.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2 $3 $4 $5" = "-m mpi4py -m mapmaker realize" ] && exec sleep 900\n'
        f'exec {VENV_BIN / "python"} "$@"\n'
    )
    path.chmod(0o755)
    return path


def wait_running_with_job(api: Api, campaign_id: int, worker, timeout: float = 300) -> str:
    """The Slurm job id of realisation 0's running attempt, once the worker reported it started."""

    def job() -> str | None:
        realization = api.realization(campaign_id, 0)
        history = realization["attempt_history"]
        if realization["state"] == "running" and history and history[-1]["scheduler_job_id"]:
            return history[-1]["scheduler_job_id"]
        return None

    return wait_for(job, timeout, "realisation 0 running in a Slurm job", worker=worker)


@on_sqlite()
def test_scancel_of_the_block_requeues_the_realisation_as_lost_worker(local_slurm, make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    campaign = api.create(long_spec("scancel", realizations=1, max_attempts=3, **{"resources.ranks": 2}))
    site = write_slurm_site(tmp_path / "slurm.toml", partition=local_slurm.partition)
    worker = start_worker(service, site, "w-scancel", site="slurm-test")
    try:
        job_id = wait_running_with_job(api, campaign["id"], worker)
        scancel(job_id)
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, timeout=400, worker=worker)
        assert done["state"] == "succeeded", worker.log_tail()
        realization = api.realization(campaign["id"], 0)
        first, *rest = realization["attempt_history"]
        assert first["failure_class"] == "lost_worker" and first["scheduler_job_id"] == job_id, first
        assert rest and rest[-1]["failure_class"] is None and rest[-1]["scheduler_job_id"] != job_id, rest
        assert scontrol_job(job_id).get("JobState") == "CANCELLED"
        assert worker.process.poll() is None  # the worker carried on
    finally:
        worker.stop()
        api.close()


@on_sqlite()
def test_block_time_limit_fails_the_attempt_as_walltime_and_requeues(local_slurm, make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    # The task's own limit is far away: only the block's (one minute, Slurm's smallest) can end it.
    spec = tiny_spec("block time limit", realizations=1, max_attempts=2, **{"resources.walltime_s": 3_000.0})
    campaign = api.create(spec)
    (tmp_path / "bin").mkdir()
    python = write_sleeping_python(tmp_path / "bin" / "python")
    site = write_slurm_site(
        tmp_path / "slurm.toml", partition=local_slurm.partition, walltime="00:01:00", python=python
    )
    worker = start_worker(
        service, site, "w-timelimit", site="slurm-test", env={"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    )
    try:
        job_id = wait_running_with_job(api, campaign["id"], worker)

        def first_attempt_ended() -> dict | None:
            history = api.realization(campaign["id"], 0)["attempt_history"]
            return history[0] if history[0]["ended_at"] else None

        first = wait_for(first_attempt_ended, 240, "the block's time limit to end attempt 1", worker=worker)
        assert first["failure_class"] == "walltime", (first, worker.log_tail())
        assert first["scheduler_job_id"] == job_id
        assert scontrol_job(job_id).get("JobState") == "TIMEOUT"
        # Attempts remain: the realisation is queued again (and claimed again by the same worker).
        realization = api.realization(campaign["id"], 0)
        assert realization["state"] in {"queued", "claimed", "running"}, realization
        assert worker.process.poll() is None
        api.client.post(f"/campaigns/{campaign['id']}/cancel", json={})
    finally:
        worker.stop()
        api.close()
