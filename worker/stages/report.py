"""The report stage: from how a task ended (:class:`~worker.stages.run.EndedTask`) to the service, then tidy.

A success is checked before it is reported: every product named in ``result.json`` must be a
file of the product folder with the size and SHA-256 written there (a built plan: the size and
the scan key of its report). The products are uploaded, then the result (or the plan) reported;
at a site that keeps its maps (:mod:`worker.keep`) the maps move into the site's store instead,
the result names them, and once it is accepted the map joins the site's partial sums.
A success that cannot be reported as one (output missing or damaged, the service refusing it for
good) becomes an ``app_error`` with the reason; a service out of reach reports nothing, and its
lease running out gives the task to someone again. A failure is reported with its class, exit
code and log tail; a refused plan is first reported invalid, so that it is built again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.api import PlanBuilt, PlanInvalid, TaskFailed, TaskStarted
from schemas.files import atomic_write_json, sha256_file
from schemas.plan import PlanReport
from schemas.programs import (
    MAX_MESSAGE_CHARS,
    RESULT_FILE,
    RunnerStarted,
    RunnerStatus,
    log_tail,
    partial_folder_prefix,
)
from schemas.result import RealizationResult
from worker.client import RETRY_STATUS, NotAuthorized, ServiceClient, ServiceError, TaskGone
from worker.keep import SiteStore
from worker.layout import remove_entry
from worker.outcome import Outcome, Verdict
from worker.stages.prepare import Placement, PreprocessPlacement, RealizePlacement
from worker.stages.run import EndedTask, WorkFolder

log = logging.getLogger("mapcampaign.worker")

TIMELINE_FILE = "timeline.json"  # left in a kept work folder: when the task was claimed, launched, reported
MAX_HOST_CHARS = 255  # schemas.api.TaskStarted.host


class ReportProblem(Exception):
    """A task that exited 0 but whose output cannot be reported as a success."""


@dataclass(frozen=True)
class Reported:
    """What the report stage did: the outcome the service was told, and whether it heard it."""

    outcome: Outcome  # the verdict's, or app_error for a success that could not be reported as one
    unreported: str | None = None  # the service could not be reached: why (everything is kept)
    figures: dict[str, float] = field(default_factory=dict)  # for the timeline: mapmaker_total_s or build_time_s

    @property
    def delivered(self) -> bool:
        return self.unreported is None


def report_started(client: ServiceClient, task_id: str, runner: RunnerStarted | RunnerStatus | None) -> TaskStarted:
    """Tell the service the task runs, and where (the runner's host and batch job)."""
    report = TaskStarted(
        host=(runner.host[:MAX_HOST_CHARS] or None) if runner else None,
        scheduler_job_id=runner.scheduler_job_id if runner else None,
    )
    client.started(task_id, report)
    log.info(
        "%s started on %s%s",
        task_id,
        report.host,
        f" (job {report.scheduler_job_id})" if report.scheduler_job_id else "",
    )
    return report


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


class Reporter:
    """Reports one ended task to the service."""

    def __init__(
        self, placement: Placement, folder: WorkFolder, client: ServiceClient, *, site_store: SiteStore | None = None
    ):
        self.placement = placement
        self.folder = folder
        self.client = client
        self.site_store = site_store  # maps kept at the site (products.maps = "keep"); None: uploaded
        self.task_id = placement.task.task_id

    def report(self, ended: EndedTask, *, start_reported: bool) -> Reported:
        """Report ``ended`` (not a dropped task: nothing is reported for those).

        ``start_reported``: the loop already said ``started``; else a launched task says it first.
        """
        verdict = ended.verdict
        try:
            if ended.launched and not start_reported:
                try:
                    report_started(self.client, self.task_id, ended.started or ended.status)
                except TaskGone:
                    pass
                except ServiceError as error:  # the outcome's own report (retried longer) carries the news
                    log.warning("%s: could not report its start (%s); reporting how it ended", self.task_id, error)
            if verdict.outcome is Outcome.SUCCEEDED:
                try:
                    return Reported(Outcome.SUCCEEDED, figures=self._report_success())
                except ReportProblem as problem:
                    verdict = Verdict(Outcome.APP_ERROR, 0, str(problem))
                    self._report_failure(verdict, note=str(problem))
            else:
                if verdict.outcome is Outcome.PLAN_REFUSED:
                    self._invalidate_plan(verdict.message)
                elif verdict.outcome is Outcome.COUPLING_REFUSED:
                    self._remove_stale_coupling(verdict.message)
                self._report_failure(verdict)
        except TaskGone as gone:
            log.info("%s: the service no longer holds it for this worker (%s)", self.task_id, gone)
        except ServiceError as error:
            log.error(
                "%s: could not report %s: %s; its work folder %s is kept",
                self.task_id, verdict.outcome.value, error, self.placement.workdir,
            )  # fmt: skip
            return Reported(verdict.outcome, unreported=str(error)[:1_000])
        return Reported(verdict.outcome)

    def _report_success(self) -> dict[str, float]:
        if isinstance(self.placement, PreprocessPlacement):
            return self._report_plan(self.placement)
        return self._report_realization(self.placement)

    def _report_realization(self, placement: RealizePlacement) -> dict[str, float]:
        out = placement.out
        try:
            result = RealizationResult.model_validate_json((out / RESULT_FILE).read_text())
        except (OSError, ValidationError, ValueError) as error:
            raise ReportProblem(f"exited 0 but {out / RESULT_FILE} is missing or invalid: {error}") from None
        folder = out.resolve()
        for product in result.products:
            path = (folder / product.path).resolve()
            if path.parent != folder or not path.is_file():
                raise ReportProblem(f"product {product.path!r} named in {RESULT_FILE} is not a file in {folder}")
            if path.stat().st_size != product.size_bytes or sha256_file(path) != product.sha256:
                raise ReportProblem(f"product {product.path!r} does not match the size or sha256 in {RESULT_FILE}")
        if self.site_store is not None:
            try:
                result = self.site_store.keep_maps(result, folder, placement.task.campaign_id)
            except OSError as error:
                raise ReportProblem(f"could not move the maps into the site's store: {error}") from None
        for product in result.products:
            if product.kept is not None:
                continue  # kept at the site: the result names where
            try:
                self.client.upload(self.task_id, product.path, folder / product.path, product.sha256)
            except TaskGone:
                raise
            except ServiceError as error:
                if error.status is None or error.status in RETRY_STATUS:
                    raise  # the service is out of reach, not refusing: the lease runs out, the task is retried as lost
                # e.g. 507: the service answered that it could not store it; a failed attempt, not a lost one
                raise ReportProblem(f"the service did not store product {product.path!r}: {error}") from None
        _refusal_is_a_failure(lambda: self.client.succeeded(self.task_id, result), "result")
        if self.site_store is not None:
            try:
                self.site_store.accepted(placement.task.campaign_id, result)
            except (OSError, ValueError) as error:  # the result stands; its map stays kept, outside the sums
                log.error("%s: its map was not added to the site's partial sums: %s", self.task_id, error)
        log.info(
            "%s succeeded: %d iterations, %s, %.1f s in the map-maker; %d products uploaded, %d kept at the site",
            placement.describe(),
            result.iterations,
            "converged" if result.converged else "NOT converged",
            result.timing.total,
            sum(product.kept is None for product in result.products),
            sum(product.kept is not None for product in result.products),
        )
        return {"mapmaker_total_s": result.timing.total}

    def _report_plan(self, placement: PreprocessPlacement) -> dict[str, float]:
        plan_file, task = placement.plan_file, placement.task
        try:
            report = PlanReport.model_validate_json(placement.report_file.read_text())
        except (OSError, ValidationError, ValueError) as error:
            raise ReportProblem(
                f"preprocess exited 0 but its report {placement.report_file} is missing or invalid: {error}"
            ) from None
        if Path(report.path).resolve() != plan_file.resolve() or not plan_file.is_file():
            raise ReportProblem(f"preprocess reported plan {report.path}, expected {plan_file}")
        if plan_file.stat().st_size != report.size_bytes:
            raise ReportProblem(
                f"plan {plan_file} has {plan_file.stat().st_size} bytes; the report says {report.size_bytes}"
            )
        if (report.scan_key, report.ranks) != (task.scan_key, task.ranks):
            raise ReportProblem(
                f"preprocess built a plan for scan key {report.scan_key[:12]} on {report.ranks} ranks; "
                f"the task asked for {task.scan_key[:12]} on {task.ranks}"
            )
        built = PlanBuilt(
            path=str(plan_file),
            checksum=report.checksum,
            size_bytes=report.size_bytes,
            build_time_s=report.build_time_s,
        )
        _refusal_is_a_failure(lambda: self.client.plan_built(self.task_id, built), "plan")
        log.info("%s built %s (%d bytes, %.2f s)", placement.describe(), plan_file.name, built.size_bytes,
                 built.build_time_s)  # fmt: skip
        return {"build_time_s": built.build_time_s}

    def _invalidate_plan(self, reason: str) -> None:
        assert isinstance(self.placement, RealizePlacement)  # only realize exits PLAN_REFUSED (worker.outcome)
        plan = self.placement.task.plan
        log.warning("%s: %s; asking the service to build plan %d again", self.task_id, reason, plan.id)
        try:
            self.client.plan_invalid(
                plan.id,
                PlanInvalid(task_id=self.task_id, checksum=plan.checksum or "?", reason=reason[:MAX_MESSAGE_CHARS]),
            )
        except TaskGone:
            pass

    def _remove_stale_coupling(self, reason: str) -> None:
        """Remove the coupling file the map-maker refused, so that the next attempt builds it again.

        The overlap plan is not in question. A file another realisation of the site wrote since the refusal
        may go too: it is then built once more, which costs time and loses nothing.
        """
        assert isinstance(self.placement, RealizePlacement)  # only realize exits COUPLING_REFUSED (worker.outcome)
        coupling_file = self.placement.coupling_file
        if coupling_file is None:
            return
        log.warning("%s: %s; removing %s so that the next attempt builds it", self.task_id, reason, coupling_file)
        try:
            coupling_file.unlink(missing_ok=True)
        except OSError as error:
            log.error("%s: could not remove the refused coupling file %s: %s", self.task_id, coupling_file, error)

    def _report_failure(self, verdict: Verdict, *, note: str | None = None) -> None:
        """``note``: a cause found by the worker itself (the map-maker's stderr does not have it), kept last."""
        failure_class = verdict.outcome.failure_class
        assert failure_class is not None  # every outcome but succeeded and dropped has one
        stderr = self.folder.stderr_tail()
        if note:
            stderr = "\n".join(filter(None, [stderr.rstrip(), f"worker: {note}"]))
        report = TaskFailed(
            failure_class=failure_class,
            exit_code=verdict.exit_code,
            log_tail=log_tail(stderr),
            message=verdict.message[:MAX_MESSAGE_CHARS] or None,
        )
        log.warning("%s failed: %s: %s", self.placement.describe(), failure_class, verdict.message)
        self.client.failed(self.task_id, report)


def tidy(
    placement: Placement, folder: WorkFolder, reported: Reported, *, timeline: dict[str, Any], keep_work: bool
) -> None:
    """Write the timeline; remove what a finished task no longer needs (nothing of an unreported success)."""
    if folder.path.exists():
        try:
            atomic_write_json(folder.path / TIMELINE_FILE, timeline)
        except OSError:
            pass
    succeeded = reported.outcome is Outcome.SUCCEEDED and reported.delivered
    if isinstance(placement, RealizePlacement):
        realization_dir = placement.out.parent
        if folder.runner_ended() or not folder.launched():
            # Every process of this attempt is gone: its temporary folder is garbage.
            for entry in realization_dir.glob(partial_folder_prefix(placement.out.name) + "*"):
                remove_entry(entry)
        if succeeded:
            # The result is accepted: earlier attempts' folders (complete or not) are no longer wanted.
            for entry in realization_dir.iterdir():
                name = entry.name.lstrip(".")
                if entry != placement.out and name.startswith("attempt-"):
                    number = name.removeprefix("attempt-").split(".")[0]
                    if number.isdigit() and int(number) < placement.task.attempt:
                        remove_entry(entry)
    if succeeded and not keep_work:
        folder.remove()
