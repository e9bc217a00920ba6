"""Ask the batch scheduler why a block (batch job) ended: :func:`block_ending`.

A task whose block went away is first classified ``lost_worker``: the runner
was signalled, or Parsl lost the block's worker pool. The worker can tell
more from the scheduler, using the job id the runner recorded
(``SLURM_JOB_ID`` / ``PBS_JOBID``): a block ended at its wall-time limit
makes the task's attempt a ``walltime`` failure, a Slurm job ended by the
loss of one of its nodes (``NODE_FAIL``) a ``node_failure``, anything else
(``scancel``, ``qdel``, preemption, a requeue) stays ``lost_worker``. A
cluster that requeues a job after a node failure (Slurm's ``JobRequeue=1``)
shows it pending again, which cannot be told from a requeue: ``lost_worker``.

A block usually runs several tasks, and they are all lost together:
:class:`BlockEndings` asks once per job and gives the answer to every task
of it, so the report threads do not each wait out the settling time.

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
import threading
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
    NODE_FAILURE = "node_failure"  # a node of the job stopped answering and the scheduler ended the job
    ENDED = "ended"  # cancelled, failed, preempted: anything else


def _run(args: list[str], timeout_s: float) -> str | None:
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, check=False
        )
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
    if state == "NODE_FAIL":
        return BlockEnding.NODE_FAILURE
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
    query, decide = (slurm_job_fields, _slurm_ending) if provider_kind == "slurm" else (pbs_job_fields, _pbs_ending)
    give_up = time.monotonic() + settle_s
    while True:
        fields = query(job_id, timeout_s=timeout_s)
        if fields is None:
            return None  # the scheduler does not know this job: nothing to add
        ending = decide(fields)
        if ending is not None or time.monotonic() >= give_up:
            return ending
        time.sleep(SETTLE_POLL_S)


# How long an answer about one job is reused: a final state for good (it cannot change), anything else
# (still running after settling, unknown to the scheduler) briefly, so a later task may ask afresh.
FINAL_ANSWER_TTL_S = 3600.0
OPEN_ANSWER_TTL_S = 30.0
MAX_CACHED_JOBS = 1024


class BlockEndings:
    """:func:`block_ending` asked at most once per batch job at a time, its answers shared (thread-safe).

    The tasks of one block end together and their reports run on several
    threads; without this each would query the scheduler and wait up to
    ``settle_s`` for the same job. Callers for the same job wait for the one
    query in flight; other jobs are not held up.
    """

    def __init__(
        self,
        *,
        settle_s: float = SETTLE_S,
        timeout_s: float = QUERY_TIMEOUT_S,
        open_answer_ttl_s: float = OPEN_ANSWER_TTL_S,
    ):
        self.settle_s = settle_s
        self.timeout_s = timeout_s
        self.open_answer_ttl_s = open_answer_ttl_s
        self.queries = 0  # scheduler queries made (each up to settle_s of polling)
        self._lock = threading.Lock()
        self._job_locks: dict[tuple[str, str], threading.Lock] = {}
        self._answers: dict[tuple[str, str], tuple[BlockEnding | None, float]] = {}

    def __call__(self, provider_kind: str, job_id: str | None) -> BlockEnding | None:
        if not job_id or provider_kind not in ("slurm", "pbspro"):
            return None
        key = (provider_kind, job_id)
        with self._lock:
            job_lock = self._job_locks.setdefault(key, threading.Lock())
        with job_lock:
            with self._lock:
                answer = self._answers.get(key)
            if answer is not None and answer[1] > time.monotonic():
                return answer[0]
            with self._lock:
                self.queries += 1
            ending = block_ending(provider_kind, job_id, settle_s=self.settle_s, timeout_s=self.timeout_s)
            ttl = FINAL_ANSWER_TTL_S if ending is not None else self.open_answer_ttl_s
            with self._lock:
                self._answers.pop(key, None)  # re-inserted last: the dict's order is the order of asking
                self._answers[key] = (ending, time.monotonic() + ttl)
                self._forget_expired()
            return ending

    def _forget_expired(self) -> None:
        if len(self._answers) <= MAX_CACHED_JOBS:
            return
        now = time.monotonic()
        for key in [k for k, (_, expires) in self._answers.items() if expires <= now]:
            del self._answers[key]
            self._job_locks.pop(key, None)
        while len(self._answers) > MAX_CACHED_JOBS:  # still full of live answers: drop the oldest asked
            key = next(iter(self._answers))
            del self._answers[key]
            self._job_locks.pop(key, None)
