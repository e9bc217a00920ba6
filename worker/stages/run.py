"""The run stage: hand a prepared task to Parsl, share its work folder with the runner, and say how it ended.

The task runner (:mod:`worker.runner`) and the worker speak only through files in the task's work
folder (:mod:`schemas.programs` names them). :class:`WorkFolder` is the worker's side of it: the
liveness file it touches, the cancel file it writes, the runner's ``runner.json`` and ``status.json``
it reads, and the folder's removal, which must not race a cancel file written meanwhile.

The task has ended when its runner wrote ``status.json`` or its Parsl future is done, whichever comes
first: the status file is enough, so a task whose result cannot come back through Parsl (interchange
gone) is still reported. :func:`conclude` turns what is known then into an :class:`EndedTask`, the
facts the report stage works from.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.programs import (
    LIVENESS_FILE,
    RUNNER_FILE,
    STATUS_FILE,
    STDERR_FILE,
    CancelReason,
    Ending,
    RunnerStarted,
    RunnerStatus,
)
from worker.layout import remove_entry
from worker.outcome import Evidence, Outcome, TaskKind, Verdict, classify
from worker.runner import write_cancel
from worker.scheduler import BlockEnding
from worker.stages.prepare import PreparedTask

log = logging.getLogger("mapcampaign.worker")

STDERR_TAIL_BYTES = 256 * 1024  # of a task's stderr read for the classification and the failure report
STATUS_VISIBLE_S = 10.0  # how long a finished app's status.json may take to appear (NFS attribute caches)
STATUS_LOOK_S = 0.2  # how often it is looked for meanwhile

# Parsl's python_app/bash_app decorated function: called with the command and keywords, returns an AppFuture.
ParslApp = Callable[..., "Future[Any]"]


def submit(prepared: PreparedTask, app: ParslApp) -> Future[Any]:
    """Hand the task to Parsl; its future is done when the bash_app returns (or Parsl gives up on it)."""
    return app(
        prepared.command,
        parsl_resource_specification=prepared.resource_specification,
        stdout=str(prepared.stdout),
        stderr=str(prepared.stderr),
    )


def _exists(path: Path) -> bool:
    """``path.exists()``, False when the file system will not say (EIO, ESTALE, EACCES): the caller looks again."""
    try:
        return path.exists()
    except OSError:
        return False


def read_tail(path: Path, max_bytes: int = STDERR_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a text file, decoded leniently; "" when it cannot be read."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode(errors="replace").replace("\x00", "\ufffd")  # PostgreSQL refuses NUL
    except OSError:
        return ""


@dataclass(frozen=True)
class StatusFile:
    """``status.json`` as read: the runner's status, or why the file that is there does not read."""

    status: RunnerStatus | None = None
    problem: str | None = None  # damaged, or written by a runner this worker does not understand

    @property
    def written(self) -> bool:
        return self.status is not None or self.problem is not None


def read_status(path: Path) -> StatusFile:
    """Read ``status.json``; absent (or not readable just now: ESTALE, EIO) gives an empty :class:`StatusFile`."""
    try:
        text = path.read_text()
    except OSError:
        return StatusFile()
    try:
        return StatusFile(status=RunnerStatus.model_validate_json(text))
    except ValidationError as error:
        try:
            ending = json.loads(text).get("ending")
        except (ValueError, AttributeError):
            ending = None
        if isinstance(ending, str) and ending not in {known.value for known in Ending}:
            return StatusFile(problem=f"unknown ending {ending!r} in status.json")
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        return StatusFile(problem=f"status.json is damaged: {where}: {first['msg']}")


