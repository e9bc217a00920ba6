"""One claimed task, from its work folder to its report to the service.

A :class:`TaskRun` is made for every task a claim hands out. In the main loop
(:mod:`worker.agent`) it is checked, prepared and submitted to Parsl, reports
``started`` when its runner is up, and can be asked to stop; once it has ended,
:meth:`TaskRun.finish` (on a reporting thread) decides how and reports it.

The work is done by the three stages of :mod:`worker.stages`, each given the
facts of the one before as values: the :class:`~worker.stages.prepare.Placement`
fixed at the claim, the :class:`~worker.stages.prepare.PreparedTask`, the
:class:`~worker.stages.run.EndedTask`, the :class:`~worker.stages.report.Reported`.
A :class:`TaskRun` holds only what the loop asks of a task while it runs (a stop,
its report) and the Parsl future.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from schemas.api import PreprocessTask, RealizeTask
from schemas.programs import CancelReason
from worker.client import ServiceClient
from worker.clock import SYSTEM_CLOCK, Clock
from worker.keep import SiteStore
from worker.layout import SiteLayout
from worker.outcome import Outcome, Verdict
from worker.scheduler import BlockEnding, BlockEndings
from worker.site import SiteConfig
from worker.stages import prepare, report, run

log = logging.getLogger("mapcampaign.worker")


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
    clock: Clock = SYSTEM_CLOCK
    site_store: SiteStore | None = None  # products.maps = "keep": the kept maps and partial sums


class TaskRun:
    """One claimed task as the loop holds it: its placement and work folder, what the loop asked of it."""

    def __init__(self, task: PreprocessTask | RealizeTask, context: TaskContext):
        self.task = task
        self.context = context
        self.placement = prepare.place(task, context.layout, marker_prefix=context.marker_prefix)
        self.folder = run.WorkFolder(self.placement.workdir, task_id=task.task_id)
        self.claimed_at = context.clock.time()
        self.prepared: prepare.PreparedTask | None = None
        self.submitted_at: float | None = None
        self.future: Future[Any] | None = None  # Parsl AppFuture
        self.started_reported = False
        self.stop_reason: CancelReason | None = None
        self.stop_requested_at: float | None = None  # context.clock.monotonic()
        self.early_verdict: Verdict | None = None  # decided before launch (pre-checks, submit errors)
        self.finishing: Future[dict[str, Any]] | None = None  # finish() on a report thread

    # ------------------------------------------------------------------ identity

    @property
    def task_id(self) -> str:
        return self.task.task_id

    def describe(self) -> str:
        return self.placement.describe()

    # ------------------------------------------------------------------ before launch: the prepare stage

    def precheck(self) -> Verdict | None:
        """A verdict when the task cannot run at this site at all; None when it may be launched."""
        return prepare.precheck(self.placement, self.context.site)

    def prepare(self) -> None:
        self.prepared = prepare.prepare(self.placement, self.context.site, python=self.context.python)

    def submit(self, app: run.ParslApp) -> Future[Any]:
        """Hand the prepared task to Parsl; return its future."""
        assert self.prepared is not None, "prepare() first"
        self.future = future = run.submit(self.prepared, app)
        self.submitted_at = self.context.clock.time()
        return future

    # ------------------------------------------------------------------ while it runs: the run stage

    def launched(self) -> bool:
        return self.folder.launched()

    def runner_ended(self) -> bool:
        return self.folder.runner_ended()

    def ended(self) -> bool:
        if self.early_verdict is not None or self.folder.runner_ended():
            return True
        return self.future is not None and self.future.done()

    def touch(self) -> None:
        self.folder.touch()

    def request_stop(self, reason: CancelReason) -> None:
        """Ask the runner to end the task (it may not have started yet: then it never launches).

        A task already being reported keeps the ending it had (a drain or a cancel asked afterwards must
        not turn, say, a block the scheduler lost into an uncharged ``drained``); only LOST still counts.
        """
        if self.finishing is not None and reason is not CancelReason.LOST:
            return
        if self.stop_reason is None or reason is CancelReason.LOST:
            self.stop_reason = reason
        self.stop_requested_at = self.stop_requested_at or self.context.clock.monotonic()
        self.folder.write_cancel(reason)

    def report_started(self) -> None:
        runner = self.folder.runner_started() or self.folder.status().status
        report.report_started(self.context.client, self.task_id, runner)
        self.started_reported = True

    # ------------------------------------------------------------------ after it ended: the report stage

    def conclude(self) -> run.EndedTask:
        """How the task ended (:func:`worker.stages.run.conclude`)."""
        provider_kind = self.context.site.provider.kind

        def block_ending(job_id: str | None) -> BlockEnding | None:
            return self.context.block_endings(provider_kind, job_id)

        return run.conclude(
            self.task.kind,
            self.folder,
            self.future,
            requested_stop=self.stop_reason,
            early_verdict=self.early_verdict,
            block_ending=block_ending,
        )

    def finish(self) -> dict[str, Any]:
        """Decide how the task ended, report it, tidy; return its timeline (wall-clock seconds since the epoch)."""
        ended = self.conclude()
        if ended.verdict.outcome is Outcome.LOST_WORKER and ended.launched and ended.status is None:
            # Parsl lost the task (its pool went away), but its runner may live on: tell it to end now
            # rather than when its liveness file goes stale, since the service will run the task again.
            self.folder.write_cancel(CancelReason.LOST)
        launched_at = ended.status.launched_at if ended.status else None
        timeline: dict[str, Any] = {
            "task_id": self.task_id,
            "kind": self.task.kind,
            "claimed_at": self.claimed_at,
            "submitted_at": self.submitted_at,
            "launched_at": launched_at or (ended.started.launched_at if ended.started else None),
            "exited_at": ended.status.ended_at if ended.status else None,
        }
        if ended.verdict.outcome is Outcome.DROPPED:
            log.info("%s dropped: the service gave it to another worker", self.task_id)
            timeline["outcome"] = Outcome.DROPPED.value
            return timeline
        store = self.context.site_store if isinstance(self.task, RealizeTask) else None
        reporter = report.Reporter(self.placement, self.folder, self.context.client, site_store=store)
        reported = reporter.report(ended, start_reported=self.started_reported)
        if store is not None and reported.outcome is Outcome.SUCCEEDED:
            try:
                store.send(self.context.client, self.task.campaign_id)  # at most once per products.sums_interval_s
            except (OSError, ValueError) as error:
                log.error("campaign %d: partial map sums not sent: %s", self.task.campaign_id, error)
        timeline.update(reported.figures)
        if reported.unreported is not None:
            timeline["unreported"] = reported.unreported
        timeline["reported_at"] = self.context.clock.time()
        timeline["outcome"] = reported.outcome.value
        report.tidy(self.placement, self.folder, reported, timeline=timeline, keep_work=self.context.keep_work)
        return timeline
