"""Find the processes of MapCampaign tasks by the marker every one of them carries in its environment.

The helpers live in :mod:`benchmarks._support` (the dispatch benchmark starts workers too).
"""

from __future__ import annotations

from benchmarks._support import SCOPE, SCOPE_VAR, task_processes, wait_for_no_task_processes

__all__ = ["SCOPE", "SCOPE_VAR", "task_processes", "wait_for_no_task_processes"]