class WorkFolder:
    """The task's work folder, from the worker's side, while the runner may be using it.

    The loop thread writes cancel files while a report thread may be removing the folder: one at a
    time, and none once it is gone (a file written mid-removal left the folder behind).
    """

    def __init__(self, path: Path, *, task_id: str):
        self.path = path
        self.task_id = task_id
        self.lock = threading.Lock()
        self.removed = False
        self.touch_failed = False

    def runner_started(self) -> RunnerStarted | None:
        """``runner.json``: where and when the runner launched the command; None before (or unreadable)."""
        try:
            return RunnerStarted.model_validate_json((self.path / RUNNER_FILE).read_text())
        except (OSError, ValidationError):
            return None

    def status(self) -> StatusFile:
        return read_status(self.path / STATUS_FILE)

    def launched(self) -> bool:
        """The runner has started (it wrote runner.json, or status.json when it launched nothing)."""
        return _exists(self.path / RUNNER_FILE) or _exists(self.path / STATUS_FILE)

    def runner_ended(self) -> bool:
        """The runner wrote its status: every process of the task is gone."""
        return _exists(self.path / STATUS_FILE)

    def stderr_tail(self) -> str:
        return read_tail(self.path / STDERR_FILE)

    def touch(self) -> None:
        """Tell the runner its worker is alive. A failed touch (EIO, ESTALE on a shared file system) is
        logged once and tried again next time: the runner gives up only after ``liveness_timeout_s``."""
        try:
            os.utime(self.path / LIVENESS_FILE)
        except FileNotFoundError:
            pass
        except OSError as error:
            if not self.touch_failed:
                log.warning("%s: could not touch its liveness file: %s; trying again", self.task_id, error)
            self.touch_failed = True
        else:
            self.touch_failed = False

    def write_cancel(self, reason: CancelReason) -> None:
        """Ask the runner to end the task (before its launch: it launches nothing); nothing once removed."""
        with self.lock:
            if self.removed:  # reported and tidied meanwhile: nothing left to stop
                return
            try:
                write_cancel(self.path, reason)
            except OSError:  # the work folder is gone or cannot be written: the runner's liveness check remains
                pass

    def remove(self) -> None:
        with self.lock:
            remove_entry(self.path)
            self.removed = True


@dataclass(frozen=True)
class EndedTask:
    """How a task ended, as the run stage found it: the facts the report stage works from."""

    verdict: Verdict
    launched: bool  # the runner started (runner.json or status.json is there)
    started: RunnerStarted | None  # runner.json
    status: RunnerStatus | None  # status.json, when it reads


def wait_for_status(folder: WorkFolder) -> StatusFile:
    """``status.json`` of a task whose app has returned normally: the runner wrote it before it exited, but
    on a shared file system that caches lookups it can take a moment to show here. Without it an exit 0
    would read as "no status"."""
    deadline = time.monotonic() + STATUS_VISIBLE_S
    found = folder.status()
    while not found.written and time.monotonic() < deadline:
        time.sleep(STATUS_LOOK_S)
        found = folder.status()
    return found


def gather_evidence(
    kind: TaskKind, folder: WorkFolder, future: Future[Any] | None, requested_stop: CancelReason | None
) -> Evidence:
    """What the runner, Parsl and the worker recorded of an ended task (:func:`worker.outcome.classify` reads it)."""
    exception_name, exception_text = None, ""
    app_returned = future is not None and future.done()
    if future is not None and app_returned:
        error = future.exception()
        if error is not None:
            exception_name, exception_text = type(error).__name__, str(error)
    found = folder.status()
    if not found.written and app_returned and exception_name is None:
        found = wait_for_status(folder)
    return Evidence(
        kind=kind,
        status=found.status,
        status_problem=found.problem,
        app_exception=exception_name,
        app_exception_text=exception_text,
        stderr_tail=folder.stderr_tail(),
        requested_stop=requested_stop,
    )


def conclude(
    kind: TaskKind,
    folder: WorkFolder,
    future: Future[Any] | None,
    *,
    requested_stop: CancelReason | None,
    early_verdict: Verdict | None,
    block_ending: Callable[[str | None], BlockEnding | None],
) -> EndedTask:
    """Decide how the task ended. ``block_ending(job_id)``: why the scheduler ended that batch job, if it says.

    A task the service gave to someone else is dropped whatever happened; a verdict reached before launch
    stands; otherwise the evidence decides, and a task whose block went away is asked about at the scheduler,
    which may say it was the block's time limit.
    """
    started = folder.runner_started()
    launched = folder.launched()
    if requested_stop is CancelReason.LOST:  # no longer ours: the service does not want it
        verdict = Verdict(Outcome.DROPPED, None, "the service gave the task to another worker")
        return EndedTask(verdict, launched=launched, started=started, status=folder.status().status)
    if early_verdict is not None:
        return EndedTask(early_verdict, launched=launched, started=started, status=folder.status().status)
    evidence = gather_evidence(kind, folder, future, requested_stop)
    verdict = classify(evidence)
    if verdict.outcome is Outcome.LOST_WORKER and evidence.requested_stop is None:
        job_id = evidence.status.scheduler_job_id if evidence.status else started.scheduler_job_id if started else None
        ending = block_ending(job_id)
        if ending is not None:
            log.info("%s: the scheduler says batch job %s ended: %s", folder.task_id, job_id, ending.value)
            verdict = classify(dataclasses.replace(evidence, block_ending=ending.value))
    return EndedTask(verdict, launched=launched, started=started, status=evidence.status)
