"""Work folders a dead worker left behind (``<site data>/work/<task id>/``), removed by the live workers of the site.

A worker removes a task's work folder once the task is reported; a worker killed
(SIGKILL, node lost) leaves its folders, and the service requeues its tasks when
their leases expire. Every worker sweeps its site's work folder when it starts
and then again every :data:`QUIET_TOUCHES` touch intervals while it runs, so the
folders of a worker killed beside live ones go once they are provably dead, not
only when some worker starts again. Several workers may share a site folder,
on this host and on others, so a folder is removed only when it provably belongs
to nobody alive:

1. no worker touches its liveness file: the file's modification time (or its
   absence) stays the same over :data:`QUIET_TOUCHES` touch intervals, while a
   live worker touches the folders of its tasks every interval until it removes
   them (:meth:`worker.agent.heartbeat.Heartbeats._touch_liveness`). Only changes are compared,
   never clocks;
2. and its runner is gone: it wrote ``status.json``, or ``runner.json`` names
   this host and its runner process is no longer there, or no runner ever
   started in it.

A runner on another node that has not ended yet is left alone: with nobody
touching its liveness file it ends itself (the runner's dead-man switch) and the
next start removes its folder.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

import psutil
from pydantic import ValidationError

from schemas.programs import LIVENESS_FILE, RUNNER_FILE, STATUS_FILE, RunnerStarted
from worker.clock import SYSTEM_CLOCK, Clock
from worker.layout import remove_entry

log = logging.getLogger("mapcampaign.worker")

QUIET_TOUCHES = 3  # touch intervals a liveness file must stay unchanged: one missed touch is no proof


def _stamp(path: Path) -> int | None:
    """The file's modification time in ns, None when it is not there (or cannot be read just now)."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def runner_alive(folder: Path, started: RunnerStarted, host: str) -> bool:
    """Whether the runner of ``folder`` may still be running: always True for a runner on another host."""
    if started.host != host:
        return True
    try:
        arguments = psutil.Process(started.runner_pid).cmdline()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # cannot look (another user's process): not provably gone
        return True
    return str(folder) in arguments  # else the pid was reused by another program


def runner_gone(folder: Path, host: str) -> bool:
    if (folder / STATUS_FILE).exists():
        return True
    try:
        text = (folder / RUNNER_FILE).read_text()
    except FileNotFoundError:
        return True  # never launched
    except OSError:
        return False
    try:
        started = RunnerStarted.model_validate_json(text)
    except ValidationError:
        return False  # half-written, or a runner this worker does not understand
    return not runner_alive(folder, started, host)


@dataclass
class LeftoverSweep:
    """The work folders there when a worker starts, and their liveness stamps then."""

    work: Path
    host: str
    stamps: dict[Path, int | None]

    @classmethod
    def begin(cls, work: Path, host: str) -> LeftoverSweep:
        """Note the folders and liveness stamps now: before this worker claims (and makes folders of its own)."""
        try:
            folders = [entry for entry in work.iterdir() if entry.is_dir() and not entry.is_symlink()]
        except OSError:
            folders = []
        return cls(work, host, {folder: _stamp(folder / LIVENESS_FILE) for folder in folders})

    def finish(self, owned: Container[str] = ()) -> list[Path]:
        """After the quiet wait: remove the folders nobody touched whose runner is gone; return them.

        ``owned``: task ids this worker runs now, never removed.
        """
        removed = []
        for folder, stamp in self.stamps.items():
            if folder.name in owned or _stamp(folder / LIVENESS_FILE) != stamp or not folder.exists():
                continue
            if runner_gone(folder, self.host):
                remove_entry(folder)
                removed.append(folder)
        if removed:
            log.info("removed %d work folders left by stopped workers in %s", len(removed), self.work)
        return removed


def start_sweep(
    work: Path,
    host: str,
    *,
    touch_interval_s: float,
    stop: threading.Event,
    owned: Container[str],
    clock: Clock = SYSTEM_CLOCK,
) -> threading.Thread:
    """Note the folders now, then in a thread of its own wait QUIET_TOUCHES touch intervals and remove the
    leftovers; then note them again, and so on until ``stop`` is set.

    The worker claims meanwhile: its own folders are new, not among those first noted, and later ones are
    in ``owned`` (and touched) while they run. Nothing is removed once ``stop`` is set.
    """
    sweep = LeftoverSweep.begin(work, host)

    def sweep_while_running() -> None:
        nonlocal sweep
        while not clock.wait(stop, QUIET_TOUCHES * touch_interval_s):
            try:
                sweep.finish(owned)
            except Exception:  # a failed sweep is tried again at the next round; the worker goes on
                log.exception("removing the work folders of stopped workers failed")
            sweep = LeftoverSweep.begin(work, host)

    thread = threading.Thread(target=sweep_while_running, name="leftovers", daemon=True)
    thread.start()
    return thread
