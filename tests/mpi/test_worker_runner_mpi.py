"""The task runner under real mpiexec: every way a task ends, and no process of a killed task survives.

MPICH's hydra_pmi_proxy and the ranks it starts each call setsid, so neither the
process group nor the parent chain reaches them; the marker in their environment does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schemas.programs import CancelReason
from tests.support.processes import task_processes, wait_for_no_task_processes
from worker.runner import write_cancel

pytestmark = pytest.mark.mpi

MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
SLEEPER = "import time; from mpi4py import MPI; print('rank', MPI.COMM_WORLD.rank, flush=True); time.sleep(120)"
STUBBORN = (
    "import signal, time; from mpi4py import MPI; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('rank', MPI.COMM_WORLD.rank, flush=True); time.sleep(120)"
)


def start_runner(workdir: Path, marker: str, command: list[str], **options: float) -> subprocess.Popen:
    args = [sys.executable, "-m", "worker.runner", "--workdir", str(workdir), "--marker", marker]
    args += ["--walltime-s", str(options.get("walltime_s", 60)), "--grace-s", str(options.get("grace_s", 2))]
    if "liveness_timeout_s" in options:
        args += ["--liveness-timeout-s", str(options["liveness_timeout_s"])]
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "liveness").touch()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.Popen(
        args + ["--", *command],
        env=env,
        stdout=open(workdir / "stdout.txt", "wb"),
        stderr=open(workdir / "stderr.txt", "wb"),
    )


def mpi(code: str, ranks: int = 2) -> list[str]:
    return [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-c", code]


def wait_ranks_up(workdir: Path, runner: subprocess.Popen, marker: str, ranks: int = 2, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (workdir / "stdout.txt").read_text().count("rank") < ranks:
        assert runner.poll() is None, (workdir / "stderr.txt").read_text()
        assert time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.1)
    assert len(task_processes(marker)) >= ranks + 2  # mpiexec, proxy, ranks


def finished(workdir: Path, runner: subprocess.Popen, timeout: float = 60) -> tuple[int, dict]:
    code = runner.wait(timeout=timeout)
    return code, json.loads((workdir / "status.json").read_text())


def test_walltime_kills_every_rank(tmp_path):
    marker = f"test-walltime-{os.getpid()}"
    runner = start_runner(tmp_path, marker, mpi(SLEEPER), walltime_s=3, grace_s=2)
    wait_ranks_up(tmp_path, runner, marker)
    code, status = finished(tmp_path, runner)
    assert status["ending"] == "walltime" and code != 0
    assert status["elapsed_s"] >= 3 and status["marker"] == marker
    info = json.loads((tmp_path / "runner.json").read_text())
    assert info["pid"] == info["pgid"] and info["host"]
    assert wait_for_no_task_processes(marker, timeout=2) == []
    assert "walltime" in (tmp_path / "stderr.txt").read_text()


def test_ranks_that_ignore_sigterm_get_sigkill_after_the_grace(tmp_path):
    marker = f"test-stubborn-{os.getpid()}"
    runner = start_runner(tmp_path, marker, mpi(STUBBORN), walltime_s=60, grace_s=1)
    wait_ranks_up(tmp_path, runner, marker)
    write_cancel(tmp_path, CancelReason.CANCELLED)
    _, status = finished(tmp_path, runner)
    assert status["ending"] == "cancelled" and status["cancel_reason"] == "cancelled"
    assert wait_for_no_task_processes(marker, timeout=2) == []


def test_dead_man_switch_ends_an_orphaned_task(tmp_path):
    marker = f"test-orphan-{os.getpid()}"
    runner = start_runner(tmp_path, marker, mpi(SLEEPER), walltime_s=60, grace_s=1, liveness_timeout_s=4)
    wait_ranks_up(tmp_path, runner, marker)
    # Nobody touches the liveness file: within the timeout the task ends itself.
    _, status = finished(tmp_path, runner, timeout=30)
    assert status["ending"] == "orphaned"
    assert wait_for_no_task_processes(marker, timeout=2) == []


def test_touched_liveness_keeps_it_running_and_sigterm_to_the_runner_ends_the_task(tmp_path):
    marker = f"test-signal-{os.getpid()}"
    runner = start_runner(tmp_path, marker, mpi(SLEEPER), walltime_s=60, grace_s=1, liveness_timeout_s=2)
    wait_ranks_up(tmp_path, runner, marker)
    for _ in range(15):  # 3 s: longer than the liveness timeout, but the file keeps changing
        os.utime(tmp_path / "liveness")
        time.sleep(0.2)
    assert runner.poll() is None
    runner.send_signal(signal.SIGTERM)
    _, status = finished(tmp_path, runner)
    assert status["ending"] == "signalled" and status["signal"] == "SIGTERM"
    assert wait_for_no_task_processes(marker, timeout=2) == []


def test_a_scheduler_signalling_every_process_at_once_is_still_signalled(tmp_path):
    """Slurm's scancel or time limit sends SIGTERM to the runner and the ranks together: the ranks' exit
    is a consequence of the block ending, so the task must not look like an application error."""
    marker = f"test-block-end-{os.getpid()}"
    runner = start_runner(tmp_path, marker, mpi(SLEEPER), walltime_s=60, grace_s=1)
    wait_ranks_up(tmp_path, runner, marker)
    task = [pid for pid, _, _ in task_processes(marker)]
    for pid in task:  # the ranks first: their launcher exits before the runner looks at its own signal
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    runner.send_signal(signal.SIGTERM)
    _, status = finished(tmp_path, runner)
    assert status["ending"] == "signalled" and status["signal"] == "SIGTERM"
    assert wait_for_no_task_processes(marker, timeout=2) == []


def test_exit_status_passes_through_and_stragglers_are_swept(tmp_path):
    marker = f"test-exit-{os.getpid()}"
    runner = start_runner(tmp_path / "a", marker, mpi("import sys; from mpi4py import MPI; sys.exit(3)"))
    code, status = finished(tmp_path / "a", runner)
    assert (code, status["ending"], status["exit_code"]) == (3, "exited", 3)

    # A command that leaves a process of its own session behind and exits 0.
    straggler = f"{marker}-straggler"
    runner = start_runner(
        tmp_path / "b", straggler, ["bash", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & exit 0"]
    )
    code, status = finished(tmp_path / "b", runner)
    assert (code, status["ending"], status["exit_code"], status["stragglers"]) == (0, "exited", 0, 1)
    assert wait_for_no_task_processes(straggler, timeout=2) == []


def test_cancelled_before_launch_and_launch_errors(tmp_path):
    (tmp_path / "a").mkdir()
    write_cancel(tmp_path / "a", CancelReason.DRAIN)
    runner = start_runner(tmp_path / "a", "test-never", ["sleep", "100"])
    _, status = finished(tmp_path / "a", runner)
    assert status["ending"] == "cancelled" and status["cancel_reason"] == "drain" and status["launched"] is False
    assert not (tmp_path / "a" / "runner.json").exists()

    runner = start_runner(tmp_path / "b", "test-missing", ["/nonexistent/program"])
    code, status = finished(tmp_path / "b", runner)
    assert (code, status["ending"]) == (127, "launch_error")
