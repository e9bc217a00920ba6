"""The site worker on a real batch scheduler: live service, ``mapcampaign worker`` with a Slurm site
(Parsl SlurmProvider + MPIExecutor), the local Slurm of deploy/slurm/start-local-slurm.

* a block cancelled with ``scancel`` under a running realisation: ``lost_worker``, back to the queue,
  retried in a new block; the block runs Hydra's ``mpiexec`` inside it (deploy/sites/slurm-mpiexec.toml).

A campaign through ``srun``, a block that reaches its Slurm time limit and the other faults of a cluster
are in test_slurm_multinode.py.
"""

from __future__ import annotations

from tests.support.local_slurm import SLURM_WORKER_MARKS, scancel, scontrol_job, write_slurm_site
from tests.support.worker_helpers import Api, long_spec, start_worker, wait_running_with_job

pytestmark = SLURM_WORKER_MARKS

FAST = {"MAPCAMPAIGN_LEASE_S": "30", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.5"}


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
