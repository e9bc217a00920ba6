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
5. claim ``max_tasks - running`` tasks, unless draining: a task being
   reported no longer counts, so the next realisation starts while the last
   one's products are uploaded and the service runs its hooks (nothing is
   claimed while more than ``max_tasks`` reports are in flight). An empty answer waits
   ``MAPCAMPAIGN_WORKER_POLL_S`` before the next claim, unless a report lands
   first (a plan's report makes its realisations claimable). After
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

The parts, one module each, share the fields of :class:`~worker.agent.state.AgentState`:
:mod:`~worker.agent.registration`, :mod:`~worker.agent.claims` (the loop),
:mod:`~worker.agent.heartbeat` (heartbeat, liveness and leftover threads) and
:mod:`~worker.agent.shutdown` (Parsl, signals, the drain). Every part reads the time
from one :class:`worker.clock.Clock`, which a test replaces to move time itself.
"""

from __future__ import annotations

import logging
import signal
import threading

from worker.agent.claims import (
    FIRST_LAUNCH_PAUSE_S,
    LAUNCH_FAILURES_BEFORE_PAUSE,
    LONGEST_LAUNCH_PAUSE_S,
    STOP_BACKSTOP_S,
    ClaimLoop,
)
from worker.agent.registration import Registration
from worker.agent.state import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from worker.clock import SYSTEM_CLOCK, Clock
from worker.settings import WorkerSettings
from worker.site import SiteConfig

log = logging.getLogger("mapcampaign.worker")

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "FIRST_LAUNCH_PAUSE_S",
    "LAUNCH_FAILURES_BEFORE_PAUSE",
    "LONGEST_LAUNCH_PAUSE_S",
    "STOP_BACKSTOP_S",
    "Agent",
    "run_worker",
]


class Agent(Registration, ClaimLoop):
    """One worker at one site, from registration to exit."""

    def run(self) -> int:
        self.layout.create()
        if not self._register():
            return EXIT_FAILED
        try:
            self._start_parsl()
        except Exception as error:  # noqa: BLE001 -- any failure to start Parsl ends the worker with a message
            log.error("cannot start Parsl for site %r: %s: %s", self.site.name, type(error).__name__, error)
            return EXIT_FAILED
        previous = self._catch_stop_signals()
        toucher = threading.Thread(target=self._touch_liveness, name="liveness", daemon=True)
        toucher.start()
        self._sweep_leftovers()
        if self.site_store is not None:
            self.site_store.repair()  # journalled realisations a stopped worker had not added yet
            self.reporters.submit(self.site_store.send_all, self.client)
        try:
            self._loop()
        finally:
            self.quit.set()
            self.reporters.shutdown(wait=True)
            if self.site_store is not None:
                self.site_store.send_all(self.client)
            self._stop_parsl()
            self.client.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("worker %s stopped", self.name)
        return self.exit_code


def run_worker(settings: WorkerSettings, site: SiteConfig, token: str, *, clock: Clock = SYSTEM_CLOCK) -> int:
    """Run the worker until SIGTERM/SIGINT; return its exit status."""
    return Agent(settings, site, token, clock=clock).run()
