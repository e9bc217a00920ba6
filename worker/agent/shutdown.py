"""Starting and stopping: Parsl up and down, SIGTERM/SIGINT turned into a drain deadline, the drain itself."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import parsl

from schemas.programs import CancelReason
from worker.agent.state import EXIT_FAILED, AgentState
from worker.apps import mpi_task
from worker.parsl_config import EXECUTOR_LABEL, build_parsl_config, local_nodefile_text
from worker.site import LocalProviderSpec

log = logging.getLogger("mapcampaign.worker")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Shutdown(AgentState):
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

    def _catch_stop_signals(self) -> dict[int, Callable[[int, Any], Any] | int | None]:
        """Route SIGTERM and SIGINT to :meth:`_on_signal`; return the handlers they had."""
        return {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}

    def _on_signal(self, signum: int, _frame: object) -> None:
        """The first signal drains until ``drain_s`` from now; a second one ends the wait at once."""
        self.stop_signals += 1
        now = self.clock.monotonic()
        if self.stop_signals == 1:
            self.drain_deadline = now + self.settings.drain_s
        else:
            self.drain_deadline = now
        self.wake.set()

    def _parsl_failed(self, now: float, drain_deadline: float | None) -> bool:
        """When the Parsl executor has failed (and no drain runs yet): start one that ends at once, exit 1."""
        if self.executor is None or not getattr(self.executor, "bad_state_is_set", False) or drain_deadline is not None:
            return False
        log.error("the Parsl executor failed: %s; stopping", getattr(self.executor, "executor_exception", ""))
        self.exit_code = EXIT_FAILED
        self.drain_deadline = now
        return True

    def _announce_drain(self, now: float, drain_deadline: float) -> None:
        """Once, as the drain begins: hand back the tasks still queued in Parsl, before a block starts them."""
        waiting = [run for run in self.runs.values() if run.finishing is None and not run.launched()]
        log.info(
            "stopping: no more claims; %d running tasks may finish for %.0f s; %d not started handed back",
            len(self.runs) - len(waiting), max(0.0, drain_deadline - now), len(waiting),
        )  # fmt: skip
        for run in waiting:
            run.request_stop(CancelReason.DRAIN)

    def _end_running_tasks(self) -> None:
        """At the drain deadline: ask every task still held to stop; they are reported ``drained``."""
        self.stopped_tasks = True
        log.warning("drain deadline: ending %d running tasks and handing them back", len(self.runs))
        for run in list(self.runs.values()):
            run.request_stop(CancelReason.DRAIN)
