"""The worker's loop: register, claim up to free capacity, run tasks through Parsl, heartbeat, drain on SIGTERM.

One thread runs the loop (and owns Parsl); a small pool of reporting threads
uploads products and posts reports, so the loop goes on while a large
product is uploaded; one thread sends the heartbeats, so that a claim whose
answer is slow (it may wait 90 s) or a slow launch cannot let the leases of
running tasks expire; one thread touches the liveness files of running
tasks (the runner's dead-man switch, :mod:`worker.runner`).

Each pass of the loop:

1. tasks whose finishing (report) is done leave the worker;
2. running tasks: report ``started`` once the runner is up; hand ended tasks
   to the reporting pool; a task stopped before its runner started is
   reported at once;
3. draining: after the deadline, ask every running task to stop;
4. the answers of the heartbeats (sent every lease/3 by their own thread
   while tasks are held): ``cancel`` -> stop and report cancelled; ``lost``
   -> stop and report nothing;
5. claim ``max_tasks - held`` tasks, unless draining; an empty answer waits
   ``MAPCAMPAIGN_WORKER_POLL_S`` before the next claim. After
   ``LAUNCH_FAILURES_BEFORE_PAUSE`` tasks in a row that this worker could not
   even hand to Parsl (its work folder cannot be written: disk full, quota,
   permissions; Parsl refusing), it stops claiming for 30 s, doubling to 10
   min while it goes on failing: a broken site must not burn the attempts of
   the whole queue in seconds. Such tasks are reported ``site_error``, which
   the service requeues without charging the attempt (up to 3 times per
   realisation).

SIGTERM or SIGINT: stop claiming; running tasks may finish until
``MAPCAMPAIGN_WORKER_DRAIN_S``; then they are killed (whole process tree) and
reported ``drained``, which the service requeues without charging the
attempt to ``max_attempts`` (up to 5 drains per realisation; a lease expiry,
``lost_worker``, is charged). Tasks not yet started are handed back at once.
A second signal skips the wait. The worker then shuts Parsl down (its blocks
end) and exits 0.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import parsl

from schemas.api import HeartbeatAnswer, WorkerRegistration
from schemas.programs import CancelReason
from worker.apps import mpi_task
from worker.client import NotAuthorized, ServiceClient, ServiceError, TaskGone
from worker.instruments import fetch_uploads
from worker.layout import SiteLayout
from worker.leftovers import start_sweep
from worker.outcome import Outcome, Verdict
from worker.parsl_config import EXECUTOR_LABEL, build_parsl_config, local_nodefile_text
from worker.settings import WorkerSettings
from worker.site import LocalProviderSpec, SiteConfig, declared_sky_maps
from worker.tasks import TaskContext, TaskRun

log = logging.getLogger("mapcampaign.worker")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
LAUNCH_FAILURES_BEFORE_PAUSE = 3
FIRST_LAUNCH_PAUSE_S = 30.0
LONGEST_LAUNCH_PAUSE_S = 600.0
STOP_BACKSTOP_S = 30.0  # after a stop request: wait the kill grace plus this for the runner, then report anyway


class Agent:
    def __init__(self, settings: WorkerSettings, site: SiteConfig, token: str):
        self.settings = settings
        self.site = site
        self.layout = SiteLayout.for_site(site, settings.data_dir)
        self.name = settings.worker_name(site.name)
        self.host = socket.gethostname()
        self.python = site.python or sys.executable
        self.run_id = uuid.uuid4().hex[:12]
        self.client = ServiceClient(
            settings.api_url, token, timeout_s=settings.timeout_s, retry_s=settings.report_retry_s
        )
        self.context = TaskContext(
            site=site,
            layout=self.layout,
            python=self.python,
            marker_prefix=f"{site.name}:{self.name}:{self.run_id}",
            client=self.client,
            keep_work=settings.keep_work,
        )
        self.worker_id: int | None = None
        self.runs: dict[str, TaskRun] = {}
        self.detached: list[TaskRun] = []  # reported, but Parsl may still hold a slot for them
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.quit = threading.Event()
        self.stop_signals = 0
        self.drain_deadline: float | None = None
        self.stopped_tasks = False
        self.exit_code = EXIT_OK
        self.lease_s: float | None = None
        self.heartbeat_answers: queue.SimpleQueue[HeartbeatAnswer] = queue.SimpleQueue()  # heartbeat thread -> loop
        self.launch_failures_in_a_row = 0
        self.claims_paused_until = 0.0  # time.monotonic()
        self.reporters = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="report")
        self.dfk: Any = None
        self.executor: Any = None
        self.app: Any = None

    # ------------------------------------------------------------------ start and stop

    def run(self) -> int:
        self.layout.create()
        if not self._register():
            return EXIT_FAILED
        try:
            self._start_parsl()
        except Exception as error:  # noqa: BLE001 -- any failure to start Parsl ends the worker with a message
            log.error("cannot start Parsl for site %r: %s: %s", self.site.name, type(error).__name__, error)
            return EXIT_FAILED
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        toucher = threading.Thread(target=self._touch_liveness, name="liveness", daemon=True)
        toucher.start()
        self._sweep_leftovers()
        try:
            self._loop()
        finally:
            self.quit.set()
            self.reporters.shutdown(wait=True)
            self._stop_parsl()
            self.client.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("worker %s stopped", self.name)
        return self.exit_code

    def _register(self) -> bool:
        capacity = self.site.max_tasks
        registration = WorkerRegistration(
            name=self.name,
            site=self.site.name,
            host=self.host[:255],
            capacity=capacity,
            sky_maps=declared_sky_maps(self.site.sky_root),
            data_dir=str(self.layout.root),
        )
        pause = 1.0
        while True:
            try:
                info = self.client.register(registration, retry_s=0)
            except NotAuthorized as error:
                log.error(
                    "the service refused the worker token: %s (make one with `mapcampaign token create --worker`)",
                    error,
                )
                return False
            except ServiceError as error:
                if error.status is not None:
                    log.error("registration refused: %s", error)
                    return False
                log.warning(
                    "cannot reach the service at %s (%s); trying again in %.0f s", self.settings.server, error, pause
                )
                if self.quit.wait(pause):
                    return False
                pause = min(pause * 2, 30.0)
                continue
            self.worker_id = info.id
            log.info(
                "worker %s (id %d) registered for site %r at %s: %d tasks at once, data in %s",
                self.name, info.id, self.site.name, self.settings.server, capacity, self.layout.root,
            )  # fmt: skip
            return True

    def _start_parsl(self) -> None:
        # Parsl starts interchange.py and process_worker_pool.py by name: the environment's bin first.
        bin_dir = str(Path(self.python).parent)
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        run_dir = self.layout.parsl_dir(self.name)
        run_dir.mkdir(parents=True, exist_ok=True)
        nodefile = None
        if isinstance(self.site.provider, LocalProviderSpec):
            nodefile = run_dir / "nodefile"
            nodefile.write_text(local_nodefile_text(self.host, self.site.tasks_per_block))
        config = build_parsl_config(self.site, run_dir=run_dir, python=self.python, nodefile=nodefile)
        logging.getLogger("parsl").propagate = False  # Parsl logs to parsl.log in its run folder
        self.dfk = parsl.load(config)
        self.executor = self.dfk.executors[EXECUTOR_LABEL]
        self.app = mpi_task
        log.info(
            "Parsl started: %s provider, %s launcher (run folder %s)",
            self.site.provider.kind,
            self.site.mpi.launcher,
            run_dir,
        )

    def _stop_parsl(self) -> None:
        if self.dfk is None:
            return
        try:
            self.dfk.cleanup()
        except Exception as error:  # noqa: BLE001 -- shutting down: say it, do not mask the exit status
            log.warning("Parsl cleanup: %s: %s", type(error).__name__, error)
        parsl.clear()
        self.dfk = None

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop_signals += 1
        now = time.monotonic()
        if self.stop_signals == 1:
            self.drain_deadline = now + self.settings.drain_s
        else:
            self.drain_deadline = now
        self.wake.set()

    # ------------------------------------------------------------------ the loop

    @property
    def draining(self) -> bool:
        return self.drain_deadline is not None

    def _loop(self) -> None:
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
            now = time.monotonic()
            self._collect_finished()
            self._apply_heartbeat_answers()
            self._watch_runs(now)
            drain_deadline = self.drain_deadline  # once per pass: a signal may set it at any moment
            if drain_deadline is not None and not announced_drain:
                announced_drain = True
                waiting = [run for run in self.runs.values() if run.finishing is None and not run.launched()]
                log.info(
                    "stopping: no more claims; %d running tasks may finish for %.0f s; %d not started handed back",
                    len(self.runs) - len(waiting), max(0.0, drain_deadline - now), len(waiting),
                )  # fmt: skip
                for run in waiting:  # still queued in Parsl: hand them back now, before a block starts them
                    run.request_stop(CancelReason.DRAIN)
            if drain_deadline is not None and now >= drain_deadline and not self.stopped_tasks and self.runs:
                self.stopped_tasks = True
                log.warning("drain deadline: ending %d running tasks and handing them back", len(self.runs))
                for run in list(self.runs.values()):
                    run.request_stop(CancelReason.DRAIN)
                continue
            if drain_deadline is not None and not self.runs:
                return
            if (
                self.executor is not None
                and getattr(self.executor, "bad_state_is_set", False)
                and drain_deadline is None
            ):
                log.error("the Parsl executor failed: %s; stopping", getattr(self.executor, "executor_exception", ""))
                self.exit_code = EXIT_FAILED
                self.drain_deadline = now
                continue
            if not self.draining and now >= next_claim and now >= self.claims_paused_until:
                free = self._free_slots()
                if free > 0:
                    claimed = self._claim(free)
                    next_claim = now if claimed and claimed == free else now + self.settings.poll_s
            self.wake.wait(0.25)

    def _free_slots(self) -> int:
        self.detached = [run for run in self.detached if run.future is not None and not run.future.done()]
        return self.site.max_tasks - len(self.runs) - len(self.detached)

    def _heartbeat_interval(self) -> float:
        if self.settings.heartbeat_s is not None:
            return self.settings.heartbeat_s
        if self.lease_s is None:
            return 10.0
        return min(max(self.lease_s / 3, 0.2), 60.0)

    def _note_lease(self, expires_at: datetime, lease_s: float | None) -> None:
        """The lease length the heartbeat interval follows: the service's own figure when it sends one;
        else its expiry time less this machine's clock, which is off by any difference between the clocks."""
        if lease_s is None:
            lease_s = (expires_at - datetime.now(UTC)).total_seconds()
        self.lease_s = max(lease_s, 0.5)

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
        self.claims_paused_until = time.monotonic() + pause
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

    def _collect_finished(self) -> None:
        for run in list(self.runs.values()):
            if run.finishing is None or not run.finishing.done():
                continue
            with self.lock:
                self.runs.pop(run.task_id, None)
            error = run.finishing.exception()
            if error is not None:
                log.error("%s: reporting failed: %s: %s", run.task_id, type(error).__name__, error)

    def _beat(self, stop: threading.Event) -> None:
        """The heartbeat thread: every interval, while tasks are held, post their ids; the loop gets the answer."""
        worker_id = self.worker_id
        assert worker_id is not None, "registered before the loop starts"
        while not stop.wait(self._heartbeat_interval()):
            with self.lock:
                held = list(self.runs)
            if not held:
                continue
            try:
                answer = self.client.heartbeat(worker_id, held)
            except ServiceError as error:
                log.warning("heartbeat failed: %s", error)
                continue
            except Exception:  # this thread must outlive any one failure: the leases depend on it
                log.exception("heartbeat failed")
                continue
            if answer.extended:
                self._note_lease(answer.lease_expires_at, answer.lease_s)
            self.heartbeat_answers.put(answer)
            self.wake.set()

    def _apply_heartbeat_answers(self) -> None:
        """In the loop, which owns the runs: stop what the service cancelled or no longer counts as ours."""
        while True:
            try:
                answer = self.heartbeat_answers.get_nowait()
            except queue.Empty:
                return
            for task_id in answer.cancel:
                run = self.runs.get(task_id)
                if run is not None and run.stop_reason is None:
                    log.info("%s: cancelled by the service; ending it", task_id)
                    run.request_stop(CancelReason.CANCELLED)
            for task_id in answer.lost:
                run = self.runs.get(task_id)
                if run is not None and run.finishing is not None and (run.folder.removed or run.runner_ended()):
                    # Ended and being reported: a heartbeat that reached the service after it accepted the
                    # report reads "not yours"; nothing is left to stop, and the report's answer tells the rest.
                    continue
                if run is not None and run.stop_reason is not CancelReason.LOST:
                    log.warning("%s: the service says it is no longer ours; ending it without a report", task_id)
                    run.request_stop(CancelReason.LOST)

    @property
    def touch_interval_s(self) -> float:
        """How often the liveness files of running tasks are touched."""
        return min(self.site.runner.liveness_timeout_s / 4, 10.0)

    def _sweep_leftovers(self) -> None:
        """Remove, in the background, the work folders of stopped workers (worker.leftovers): before any claim."""
        if self.settings.keep_work:  # kept for inspection: those of earlier runs too
            return
        start_sweep(
            self.layout.work, self.host, touch_interval_s=self.touch_interval_s, stop=self.quit, owned=self.runs
        )

    def _touch_liveness(self) -> None:
        while not self.quit.wait(self.touch_interval_s):
            with self.lock:
                runs = list(self.runs.values())
            for run in runs:
                try:
                    run.touch()
                except Exception:  # this thread must outlive any one failure: the runners depend on it
                    log.exception("%s: touching its liveness file failed", run.task_id)


def run_worker(settings: WorkerSettings, site: SiteConfig, token: str) -> int:
    """Run the worker until SIGTERM/SIGINT; return its exit status."""
    return Agent(settings, site, token).run()
