"""Run a real ``mapcampaign worker`` against a live service in tests (and the dispatch benchmark).

Specs are tiny (nside 8-16, minutes to a day of 10 Hz data) so a realisation
takes seconds; ``long_spec`` takes several seconds inside the map-maker, long
enough to kill, cancel or time out in the middle.
"""

from __future__ import annotations

import psutil

from benchmarks._support import (
    Api,
    WorkerProcess,
    long_spec,
    start_worker,
    task_processes,
    tiny_spec,
    wait_for,
    write_site,
)

__all__ = [
    "Api",
    "WorkerProcess",
    "long_spec",
    "pid_alive",
    "running_task_processes",
    "start_worker",
    "tiny_spec",
    "wait_for",
    "write_site",
]


def running_task_processes(
    worker: WorkerProcess, minimum: int = 3, kind: str = "realize"
) -> list[tuple[int, str, str]] | None:
    """The worker's processes of ``kind`` tasks once an MPI job is up (mpiexec, proxy, ranks), else None."""
    found = [entry for entry in task_processes(worker.marker_prefix) if f":{kind}-" in entry[1]]
    ranks = [entry for entry in found if "mapmaker" in entry[2] and "mpiexec" not in entry[2]]
    return found if len(found) >= minimum and ranks else None


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_running_with_job(api: Api, campaign_id: int, worker, timeout: float = 300) -> str:
    """The Slurm job id of realisation 0's running attempt, once the worker reported it started."""

    def job() -> str | None:
        realization = api.realization(campaign_id, 0)
        history = realization["attempt_history"]
        if realization["state"] == "running" and history and history[-1]["scheduler_job_id"]:
            return history[-1]["scheduler_job_id"]
        return None

    return wait_for(job, timeout, "realisation 0 running in a Slurm job", worker=worker)
