"""One claimed task, from its work folder to its report to the service.

A :class:`TaskRun` is made for every task a claim hands out. In the main
loop (:mod:`worker.agent`) it is prepared and submitted to Parsl, reports
``started`` when its runner is up, and can be asked to stop; once it has
ended, :meth:`TaskRun.finish` (on a reporting thread) classifies how
(:func:`worker.outcome.classify`) and reports it: products and result, a
built plan, or a failure with its class, exit code and log tail.

The task has ended when its runner wrote ``status.json`` or its Parsl future
is done, whichever comes first: the status file is enough, so a task whose
result cannot come back through Parsl (interchange gone) is still reported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.api import PlanBuilt, PlanInvalid, PreprocessTask, RealizeTask, TaskFailed, TaskStarted
from schemas.plan import PlanReport
from schemas.result import RealizationResult
from worker.client import RETRY_STATUS, NotAuthorized, ServiceClient, ServiceError, TaskGone
from worker.commands import (
    RunnerLimits,
    bash_command,
    mapmaker_preprocess_args,
    mapmaker_realize_args,
    runner_args,
    task_resource_specification,
)
from worker.layout import SiteLayout
from worker.outcome import Evidence, Outcome, Verdict, classify, log_tail
from worker.runner import (
    LIVENESS_FILE,
    RUNNER_FILE,
    STATUS_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    CancelReason,
    read_json,
    write_cancel,
    write_json_atomic,
)
from worker.scheduler import BlockEndings
from worker.site import SiteConfig

log = logging.getLogger("mapcampaign.worker")

SPEC_FILE = "spec.json"
TIMELINE_FILE = "timeline.json"
RESULT_FILE = "result.json"
STDERR_TAIL_BYTES = 256 * 1024
STATUS_VISIBLE_S = 10.0  # how long a finished app's status.json may take to appear (NFS attribute caches)


@dataclass(frozen=True)
class TaskContext:
    """What every task of one worker shares."""

    site: SiteConfig
    layout: SiteLayout
    python: str
    marker_prefix: str
    client: ServiceClient
    keep_work: bool = False
    block_endings: BlockEndings = field(default_factory=BlockEndings)  # scheduler answers shared by a block's tasks


class ReportProblem(Exception):
    """A task that exited 0 but whose output cannot be reported as a success."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_tail(path: Path, max_bytes: int = STDERR_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode(errors="replace").replace("\x00", "\ufffd")  # PostgreSQL refuses NUL
    except OSError:
        return ""


def _exists(path: Path) -> bool:
    """``path.exists()``, False when the file system will not say (EIO, ESTALE, EACCES): the caller looks again."""
    try:
        return path.exists()
    except OSError:
        return False


