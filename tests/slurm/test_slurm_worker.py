"""The site worker on a real batch scheduler: live service, ``mapcampaign worker`` with a Slurm site
(Parsl SlurmProvider + MPIExecutor), the local Slurm of deploy/slurm/start-local-slurm.

* a campaign finishes through Slurm with ``srun`` (deploy/sites/slurm.toml), and every attempt records
  the block's Slurm job id; the other tests run Hydra's ``mpiexec`` inside the block (slurm-mpiexec.toml),
  the scancel one through to a successful retry;
* a block cancelled with ``scancel`` under a running realisation: ``lost_worker``, back to the queue,
  retried in a new block.

A block that reaches its Slurm time limit, and the other faults of a cluster, are in test_slurm_multinode.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.local_slurm import scancel, scontrol_job, write_slurm_site
from tests.support.worker_helpers import Api, long_spec, start_worker, tiny_spec, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.mpi, pytest.mark.timeout(600)]

FAST = {"MAPCAMPAIGN_LEASE_S": "30", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.5"}
VENV_BIN = Path(sys.executable).parent
BUNDLED = {"srun": "slurm.toml", "mpiexec": "slurm-mpiexec.toml"}


def on_sqlite() -> pytest.MarkDecorator:
    # The worker's protocol runs on both databases in tests/integration; here the scheduler is under test.
    return pytest.mark.parametrize("database_kind", ["sqlite"], indirect=True)


def job_ids(realization: dict) -> list[str | None]:
    return [attempt["scheduler_job_id"] for attempt in realization["attempt_history"]]


@on_sqlite()
@pytest.mark.parametrize("launcher", ["srun"])  # the scancel and time-limit tests below run the mpiexec site
def test_campaign_runs_through_slurm(local_slurm, make_live_service, tmp_path, launcher):
    service = make_live_service(env=FAST)
    api = Api(service)
    spec = tiny_spec(f"slurm {launcher}", realizations=2, **{"pixelization.nside": 16, "resources.ranks": 2})
    campaign = api.create(spec)
    site = write_slurm_site(tmp_path / "slurm.toml", partition=local_slurm.partition, bundled=BUNDLED[launcher])
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
