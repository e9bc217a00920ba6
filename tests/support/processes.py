"""Find the processes of MapCampaign tasks by the marker every one of them carries in its environment."""

from __future__ import annotations

import os
import time
import uuid

import psutil

from schemas.programs import MARKER_VARIABLE

# Workers started by this pytest process carry this in their environment, and so does every process of
# their tasks: two test sessions on one machine (two checkouts) use the same worker names, and must not
# count each other's tasks as their own.
SCOPE_VAR = "MAPCAMPAIGN_TEST_SCOPE"
SCOPE = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _ours(environment: dict[str, str]) -> bool:
    """A process without the scope variable (an MPI launcher that dropped it) is counted, to be safe."""
    return environment.get(SCOPE_VAR, SCOPE) == SCOPE


def task_processes(prefix: str) -> list[tuple[int, str, str]]:
    """Live (not zombie) processes whose task marker starts with ``prefix``: (pid, marker, command line)."""
    found = []
    for process in psutil.process_iter():
        try:
            environment = process.environ()
            marker = environment.get(MARKER_VARIABLE)
            if (
                marker
                and marker.startswith(prefix)
                and _ours(environment)
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                found.append((process.pid, marker, " ".join(process.cmdline())[:200]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def wait_for_no_task_processes(prefix: str, timeout: float = 10.0) -> list[tuple[int, str, str]]:
    """Survivors still alive after ``timeout`` seconds (empty when every process of the tasks is gone)."""
    deadline = time.monotonic() + timeout
    while True:
        survivors = task_processes(prefix)
        if not survivors or time.monotonic() > deadline:
            return survivors
        time.sleep(0.2)
