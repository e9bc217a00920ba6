"""What the worker and Parsl ask the real local Slurm about jobs it does not know or that are gone."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.local_slurm import SBIN_PATH
from worker.scheduler import BlockEnding, block_ending, slurm_job_fields

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

UNKNOWN_JOB = "987654321"


def sbatch(*args: str) -> str:
    done = subprocess.run(
        ["sbatch", "--parsable", *args], check=False, capture_output=True, text=True, timeout=60, env={"PATH": SBIN_PATH}
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_the_worker_asks_slurm_about_a_job_it_does_not_know_without_harm(local_slurm, monkeypatch):
    monkeypatch.setenv("PATH", SBIN_PATH)  # the real scontrol answers (a missing one would give None too)
    asked = subprocess.run(["scontrol", "show", "job", "-o", UNKNOWN_JOB], check=False, capture_output=True, text=True, timeout=60)
    assert asked.returncode != 0 and "invalid job id" in asked.stderr.lower(), asked.stderr
    assert slurm_job_fields(UNKNOWN_JOB) is None
    assert block_ending("slurm", UNKNOWN_JOB, settle_s=0) is None


def test_a_cancelled_job_is_an_ended_block(local_slurm, monkeypatch):
    monkeypatch.setenv("PATH", SBIN_PATH)
    job = sbatch("-p", local_slurm.partition, "--wrap", "sleep 300")
    subprocess.run(["scancel", job], check=True, timeout=60, env={"PATH": SBIN_PATH})
    assert block_ending("slurm", job) is BlockEnding.ENDED


def test_a_block_slurm_no_longer_knows_counts_as_completed(local_slurm, tmp_path, monkeypatch):
    """Parsl polls squeue (no accounting here); squeue fails outright when it knows none of the ids.
    Parsl's own provider would then keep the block RUNNING for ever; the worker's takes it as done."""
    from parsl.jobs.states import JobState, JobStatus
    from parsl.launchers import SimpleLauncher

    from worker.parsl_config import SlurmBlockProvider

    monkeypatch.setenv("PATH", SBIN_PATH)
    provider = SlurmBlockProvider(partition=local_slurm.partition, launcher=SimpleLauncher(), cmd_timeout=30)
    provider.script_dir = str(tmp_path)
    provider.resources[UNKNOWN_JOB] = {
        "job_id": UNKNOWN_JOB,
        "status": JobStatus(JobState.RUNNING),
        "job_stdout_path": None,
        "job_stderr_path": None,
    }
    [status] = provider.status([UNKNOWN_JOB])
    assert status.state is JobState.COMPLETED
