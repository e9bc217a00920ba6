"""Find the processes of MapCampaign tasks by the marker every one of them carries in its environment."""

from __future__ import annotations

import time

import psutil

MARKER_VAR = "MAPCAMPAIGN_TASK_MARKER"


def task_processes(prefix: str) -> list[tuple[int, str, str]]:
    """Live (not zombie) processes whose task marker starts with ``prefix``: (pid, marker, command line)."""
    found = []
    for process in psutil.process_iter():
        try:
            marker = process.environ().get(MARKER_VAR)
            if marker and marker.startswith(prefix) and process.status() != psutil.STATUS_ZOMBIE:
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
