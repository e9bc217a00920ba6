"""The claim loop: one thread, which owns the runs and Parsl, passes over the held tasks and claims more.

Each pass (:meth:`ClaimLoop._pass_loop`): tasks whose report is done leave; the heartbeats' answers are
applied; running tasks report ``started``, ended ones go to the reporting pool; a drain stops what it must;
then as many tasks as there are free slots (:meth:`ClaimLoop._free_slots`) are claimed, unless draining,
paused, or the last claim found nothing and no report has landed since.
"""

from __future__ import annotations

import functools
import logging
import threading

from schemas.programs import CancelReason
from worker.agent.heartbeat import Heartbeats
from worker.agent.shutdown import Shutdown
from worker.client import ServiceError, TaskGone
from worker.instruments import fetch_uploads
from worker.outcome import Outcome, Verdict
from worker.tasks import TaskRun

log = logging.getLogger("mapcampaign.worker")

LAUNCH_FAILURES_BEFORE_PAUSE = 3
FIRST_LAUNCH_PAUSE_S = 30.0
LONGEST_LAUNCH_PAUSE_S = 600.0
STOP_BACKSTOP_S = 30.0  # after a stop request: wait the kill grace plus this for the runner, then report anyway
PASS_WAIT_S = 0.25  # the longest a pass waits for news (a future done, a heartbeat answer, a signal)


