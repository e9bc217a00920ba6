"""Heartbeat and liveness: the two threads that keep a held task the worker's while the loop is busy.

The heartbeat thread posts the ids of the held tasks every lease/3 and queues the service's answers for the
loop, which owns the runs; the liveness thread touches each running task's liveness file (the runner's
dead-man switch, :mod:`worker.runner`); the leftover sweep removes the work folders of stopped workers.
"""

from __future__ import annotations

import logging
import queue
import threading
from datetime import datetime

from schemas.programs import CancelReason
from worker.agent.state import AgentState
from worker.client import ServiceError
from worker.leftovers import start_sweep

log = logging.getLogger("mapcampaign.worker")

HEARTBEAT_BEFORE_A_LEASE_S = 10.0  # until the first claim tells the lease length
SHORTEST_HEARTBEAT_S = 0.2
LONGEST_HEARTBEAT_S = 60.0
LONGEST_TOUCH_S = 10.0


class Heartbeats(AgentState):
    def _heartbeat_interval(self) -> float:
        if self.settings.heartbeat_s is not None:
            return self.settings.heartbeat_s
        if self.lease_s is None:
            return HEARTBEAT_BEFORE_A_LEASE_S
        return min(max(self.lease_s / 3, SHORTEST_HEARTBEAT_S), LONGEST_HEARTBEAT_S)

    def _note_lease(self, expires_at: datetime, lease_s: float | None) -> None:
        """The lease length the heartbeat interval follows: the service's own figure when it sends one;
        else its expiry time less this machine's clock, which is off by any difference between the clocks."""
        if lease_s is None:
            lease_s = expires_at.timestamp() - self.clock.time()
        self.lease_s = max(lease_s, 0.5)

    def _beat(self, stop: threading.Event) -> None:
        """The heartbeat thread: every interval, while tasks are held, post their ids; the loop gets the answer."""
        worker_id = self.worker_id
        assert worker_id is not None, "registered before the loop starts"
        while not self.clock.wait(stop, self._heartbeat_interval()):
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
        return min(self.site.runner.liveness_timeout_s / 4, LONGEST_TOUCH_S)

    def _sweep_leftovers(self) -> None:
        """Remove, in the background, the work folders of stopped workers (worker.leftovers): before any claim."""
        if self.settings.keep_work:  # kept for inspection: those of earlier runs too
            return
        start_sweep(
            self.layout.work,
            self.host,
            touch_interval_s=self.touch_interval_s,
            stop=self.quit,
            owned=self.runs,
            clock=self.clock,
        )

    def _touch_liveness(self) -> None:
        while not self.clock.wait(self.quit, self.touch_interval_s):
            with self.lock:
                runs = list(self.runs.values())
            for run in runs:
                try:
                    run.touch()
                except Exception:  # this thread must outlive any one failure: the runners depend on it
                    log.exception("%s: touching its liveness file failed", run.task_id)
