"""Work folders of stopped workers (worker.leftovers): removed at the next worker start, only when provably dead."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas.api import WorkerInfo
from schemas.programs import LIVENESS_FILE, RUNNER_FILE, STATUS_FILE, RunnerStarted
from tests.support.task_run import runner_status
from tests.support.worker_helpers import wait_for
from worker.agent import Agent
from worker.layout import SiteLayout
from worker.leftovers import LeftoverSweep, start_sweep
from worker.settings import WorkerSettings
from worker.site import parse_site

HOST = socket.gethostname()


def leftover(work: Path, task_id: str, *, runner_pid: int | None = None, host: str = HOST) -> Path:
    """A task's work folder as its worker left it: spec, liveness file and, if ``runner_pid``, runner.json."""
    folder = work / task_id
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text("{}")
    (folder / LIVENESS_FILE).touch()
    if runner_pid is not None:
        started = RunnerStarted(
            host=host, runner_pid=runner_pid, marker=f"local:w:run:{task_id}", pid=runner_pid, pgid=runner_pid,
            launched_at=1.0, walltime_s=300.0,
        )  # fmt: skip
        (folder / RUNNER_FILE).write_text(started.model_dump_json())
    return folder


@pytest.fixture
def runner_like(tmp_path: Path):
    """Start a process whose command line names a folder, as a runner's names its work folder."""
    processes: list[subprocess.Popen] = []

    def start(folder: Path) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", str(folder)],
                                   stdin=subprocess.PIPE)  # fmt: skip
        processes.append(process)
        return process

    yield start
    for process in processes:
        process.kill()
        process.wait()


def killed_runner_pid(runner_like, folder: Path) -> int:
    process = runner_like(folder)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return process.pid


class RegisteringClient:
    def register(self, registration, retry_s=None):
        return WorkerInfo(id=1, name=registration.name, site=registration.site, host=registration.host,
                          capacity=registration.capacity, registered_at=datetime.now(UTC), last_heartbeat_at=None)  # fmt: skip

    def close(self):
        pass


def test_a_killed_workers_folder_is_gone_after_the_next_worker_start(tmp_path, runner_like, monkeypatch):
    site = parse_site({"name": "local", "provider": {"kind": "local"}, "runner": {"liveness_timeout_s": 1}})
    agent = Agent(WorkerSettings(data_dir=tmp_path), site, "token")
    work = agent.layout.work
    never_launched = leftover(work, "realize-7")
    ended = leftover(work, "realize-8", runner_pid=4321, host="node7")
    (ended / STATUS_FILE).write_text(runner_status("orphaned", None).model_dump_json())
    killed = leftover(work, "realize-9", runner_pid=killed_runner_pid(runner_like, work / "realize-9"))
    agent.client = RegisteringClient()
    monkeypatch.setattr(agent, "_start_parsl", lambda: None)
    # The loop runs until the sweep has removed what it may: a worker start, without Parsl or claims.
    monkeypatch.setattr(agent, "_loop", lambda: wait_for(lambda: not killed.exists(), 30, "the leftovers removed"))
    assert agent.run() == 0
    assert not never_launched.exists() and not ended.exists() and not killed.exists()
    assert work.is_dir()


def test_a_folder_whose_liveness_file_is_touched_meanwhile_is_kept(tmp_path):
    work = SiteLayout(tmp_path).work
    folder = leftover(work, "realize-3")
    (folder / STATUS_FILE).write_text(runner_status("exited", 0).model_dump_json())
    sweep = LeftoverSweep.begin(work, HOST)
    stamp = (folder / LIVENESS_FILE).stat().st_mtime_ns
    os.utime(folder / LIVENESS_FILE, ns=(stamp + 1_000_000_000, stamp + 1_000_000_000))  # a live worker's touch
    assert sweep.finish() == [] and folder.exists()


def test_a_runner_still_running_on_this_host_is_left_alone(tmp_path, runner_like):
    work = SiteLayout(tmp_path).work
    running = leftover(work, "realize-4", runner_pid=runner_like(work / "realize-4").pid)
    reused = leftover(work, "realize-5", runner_pid=os.getpid())  # the pid now belongs to another program
    assert LeftoverSweep.begin(work, HOST).finish() == [reused]
    assert running.exists() and not reused.exists()


def test_a_runner_on_another_host_is_left_until_it_has_ended(tmp_path):
    work = SiteLayout(tmp_path).work
    folder = leftover(work, "preprocess-2-1", runner_pid=4321, host="node7")
    assert LeftoverSweep.begin(work, HOST).finish() == [] and folder.exists()
    (folder / STATUS_FILE).write_text(runner_status("orphaned", None).model_dump_json())  # its dead-man switch
    assert LeftoverSweep.begin(work, HOST).finish() == [folder] and not folder.exists()


def test_folders_of_the_tasks_the_worker_runs_are_kept(tmp_path):
    work = SiteLayout(tmp_path).work
    folder = leftover(work, "realize-6")
    assert LeftoverSweep.begin(work, HOST).finish(owned={"realize-6"}) == [] and folder.exists()


def test_a_worker_keeping_work_folders_for_inspection_keeps_those_of_earlier_runs(tmp_path, monkeypatch):
    site = parse_site({"name": "local", "provider": {"kind": "local"}, "runner": {"liveness_timeout_s": 1}})
    agent = Agent(WorkerSettings(data_dir=tmp_path, MAPCAMPAIGN_WORKER_KEEP_WORK=True), site, "token")
    sweeps = []
    monkeypatch.setattr("worker.agent.heartbeat.start_sweep", lambda *args, **kwargs: sweeps.append(args))
    agent.client = RegisteringClient()
    monkeypatch.setattr(agent, "_start_parsl", lambda: None)
    monkeypatch.setattr(agent, "_loop", lambda: None)
    assert agent.run() == 0
    assert sweeps == []


def test_a_folder_left_by_a_worker_killed_beside_a_running_one_goes_without_a_restart(tmp_path, runner_like):
    """The running worker sweeps again and again: the folders of a worker killed after it started (whose tasks
    the service requeues) are removed once provably dead; the folders of its own tasks stay."""
    work = SiteLayout(tmp_path).work
    work.mkdir(parents=True)
    stop = threading.Event()
    own = leftover(work, "realize-1")
    thread = start_sweep(work, HOST, touch_interval_s=0.05, stop=stop, owned={"realize-1"})
    try:
        killed = leftover(work, "realize-2")
        killed_runner = leftover(work, "realize-3")
        (killed_runner / RUNNER_FILE).write_text(
            RunnerStarted(
                host=HOST, runner_pid=killed_runner_pid(runner_like, killed_runner), marker="local:w:run:realize-3",
                pid=1, pgid=1, launched_at=1.0, walltime_s=300.0,
            ).model_dump_json()
        )  # fmt: skip
        wait_for(lambda: not killed.exists() and not killed_runner.exists(), 30, "the running worker's sweep")
        assert own.exists()
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
