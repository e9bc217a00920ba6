"""How a task ended: one enum, :class:`Outcome`, and the pure function that decides it, :func:`classify`.

The evidence, in order of trust:

1. ``status.json`` from :mod:`worker.runner` (how the task ended, the command's exit code);
2. the Parsl future's exception, when the runner never wrote a status (``ManagerLost``:
   the block or its node went away; anything else: the task could not be launched);
3. what the worker itself asked for (cancel file) when the runner never started;
4. the tail of the task's stderr, for the out-of-memory and launch-failure signatures.

=========================  =====================================================  ==================
outcome                    when                                                   reported as
=========================  =====================================================  ==================
``succeeded``              the command exited 0                                   succeeded / plan-built
``app_error``              it exited non-zero (2: bad input; 1: crash)            ``app_error``
``plan_refused``           ``realize`` exited 3: the plan does not match or is    ``app_error`` (and the
                           corrupted                                              plan is invalidated)
``coupling_refused``       ``realize`` exited 4: the site's coupling file was      ``site_error`` (the worker
                           built for another mask, binning or estimator, or is    removes the file; the
                           damaged                                                plan is left alone)
``walltime``               the runner killed it at ``resources.walltime_s``, or   ``walltime``
                           the scheduler ended its block at the block's time
                           limit (:mod:`worker.scheduler`)
``oom``                    a rank was SIGKILLed by someone else (the kernel's     ``oom``
                           OOM killer), or Python raised MemoryError
``launch_error``           the runner or the MPI launcher could not start it      ``launch_error``
                           (exit 126/127, Hydra/srun launch errors, Parsl refused)
``site_error``             the worker could not hand it to Parsl at all: its      ``site_error`` (the service
                           work folder cannot be written (disk full, quota,       does not charge it, up to
                           permissions) or submitting raised                      3 times per realisation)
``node_failure``           the scheduler ended the block because one of its       ``node_failure``
                           nodes died (Slurm ``NODE_FAIL``; :mod:`worker.scheduler`)
``lost_worker``            the worker or the block went away: orphaned (dead-man  ``lost_worker``
                           switch), runner signalled by the scheduler, Parsl
                           lost the manager
``drained``                the worker was stopped (SIGTERM) and ended the task    ``drained`` (the service
                           at its drain deadline                                  does not charge it)
``cancelled``              the service said cancel (campaign cancelled)           ``cancelled``
``dropped``                the service gave the task to someone else              (nothing)
=========================  =====================================================  ==================
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Literal

from schemas.api import FailureClass
from schemas.programs import MAX_MESSAGE_CHARS, CancelReason, Ending, MapmakerExit, RunnerStatus

_OOM = re.compile(
    r"MemoryError|Out of memory|out-of-memory|oom[-_ ]kill|OUT_OF_MEMORY|KILLED BY SIGNAL: 9|\(signal 9\)",
    re.IGNORECASE,
)
_LAUNCH = re.compile(
    r"HYDU_create_process|unable to run proxy|HYD_spawn|execvp error|srun: error: Unable to create step|"
    r"srun: error: .*(?:invalid|Unable to allocate)|No such file or directory.*mpiexec",
    re.IGNORECASE,
)
_LOST_EXCEPTIONS = {"ManagerLost", "WorkerLost"}


class Outcome(str, enum.Enum):
    SUCCEEDED = "succeeded"
    APP_ERROR = "app_error"
    PLAN_REFUSED = "plan_refused"
    COUPLING_REFUSED = "coupling_refused"
    WALLTIME = "walltime"
    OOM = "oom"
    LAUNCH_ERROR = "launch_error"
    SITE_ERROR = "site_error"
    LOST_WORKER = "lost_worker"
    NODE_FAILURE = "node_failure"
    DRAINED = "drained"
    CANCELLED = "cancelled"
    DROPPED = "dropped"

    @property
    def failure_class(self) -> FailureClass | None:
        """The service's failure class; None for succeeded and dropped."""
        return _FAILURE_CLASSES.get(self)


_FAILURE_CLASSES: dict[Outcome, FailureClass] = {
    Outcome.APP_ERROR: "app_error",
    Outcome.PLAN_REFUSED: "app_error",
    # The site's coupling file is stale (the worker removes it): the site's doing, not the realisation's.
    Outcome.COUPLING_REFUSED: "site_error",
    Outcome.WALLTIME: "walltime",
    Outcome.OOM: "oom",
    Outcome.LAUNCH_ERROR: "launch_error",
    Outcome.SITE_ERROR: "site_error",
    Outcome.LOST_WORKER: "lost_worker",
    Outcome.NODE_FAILURE: "node_failure",
    Outcome.DRAINED: "drained",
    Outcome.CANCELLED: "cancelled",
}


TaskKind = Literal["preprocess", "realize"]


@dataclass(frozen=True)
class Evidence:
    kind: TaskKind
    status: RunnerStatus | None = None  # status.json, when the runner wrote one that reads
    status_problem: str | None = None  # why a status.json that is there does not read (damaged, unknown ending)
    app_exception: str | None = None  # class name of the Parsl future's exception
    app_exception_text: str = ""
    stderr_tail: str = ""
    requested_stop: CancelReason | None = None  # what the worker asked for through the cancel file
    block_ending: str | None = None  # worker.scheduler.BlockEnding: why the scheduler ended the block, if asked


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    exit_code: int | None
    message: str


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip() and not set(line.strip()) <= {"=", "-"}:
            return line.strip()
    return ""