class ClaimLoop(Heartbeats, Shutdown):
    def _loop(self) -> None:
        """The loop, with the heartbeat thread beside it for as long as it runs."""
        stop_beating = threading.Event()
        beater = threading.Thread(target=self._beat, args=(stop_beating,), name="heartbeat", daemon=True)
        beater.start()
        try:
            self._pass_loop()
        finally:
            stop_beating.set()
            beater.join(timeout=self.settings.timeout_s + 1.0)

    def _pass_loop(self) -> None:
        next_claim = 0.0
        announced_drain = False
        while True:
            self.wake.clear()
            now = self.clock.monotonic()
            if self._collect_finished():
                # A report landed: it may have made work claimable (a plan's report, the realisations
                # waiting for it), so claim now rather than after the poll interval of an empty claim.
                next_claim = now
            self._apply_heartbeat_answers()
            self._watch_runs(now)
            drain_deadline = self.drain_deadline  # once per pass: a signal may set it at any moment
            if drain_deadline is not None and not announced_drain:
                announced_drain = True
                self._announce_drain(now, drain_deadline)
            if drain_deadline is not None and now >= drain_deadline and not self.stopped_tasks and self.runs:
                self._end_running_tasks()
                continue
            if drain_deadline is not None and not self.runs:
                return
            if self._parsl_failed(now, drain_deadline):
                continue
            if not self.draining and now >= next_claim and now >= self.claims_paused_until:
                self._poll_fetches()
                free = self._free_slots()
                if free > 0:
                    claimed = self._claim(free)
                    next_claim = now if claimed and claimed == free else now + self.settings.poll_s
            self.clock.wait(self.wake, PASS_WAIT_S)

    def _free_slots(self) -> int:
        """Tasks to claim: ``max_tasks`` less the tasks still running and the Parsl slots detached tasks hold.

        A task being reported holds no slot: its runner has ended, and its upload and report (the service
        runs its hooks, the aggregates' update among them, before it answers) go on beside the next task
        rather than before it. Once more than ``max_tasks`` reports are in flight, nothing is claimed until one
        lands, so a worker does not run ahead of a service that answers slowly.
        """
        self.detached = [run for run in self.detached if run.future is not None and not run.future.done()]
        reporting = sum(1 for run in self.runs.values() if run.finishing is not None)
        if reporting > self.site.max_tasks:
            return 0
        return self.site.max_tasks - (len(self.runs) - reporting) - len(self.detached)

    def _claim(self, free: int) -> int:
        assert self.worker_id is not None
        try:
            answer = self.client.claim(self.worker_id, free)
        except ServiceError as error:
            log.warning("claim failed: %s", error)
            return 0
        for task in answer.tasks:
            self._note_lease(task.lease_expires_at, answer.lease_s)
            run = TaskRun(task, self.context)
            with self.lock:
                self.runs[run.task_id] = run
            self._launch(run)
        return len(answer.tasks)

    def _launch(self, run: TaskRun) -> None:
        verdict = run.precheck()
        if verdict is None:
            try:
                fetch_uploads(run.task.spec, self.site.instrument_root, self.client)
                run.prepare()
                future = run.submit(self.app)
                future.add_done_callback(lambda _future: self.wake.set())
                log.info("%s submitted", run.describe())
                self.launch_failures_in_a_row = 0
                return
            except Exception as error:
                log.exception("%s could not be submitted", run.task_id)
                verdict = Verdict(  # the site's fault, not the task's: the service gives the attempt back
                    Outcome.SITE_ERROR, None, f"could not submit the task: {type(error).__name__}: {error}"
                )
                self._note_launch_failure(verdict.message)
        run.early_verdict = verdict
        self._finish(run)

    def _note_launch_failure(self, cause: str) -> None:
        """Count a task this worker could not launch; pause claiming after several in a row."""
        self.launch_failures_in_a_row += 1
        beyond = self.launch_failures_in_a_row - LAUNCH_FAILURES_BEFORE_PAUSE
        if beyond < 0:
            return
        pause = min(FIRST_LAUNCH_PAUSE_S * 2 ** min(beyond, 16), LONGEST_LAUNCH_PAUSE_S)
        self.claims_paused_until = self.clock.monotonic() + pause
        log.error(
            "%d tasks in a row could not be launched at this site (last: %s); claiming nothing for %.0f s",
            self.launch_failures_in_a_row, cause, pause,
        )  # fmt: skip

    def _watch_runs(self, now: float) -> None:
        for run in list(self.runs.values()):
            if run.finishing is not None:
                continue
            if not run.started_reported and run.launched() and run.stop_reason is None:
                try:
                    run.report_started()
                except TaskGone as gone:
                    # Cancelled or reassigned: end it either way. Reported as cancelled, which the service
                    # records for a cancelled attempt and refuses (409, harmless) for a reassigned one.
                    log.info("%s is no longer this worker's (%s): stopping it", run.task_id, gone)
                    run.request_stop(CancelReason.CANCELLED)
                except ServiceError as error:
                    log.warning("%s: started report failed: %s", run.task_id, error)
                    run.started_reported = True  # the next report carries the news
            if run.ended():
                self._finish(run)
            elif run.stop_reason is not None and not run.launched():
                # Stopped while queued in Parsl: the runner will see the cancel file and launch nothing.
                self._finish(run, detach=True)
            elif run.stop_requested_at is not None and (
                now - run.stop_requested_at > self.site.runner.kill_grace_s + STOP_BACKSTOP_S
            ):
                log.warning("%s: no status from its runner after the stop request; reporting it anyway", run.task_id)
                self._finish(run, detach=True)

    def _finish(self, run: TaskRun, *, detach: bool = False) -> None:
        if detach and run.future is not None:
            self.detached.append(run)
        run.finishing = self.reporters.submit(run.finish)
        run.finishing.add_done_callback(lambda _future: self.wake.set())

    def _collect_finished(self) -> int:
        """Let the tasks whose report is done leave the worker; return how many left."""
        collected = 0
        for run in list(self.runs.values()):
            if run.finishing is None or not run.finishing.done():
                continue
            collected += 1
            with self.lock:
                self.runs.pop(run.task_id, None)
            error = run.finishing.exception()
            if error is not None:
                log.error("%s: reporting failed: %s: %s", run.task_id, type(error).__name__, error)
            self._send_sums_after(run)
        return collected

    def _poll_fetches(self) -> None:
        """At the claims' pace: the kept files the service was asked for, each sent by a reporting thread."""
        if self.site_store is None or self.worker_id is None:
            return
        try:
            requests = self.client.kept_file_requests(self.worker_id).requests
        except ServiceError as error:
            log.warning("could not list the kept files the service asks for: %s", error)
            return
        for request in requests:
            key = (request.campaign_id, request.realization, request.role)
            if key in self.fetches_in_flight:
                continue
            self.fetches_in_flight.add(key)
            done = self.reporters.submit(self.site_store.serve_fetch, self.client, request)
            done.add_done_callback(functools.partial(self._fetch_done, key))

    def _fetch_done(self, key: tuple[int, int, str], _future: object) -> None:
        self.fetches_in_flight.discard(key)

    def _send_sums_after(self, run: TaskRun) -> None:
        """The worker's last task of a campaign ended: send the site's partial map sums of it now."""
        campaign_id = getattr(run.task, "campaign_id", None)
        if self.site_store is None or run.task.kind != "realize" or campaign_id is None:
            return
        if any(getattr(other.task, "campaign_id", None) == campaign_id for other in self.runs.values()):
            return
        self.reporters.submit(self.site_store.send, self.client, campaign_id, force=True)