def _refusal_is_a_failure(report: Callable[[], None], what: str) -> None:
    """Send a success report; a refusal that no retry can change (4xx other than 409 and the
    token's 401/403: a result that does not match, too large, ...) becomes a :class:`ReportProblem`,
    so that the attempt is reported failed with the service's reason instead of expiring as lost."""
    try:
        report()
    except (TaskGone, NotAuthorized):
        raise
    except ServiceError as error:
        if error.status is not None and 400 <= error.status < 500:
            raise ReportProblem(f"the service refused the {what}: {error}") from None
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class TaskRun:
    def __init__(self, task: PreprocessTask | RealizeTask, context: TaskContext):
        self.task = task
        self.context = context
        self.workdir = context.layout.work_dir(task.task_id)
        self.marker = f"{context.marker_prefix}:{task.task_id}"
        self.claimed_at = time.time()
        self.submitted_at: float | None = None
        self.future: Any = None  # Parsl AppFuture
        self.started_reported = False
        self.touch_failed = False
        self.stop_reason: CancelReason | None = None
        self.stop_requested_at: float | None = None
        self.early_verdict: Verdict | None = None  # decided before launch (pre-checks, submit errors)
        self.finishing: Any = None  # concurrent.futures.Future of finish()
        # The loop thread writes cancel files while a report thread may be removing the work folder:
        # one at a time, and none once it is gone (a file written mid-removal left the folder behind).
        self.workdir_lock = threading.Lock()
        self.workdir_removed = False
        resources = task.spec.resources
        self.threads = resources.threads_per_rank
        if isinstance(task, PreprocessTask):
            self.plan_file = context.layout.plan_file(
                scan_key=task.scan_key, ranks=task.ranks, plan_id=task.plan_id, build=task.build_attempt
            )
            self.report_file = self.plan_file.with_name(self.plan_file.name + ".report.json")
            self.out: Path | None = None
        else:
            self.plan_file = Path(task.plan.path) if task.plan.path else None
            self.report_file = None
            self.out = context.layout.product_dir(task.campaign_id, task.realization, task.attempt)

    # ------------------------------------------------------------------ identity

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def kind(self) -> str:
        return self.task.kind

    def describe(self) -> str:
        if isinstance(self.task, RealizeTask):
            return (
                f"{self.task_id} (campaign {self.task.campaign_id} realisation {self.task.realization} "
                f"attempt {self.task.attempt}, {self.task.spec.resources.ranks} ranks)"
            )
        return f"{self.task_id} (plan {self.task.plan_id} build {self.task.build_attempt}, {self.task.ranks} ranks)"

    # ------------------------------------------------------------------ before launch

    def precheck(self) -> Verdict | None:
        """A verdict when the task cannot run at this site at all; None when it may be launched."""
        resources = self.task.spec.resources
        if resources.nodes > self.context.site.nodes_per_block:
            return Verdict(
                Outcome.LAUNCH_ERROR,
                None,
                f"the task needs {resources.nodes} nodes; blocks of site {self.context.site.name!r} have "
                f"{self.context.site.nodes_per_block}",
            )
        if isinstance(self.task, RealizeTask):
            try:
                present = self.plan_file is not None and self.plan_file.is_file()
            except OSError as error:  # e.g. a folder of another user's data_dir this worker may not enter
                return Verdict(
                    Outcome.PLAN_REFUSED,
                    None,
                    f"plan refused: the plan file {self.task.plan.path!r} cannot be read at this site: {error}",
                )
            if not present:
                return Verdict(
                    Outcome.PLAN_REFUSED,
                    None,
                    f"plan refused: the plan file {self.task.plan.path!r} is missing at this site",
                )
        return None

    def prepare(self) -> None:
        """Make a fresh work folder with the spec, and clear what an earlier incarnation may have left.

        The service handed this task to this worker and it holds the lease, so anything
        already at the task's own paths (work folder, product folder, plan file) is stale.
        """
        if self.workdir.exists():
            _remove(self.workdir)
        self.workdir.mkdir(parents=True)
        (self.workdir / SPEC_FILE).write_text(self.task.spec.model_dump_json(indent=1) + "\n")
        (self.workdir / LIVENESS_FILE).touch()
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            if self.out.exists() or self.out.is_symlink():
                stale = self.out.with_name(f".{self.out.name}.stale-{uuid.uuid4().hex[:8]}")
                os.rename(self.out, stale)
                _remove(stale)
        if isinstance(self.task, PreprocessTask):
            self.plan_file.parent.mkdir(parents=True, exist_ok=True)
            for path in (self.plan_file, self.report_file):
                if path.exists():
                    path.unlink()

    def limits(self) -> RunnerLimits:
        runner = self.context.site.runner
        walltime_s = (
            runner.preprocess_walltime_s
            if isinstance(self.task, PreprocessTask)
            else self.task.spec.resources.walltime_s
        )
        return RunnerLimits(
            walltime_s=walltime_s,
            grace_s=runner.kill_grace_s,
            liveness_timeout_s=runner.liveness_timeout_s,
        )

    def command(self) -> str:
        python = self.context.python
        spec_file = self.workdir / SPEC_FILE
        if isinstance(self.task, PreprocessTask):
            program = mapmaker_preprocess_args(python, spec_file=spec_file, out=self.plan_file, report=self.report_file)
        else:
            program = mapmaker_realize_args(
                python,
                spec_file=spec_file,
                realization=self.task.realization,
                out=self.out,
                threads=self.threads,
                plan_file=self.plan_file,
                sky_root=self.context.site.sky_root,
            )
        runner = runner_args(python, workdir=self.workdir, marker=self.marker, limits=self.limits())
        return bash_command(runner=runner, program=program, threads=self.threads)

    def resource_specification(self) -> dict[str, int | str]:
        mpi = self.context.site.mpi
        return task_resource_specification(
            self.task.spec.resources, launcher=mpi.launcher, launcher_options=mpi.launcher_options
        )

    def submit(self, app: Any) -> None:
        self.future = app(
            self.command(),
            parsl_resource_specification=self.resource_specification(),
            stdout=str(self.workdir / STDOUT_FILE),
            stderr=str(self.workdir / STDERR_FILE),
        )
        self.submitted_at = time.time()

    # ------------------------------------------------------------------ while it runs

    def runner_info(self) -> dict | None:
        return read_json(self.workdir / RUNNER_FILE)

    def status(self) -> dict | None:
        return read_json(self.workdir / STATUS_FILE)

    def launched(self) -> bool:
        return _exists(self.workdir / RUNNER_FILE) or _exists(self.workdir / STATUS_FILE)

    def ended(self) -> bool:
        if self.early_verdict is not None:
            return True
        if self.runner_ended():
            return True
        return self.future is not None and self.future.done()

    def touch(self) -> None:
        """Tell the runner its worker is alive. A failed touch (EIO, ESTALE on a shared file system) is
        logged once and tried again next time: the runner gives up only after ``liveness_timeout_s``."""
        try:
            os.utime(self.workdir / LIVENESS_FILE)
        except FileNotFoundError:
            pass
        except OSError as error:
            if not self.touch_failed:
                log.warning("%s: could not touch its liveness file: %s; trying again", self.task_id, error)
            self.touch_failed = True
        else:
            self.touch_failed = False

    def request_stop(self, reason: CancelReason) -> None:
        """Ask the runner to end the task (it may not have started yet: then it never launches).

        A task already being reported keeps the ending it had (a drain or a cancel asked afterwards must
        not turn, say, a block the scheduler lost into an uncharged ``drained``); only LOST still counts.
        """
        if self.finishing is not None and reason is not CancelReason.LOST:
            return
        if self.stop_reason is None or reason is CancelReason.LOST:
            self.stop_reason = reason
        self.stop_requested_at = self.stop_requested_at or time.monotonic()
        self._write_cancel(reason)

    def _write_cancel(self, reason: CancelReason) -> None:
        with self.workdir_lock:
            if self.workdir_removed:  # reported and tidied meanwhile: nothing left to stop
                return
            try:
                write_cancel(self.workdir, reason)
            except OSError:  # the work folder is gone or cannot be written: the runner's liveness check remains
                pass

    def runner_ended(self) -> bool:
        """The runner wrote its status: every process of the task is gone."""
        return _exists(self.workdir / STATUS_FILE)

    def report_started(self) -> None:
        info = self.runner_info() or self.status() or {}
        report = TaskStarted(
            host=str(info.get("host") or "")[:255] or None, scheduler_job_id=info.get("scheduler_job_id")
        )
        self.context.client.started(self.task_id, report)
        self.started_reported = True
        log.info(
            "%s started on %s%s",
            self.task_id,
            report.host,
            f" (job {report.scheduler_job_id})" if report.scheduler_job_id else "",
        )

    # ------------------------------------------------------------------ after it ended

    def evidence(self) -> Evidence:
        exception_name, exception_text = None, ""
        if self.future is not None and self.future.done():
            error = self.future.exception()
            if error is not None:
                exception_name, exception_text = type(error).__name__, str(error)
        status = self.status()
        if status is None and self.future is not None and self.future.done() and exception_name is None:
            # The runner wrote status.json before its app returned; on a shared file system that caches
            # lookups it can take a moment to show here. Without it an exit 0 would read as "no status".
            deadline = time.monotonic() + STATUS_VISIBLE_S
            while status is None and time.monotonic() < deadline:
                time.sleep(0.2)
                status = self.status()
        return Evidence(
            kind=self.kind,
            status=status,
            app_exception=exception_name,
            app_exception_text=exception_text,
            stderr_tail=read_tail(self.workdir / STDERR_FILE),
            requested_stop=self.stop_reason,
        )

    def verdict(self) -> Verdict:
        if self.stop_reason is CancelReason.LOST:  # no longer ours: whatever happened, the service does not want it
            return Verdict(Outcome.DROPPED, None, "the service gave the task to another worker")
        if self.early_verdict is not None:
            return self.early_verdict
        evidence = self.evidence()
        verdict = classify(evidence)
        if verdict.outcome is Outcome.LOST_WORKER and evidence.requested_stop is None:
            # The block went away under the task: the scheduler may say it was the block's time limit.
            job_id = (evidence.status or self.runner_info() or {}).get("scheduler_job_id")
            ending = self.context.block_endings(self.context.site.provider.kind, job_id)
            if ending is not None:
                log.info("%s: the scheduler says batch job %s ended: %s", self.task_id, job_id, ending.value)
                verdict = classify(dataclasses.replace(evidence, block_ending=ending.value))
        return verdict

    def finish(self) -> dict[str, Any]:
        """Classify and report; return the task's timeline (wall-clock seconds since the epoch)."""
        verdict = self.verdict()
        if verdict.outcome is Outcome.LOST_WORKER and self.launched() and self.status() is None:
            # Parsl lost the task (its pool went away), but its runner may live on: tell it to end now
            # rather than when its liveness file goes stale, since the service will run the task again.
            self._write_cancel(CancelReason.LOST)
        timeline: dict[str, Any] = {
            "task_id": self.task_id,
            "kind": self.kind,
            "claimed_at": self.claimed_at,
            "submitted_at": self.submitted_at,
        }
        status = self.status() or {}
        timeline["launched_at"] = status.get("launched_at") or (self.runner_info() or {}).get("launched_at")
        timeline["exited_at"] = status.get("ended_at")
        if verdict.outcome is Outcome.DROPPED:
            log.info("%s dropped: the service gave it to another worker", self.task_id)
            timeline["outcome"] = verdict.outcome.value
            return timeline
        try:
            if self.launched() and not self.started_reported:
                try:
                    self.report_started()
                except TaskGone:
                    pass
                except ServiceError as error:  # the outcome's own report (retried longer) carries the news
                    log.warning("%s: could not report its start (%s); reporting how it ended", self.task_id, error)
            if verdict.outcome is Outcome.SUCCEEDED:
                try:
                    timeline.update(self._report_success())
                except ReportProblem as problem:
                    verdict = Verdict(Outcome.APP_ERROR, 0, str(problem))
                    self._report_failure(verdict, note=str(problem))
            else:
                if verdict.outcome is Outcome.PLAN_REFUSED:
                    self._invalidate_plan(verdict.message)
                self._report_failure(verdict)
        except TaskGone as gone:
            log.info("%s: the service no longer holds it for this worker (%s)", self.task_id, gone)
        except ServiceError as error:
            timeline["unreported"] = str(error)[:1_000]
            log.error(
                "%s: could not report %s: %s; its work folder %s is kept", self.task_id, verdict.outcome.value, error,
                self.workdir,
            )  # fmt: skip
        timeline["reported_at"] = time.time()
        timeline["outcome"] = verdict.outcome.value
        self._tidy(verdict.outcome, timeline, reported="unreported" not in timeline)
        return timeline

    def _report_success(self) -> dict[str, Any]:
        if isinstance(self.task, PreprocessTask):
            return self._report_plan()
        assert self.out is not None
        try:
            result = RealizationResult.model_validate_json((self.out / RESULT_FILE).read_text())
        except (OSError, ValidationError, ValueError) as error:
            raise ReportProblem(f"exited 0 but {self.out / RESULT_FILE} is missing or invalid: {error}") from None
        folder = self.out.resolve()
        for product in result.products:
            path = (folder / product.path).resolve()
            if path.parent != folder or not path.is_file():
                raise ReportProblem(f"product {product.path!r} named in result.json is not a file in {folder}")
            if path.stat().st_size != product.size_bytes or sha256_of(path) != product.sha256:
                raise ReportProblem(f"product {product.path!r} does not match the size or sha256 in result.json")
        for product in result.products:
            try:
                self.context.client.upload(self.task_id, product.path, folder / product.path, product.sha256)
            except TaskGone:
                raise
            except ServiceError as error:
                if error.status is None or error.status in RETRY_STATUS:
                    raise  # the service is out of reach, not refusing: the lease runs out, the task is retried as lost
                # e.g. 507: the service answered that it could not store it; a failed attempt, not a lost one
                raise ReportProblem(f"the service did not store product {product.path!r}: {error}") from None
        _refusal_is_a_failure(lambda: self.context.client.succeeded(self.task_id, result), "result")
        log.info(
            "%s succeeded: %d iterations, %s, %.1f s in the map-maker; %d products uploaded",
            self.describe(),
            result.iterations,
            "converged" if result.converged else "NOT converged",
            result.timing.total,
            len(result.products),
        )
        return {"mapmaker_total_s": result.timing.total}

    def _report_plan(self) -> dict[str, Any]:
        assert self.report_file is not None
        try:
            report = PlanReport.model_validate_json(self.report_file.read_text())
        except (OSError, ValidationError, ValueError) as error:
            raise ReportProblem(
                f"preprocess exited 0 but its report {self.report_file} is missing or invalid: {error}"
            ) from None
        if Path(report.path).resolve() != self.plan_file.resolve() or not self.plan_file.is_file():
            raise ReportProblem(f"preprocess reported plan {report.path}, expected {self.plan_file}")
        if self.plan_file.stat().st_size != report.size_bytes:
            raise ReportProblem(
                f"plan {self.plan_file} has {self.plan_file.stat().st_size} bytes; the report says {report.size_bytes}"
            )
        if isinstance(self.task, PreprocessTask) and (report.scan_key, report.ranks) != (
            self.task.scan_key,
            self.task.ranks,
        ):
            raise ReportProblem(
                f"preprocess built a plan for scan key {report.scan_key[:12]} on {report.ranks} ranks; "
                f"the task asked for {self.task.scan_key[:12]} on {self.task.ranks}"
            )
        built = PlanBuilt(
            path=str(self.plan_file),
            checksum=report.checksum,
            size_bytes=report.size_bytes,
            build_time_s=report.build_time_s,
        )
        _refusal_is_a_failure(lambda: self.context.client.plan_built(self.task_id, built), "plan")
        log.info(
            "%s built %s (%d bytes, %.2f s)", self.describe(), self.plan_file.name, built.size_bytes, built.build_time_s
        )
        return {"build_time_s": built.build_time_s}

    def _invalidate_plan(self, reason: str) -> None:
        assert isinstance(self.task, RealizeTask)
        log.warning("%s: %s; asking the service to build plan %d again", self.task_id, reason, self.task.plan.id)
        try:
            self.context.client.plan_invalid(
                self.task.plan.id,
                PlanInvalid(task_id=self.task_id, checksum=self.task.plan.checksum or "?", reason=reason[:4_000]),
            )
        except TaskGone:
            pass

    def _report_failure(self, verdict: Verdict, *, note: str | None = None) -> None:
        """``note``: a cause found by the worker itself (the map-maker's stderr does not have it), kept last."""
        failure_class = verdict.outcome.failure_class
        assert failure_class is not None
        stderr = read_tail(self.workdir / STDERR_FILE)
        if note:
            stderr = "\n".join(filter(None, [stderr.rstrip(), f"worker: {note}"]))
        report = TaskFailed(
            failure_class=failure_class,
            exit_code=verdict.exit_code,
            log_tail=log_tail(stderr),
            message=verdict.message[:4_000] or None,
        )
        log.warning("%s failed: %s: %s", self.describe(), failure_class, verdict.message)
        self.context.client.failed(self.task_id, report)

    def _tidy(self, outcome: Outcome, timeline: dict[str, Any], *, reported: bool = True) -> None:
        """Write the timeline; remove what a finished task no longer needs (nothing of an unreported success)."""
        if self.workdir.exists():
            try:
                write_json_atomic(self.workdir / TIMELINE_FILE, timeline)
            except OSError:
                pass
        if isinstance(self.task, RealizeTask) and self.out is not None:
            realization_dir = self.out.parent
            ended_for_sure = outcome is not Outcome.DROPPED and (self.status() is not None or not self.launched())
            for entry in realization_dir.glob(f".{self.out.name}.partial-*"):
                if ended_for_sure:  # every process of this attempt is gone: its temporary folder is garbage
                    _remove(entry)
            if outcome is Outcome.SUCCEEDED and reported:
                # The result is accepted: earlier attempts' folders (complete or not) are no longer wanted.
                for entry in realization_dir.iterdir():
                    name = entry.name.lstrip(".")
                    if entry != self.out and name.startswith("attempt-"):
                        number = name.removeprefix("attempt-").split(".")[0]
                        if number.isdigit() and int(number) < self.task.attempt:
                            _remove(entry)
        if outcome is Outcome.SUCCEEDED and reported and not self.context.keep_work:
            with self.workdir_lock:
                _remove(self.workdir)
                self.workdir_removed = True
