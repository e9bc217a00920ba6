"""The task runner's files read back as the worker reads them (no MPI: tests/mpi has the process-tree cases)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from schemas.programs import LIVENESS_FILE, CancelReason, Ending
from tests.support.clock import FakeClock
from worker.runner import _Liveness, write_cancel
from worker.stages.run import WorkFolder


def run_runner(workdir: Path, *command: str) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "worker.runner", "--workdir", str(workdir), "--marker", "test:runner-files"]
    args += ["--walltime-s", "60", "--grace-s", "1", "--", *command]
    return subprocess.run(args, capture_output=True, timeout=60, check=False).returncode


def test_a_command_that_exits_leaves_a_start_and_a_status_the_worker_reads(tmp_path):
    assert run_runner(tmp_path, "sh", "-c", "exit 3") == 3
    folder = WorkFolder(tmp_path, task_id="realize-1")
    started, found = folder.runner_started(), folder.status()
    assert started is not None and started.marker == "test:runner-files" and started.pid == started.pgid
    assert found.problem is None and found.status is not None
    status = found.status
    assert (status.ending, status.exit_code, status.launched, status.stragglers) == (Ending.EXITED, 3, True, 0)
    assert status.launched_at == started.launched_at and status.ended_at >= status.launched_at
    assert folder.launched() and folder.runner_ended()


def test_a_task_cancelled_before_its_launch_is_never_started(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    write_cancel(tmp_path, CancelReason.DRAIN)
    assert run_runner(tmp_path, "touch", str(tmp_path / "started")) == 1
    folder = WorkFolder(tmp_path, task_id="realize-1")
    status = folder.status().status
    assert status is not None and folder.runner_started() is None and not (tmp_path / "started").exists()
    assert (status.ending, status.cancel_reason, status.launched, status.exit_code) == (
        Ending.CANCELLED,
        CancelReason.DRAIN,
        False,
        None,
    )


def test_the_dead_man_switch_trips_when_the_liveness_file_goes_untouched_for_its_timeout(tmp_path):
    clock = FakeClock()
    path = tmp_path / LIVENESS_FILE
    path.touch()
    os.utime(path, ns=(1, 1))
    liveness = _Liveness(path, timeout_s=20.0, clock=clock)
    clock.advance(20.0)
    assert not liveness.stale()  # exactly the timeout: not yet
    os.utime(path, ns=(2, 2))  # the worker touched it: the timeout starts again from here
    clock.advance(15.0)
    assert not liveness.stale()
    clock.advance(15.0)
    assert not liveness.stale()  # 15 s since the touch was seen
    clock.advance(5.01)
    assert liveness.stale()