def _stop_outcome(reason: CancelReason | None) -> Outcome:
    return {
        CancelReason.CANCELLED: Outcome.CANCELLED,
        CancelReason.DRAIN: Outcome.DRAINED,
        CancelReason.LOST: Outcome.DROPPED,
    }[reason or CancelReason.CANCELLED]


def _signal_of(exit_code: int | None) -> int | None:
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if exit_code > 128:
        return exit_code - 128
    return None


def classify(evidence: Evidence) -> Verdict:
    """Decide how a task ended from what the runner, Parsl and the worker recorded."""
    status = evidence.status
    tail = evidence.stderr_tail
    if evidence.status_problem is not None:
        return Verdict(Outcome.LAUNCH_ERROR, None, evidence.status_problem[:MAX_MESSAGE_CHARS])
    if status is None:
        if evidence.requested_stop is not None:
            outcome = _stop_outcome(evidence.requested_stop)
            return Verdict(outcome, None, f"stopped before it was launched ({evidence.requested_stop.value})")
        if evidence.app_exception in _LOST_EXCEPTIONS:
            if evidence.block_ending == "walltime":
                return Verdict(Outcome.WALLTIME, None, "the batch job running the task reached its wall-time limit")
            if evidence.block_ending == "node_failure":
                return Verdict(Outcome.NODE_FAILURE, None, "a node of the batch job running the task failed")
            return Verdict(
                Outcome.LOST_WORKER,
                None,
                f"Parsl lost the block running the task: {evidence.app_exception_text}"[:MAX_MESSAGE_CHARS],
            )
        what = evidence.app_exception or "no status"
        detail = _last_line(evidence.app_exception_text) or _last_line(tail)
        return Verdict(
            Outcome.LAUNCH_ERROR, None, f"the task runner did not run to the end ({what}): {detail}"[:MAX_MESSAGE_CHARS]
        )

    exit_code = status.exit_code
    signal_name = status.signal or "a signal"
    if status.ending is Ending.WALLTIME:
        return Verdict(Outcome.WALLTIME, exit_code, f"killed at the wall-time limit of {status.walltime_s} s")
    if status.ending is Ending.CANCELLED:
        reason = status.cancel_reason or CancelReason.CANCELLED
        return Verdict(_stop_outcome(reason), exit_code, f"stopped by the worker ({reason.value})")
    if status.ending is Ending.ORPHANED:
        return Verdict(
            Outcome.LOST_WORKER, exit_code, "the worker stopped touching the liveness file; the task ended itself"
        )
    if status.ending is Ending.SIGNALLED:
        if evidence.block_ending == "walltime":
            job = status.scheduler_job_id
            return Verdict(
                Outcome.WALLTIME,
                exit_code,
                f"the batch job{f' {job}' if job else ''} running the task reached its wall-time limit "
                f"(the task runner got {signal_name})",
            )
        if evidence.block_ending == "node_failure":
            job = status.scheduler_job_id
            return Verdict(
                Outcome.NODE_FAILURE,
                exit_code,
                f"a node of the batch job{f' {job}' if job else ''} running the task failed "
                f"(the task runner got {signal_name})",
            )
        return Verdict(Outcome.LOST_WORKER, exit_code, f"the task runner got {signal_name} (block or node ended)")
    if status.ending is Ending.LAUNCH_ERROR:
        return Verdict(Outcome.LAUNCH_ERROR, exit_code, f"could not start the command: {status.error or ''}")

    if exit_code == MapmakerExit.OK:
        return Verdict(Outcome.SUCCEEDED, 0, "")
    last = _last_line(tail)
    if evidence.kind == "realize" and exit_code == MapmakerExit.PLAN_REFUSED:
        return Verdict(Outcome.PLAN_REFUSED, exit_code, f"plan refused: {last}"[:MAX_MESSAGE_CHARS])
    if evidence.kind == "realize" and exit_code == MapmakerExit.COUPLING_REFUSED:
        return Verdict(Outcome.COUPLING_REFUSED, exit_code, f"coupling refused: {last}"[:MAX_MESSAGE_CHARS])
    if _signal_of(exit_code) == 9 or _OOM.search(tail):
        return Verdict(Outcome.OOM, exit_code, f"out of memory (exit code {exit_code}): {last}"[:MAX_MESSAGE_CHARS])
    if exit_code in (126, 127) or _LAUNCH.search(tail):
        return Verdict(
            Outcome.LAUNCH_ERROR, exit_code, f"launch failed (exit code {exit_code}): {last}"[:MAX_MESSAGE_CHARS]
        )
    what = "bad input" if exit_code == MapmakerExit.BAD_INPUT else "failed"
    return Verdict(Outcome.APP_ERROR, exit_code, f"{what} (exit code {exit_code}): {last}"[:MAX_MESSAGE_CHARS])
