"""Ask the batch scheduler why a block (batch job) ended: :func:`block_ending`.

A task whose block went away is first classified ``lost_worker``: the runner
was signalled, or Parsl lost the block's worker pool. The worker can tell
more from the scheduler, using the job id the runner recorded
(``SLURM_JOB_ID`` / ``PBS_JOBID``): a block ended at its wall-time limit
makes the task's attempt a ``walltime`` failure, anything else (``scancel``,
``qdel``, node failure, preemption) stays ``lost_worker``.

Only ever a best effort: a scheduler command that is missing, slow, fails,
or does not know the job (purged after ``MinJobAge``, another cluster, a job
this worker never submitted) gives ``None`` and the classification stays
as it was. Nothing here raises.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import shutil
import subprocess
import time

log = logging.getLogger("mapcampaign.worker")

QUERY_TIMEOUT_S = 15.0
# Slurm sets the final state a moment after it signals the job's processes; the runner may report first.
SETTLE_S = 8.0
SETTLE_POLL_S = 0.5
_JOB_ID = re.compile(r"^[A-Za-z0-9_.\[\]-]{1,100}$")  # Slurm "123", "123_4"; PBS "123.server", "123[4].server"
PBS_WALLTIME_EXIT = -29  # PBS Pro JOB_EXEC_KILL_WALLTIME


class BlockEnding(str, enum.Enum):
    WALLTIME = "walltime"  # the scheduler ended the job at its time limit
    ENDED = "ended"  # cancelled, failed, preempted, node failure: anything but the time limit


def _run(args: list[str], timeout_s: float) -> str | None:
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as error:
        log.debug("%s: %s", " ".join(args), error)
        return None
    if done.returncode != 0:  # e.g. "slurm_load_jobs error: Invalid job id specified"
        log.debug("%s exited %d: %s", " ".join(args), done.returncode, done.stderr.strip()[:300])
        return None
    return done.stdout


def slurm_job_fields(job_id: str, *, timeout_s: float = QUERY_TIMEOUT_S) -> dict[str, str] | None:
    """``scontrol show job -o ID`` as a dict; None when Slurm does not know the job (or cannot be asked)."""
    if not _JOB_ID.match(job_id):
        return None
    text = _run(["scontrol", "show", "job", "-o", job_id], timeout_s)
    if not text or not text.strip():
        return None
    fields: dict[str, str] = {}
    for item in text.split():
        key, separator, value = item.partition("=")
        if separator:
            fields.setdefault(key, value)
    return fields if fields.get("JobId") else None


def _slurm_ending(fields: dict[str, str]) -> BlockEnding | None:
    state, reason = fields.get("JobState", ""), fields.get("Reason", "")
    if state in ("TIMEOUT", "DEADLINE") or reason == "TimeLimit":
        return BlockEnding.WALLTIME
    if state in ("PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "RESIZING", "REQUEUED", ""):
        return None  # not final yet
    return BlockEnding.ENDED


def pbs_job_fields(job_id: str, *, timeout_s: float = QUERY_TIMEOUT_S) -> dict | None:
    """``qstat -fx -F json ID``: the job's attributes (finished jobs too, with job history on); None if unknown."""
    if not _JOB_ID.match(job_id):
        return None
    text = _run(["qstat", "-fx", "-F", "json", job_id], timeout_s)
    try:
        jobs = json.loads(text or "").get("Jobs") or {}
    except (ValueError, AttributeError):
        return None
    return next(iter(jobs.values()), None) if isinstance(jobs, dict) else None


def _pbs_ending(fields: dict) -> BlockEnding | None:
    if fields.get("job_state") not in ("F", "X"):
        return None
    exit_status = fields.get("Exit_status")
    comment = str(fields.get("comment", ""))
    if exit_status == PBS_WALLTIME_EXIT or "walltime" in comment.lower():
        return BlockEnding.WALLTIME
    return BlockEnding.ENDED


def block_ending(
    provider_kind: str, job_id: str | None, *, settle_s: float = SETTLE_S, timeout_s: float = QUERY_TIMEOUT_S
) -> BlockEnding | None:
    """Why the batch job ``job_id`` ended, per the scheduler; None when unknown, still running, or not a batch site.

    Waits up to ``settle_s`` for the job to reach a final state (the runner often reports
    the signal it got before the scheduler has finished ending the job).
    """
    if not job_id or provider_kind not in ("slurm", "pbspro"):
        return None
    query, decide = (
        (slurm_job_fields, _slurm_ending) if provider_kind == "slurm" else (pbs_job_fields, _pbs_ending)
    )
    give_up = time.monotonic() + settle_s
    while True:
        fields = query(job_id, timeout_s=timeout_s)
        if fields is None:
            return None  # the scheduler does not know this job: nothing to add
        ending = decide(fields)
        if ending is not None or time.monotonic() >= give_up:
            return ending
        time.sleep(SETTLE_POLL_S)
