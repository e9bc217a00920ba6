"""The worker's loop (worker.agent) with a recording client in place of the service and no Parsl."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from schemas.api import ClaimAnswer, HeartbeatAnswer
from schemas.programs import STATUS_FILE, CancelReason
from tests.support.clock import FakeClock
from tests.support.task_run import RecordingClient, make_run, runner_status
from tests.support.worker_helpers import wait_for
from worker.agent import FIRST_LAUNCH_PAUSE_S, LAUNCH_FAILURES_BEFORE_PAUSE, Agent
from worker.agent.claims import PASS_WAIT_S
from worker.settings import WorkerSettings
from worker.tasks import TaskRun

PASSES_DURING_THE_PAUSE = 4  # loop passes while claims are paused; each would claim but for the pause


def step(clock: FakeClock, thread_name: str, seconds: float) -> None:
    """Move the clock while the named thread waits on it; return once that thread came round to waiting again."""
    waits = clock.waits_in(thread_name)
    clock.advance(seconds)
    wait_for(lambda: clock.waits_in(thread_name) > waits, 30, f"the {thread_name} thread to come round")


@contextlib.contextmanager
def loop_running(agent: Agent, clock: FakeClock, *, before_stop: Callable[[], object] = lambda: None) -> Iterator[None]:
    """The agent's loop in a thread named ``loop``; at the end ``before_stop()``, then a drain that must end it."""
    loop = threading.Thread(target=agent._loop, name="loop", daemon=True)
    loop.start()
    try:
        yield
    finally:
        before_stop()
        agent.drain_deadline = clock.monotonic()
        agent.wake.set()
        loop.join(30)
    assert not loop.is_alive()


class EndlessQueue(RecordingClient):
    """A service with an endless queue: every claim hands out as many tasks as asked for."""

    def __init__(self, prototype):
        super().__init__()
        self.prototype = prototype
        self.ids = itertools.count(100)

    def claim(self, worker_id, max_tasks):
        self.calls.append(("claim", max_tasks))
        expires = datetime.now(UTC) + timedelta(seconds=300)
        tasks = [
            self.prototype.model_copy(update={"task_id": f"realize-{n}", "attempt_id": n, "lease_expires_at": expires})
            for n in itertools.islice(self.ids, max_tasks)
        ]
        return ClaimAnswer(tasks=tasks, lease_s=300.0)

    def heartbeat(self, worker_id, running):
        return HeartbeatAnswer(lease_expires_at=datetime.now(UTC), extended=[], cancel=[], lost=[])


def test_a_site_that_cannot_launch_anything_stops_claiming_instead_of_failing_the_queue(tmp_path, monkeypatch, caplog):
    """Found by review: with its work folder unwritable (disk full) a worker claimed and failed 4,700
    tasks in 3 s, every realisation of every campaign charged ``launch_error`` until ``max_attempts``."""
    prototype_run = make_run(tmp_path / "proto", RecordingClient())
    client = EndlessQueue(prototype_run.task)
    clock = FakeClock()
    agent = Agent(
        WorkerSettings(data_dir=tmp_path / "worker", poll_s=0.05), prototype_run.context.site, "token", clock=clock
    )
    agent.client = client
    agent.context = dataclasses.replace(prototype_run.context, client=client, clock=clock)
    agent.worker_id = 1

    def disk_full(run):
        raise OSError(errno.ENOSPC, "No space left on device")

    def calls(kind):
        return [call for call in client.calls if call[0] == kind]

    monkeypatch.setattr(TaskRun, "prepare", disk_full)
    with caplog.at_level(logging.ERROR, logger="mapcampaign.worker"), loop_running(agent, clock):
        wait_for(lambda: len(calls("failed")) >= LAUNCH_FAILURES_BEFORE_PAUSE, 30, "three tasks reported failed")
        wait_for(lambda: not agent.runs, 30, "the failed tasks to leave the worker")  # a free slot from here on
        assert agent.claims_paused_until == clock.monotonic() + FIRST_LAUNCH_PAUSE_S
        wait_for(lambda: clock.waits_in("loop") > 0, 30, "the loop to wait")
        claims_before_the_pause = len(calls("claim"))
        # With a slot free and the queue endless, every pass would claim (a full claim is followed at once by
        # the next), so passes without a claim are the pause's doing.
        for _ in range(PASSES_DURING_THE_PAUSE):  # up to 1 s before the pause ends
            step(clock, "loop", (FIRST_LAUNCH_PAUSE_S - 1.0) / PASSES_DURING_THE_PAUSE)
        assert len(calls("claim")) == claims_before_the_pause
        clock.advance(1.0)  # the pause is over: the next task is claimed, fails, and the pause doubles
        wait_for(lambda: len(calls("failed")) > LAUNCH_FAILURES_BEFORE_PAUSE, 30, "a claim after the pause")
        wait_for(lambda: not agent.runs, 30, "the failed task to leave the worker")
        assert agent.claims_paused_until == clock.monotonic() + 2 * FIRST_LAUNCH_PAUSE_S
    failed = calls("failed")
    assert len(failed) == LAUNCH_FAILURES_BEFORE_PAUSE + 1  # max_tasks 1: one task per claim
    assert {call[2] for call in failed} == {"site_error"} and "No space left on device" in failed[0][4]
    assert f"claiming nothing for {FIRST_LAUNCH_PAUSE_S:.0f} s" in caplog.text
    assert f"claiming nothing for {2 * FIRST_LAUNCH_PAUSE_S:.0f} s" in caplog.text


def test_the_pause_doubles_while_launches_go_on_failing_up_to_ten_minutes(tmp_path):
    prototype_run = make_run(tmp_path / "proto", RecordingClient())
    clock = FakeClock()
    agent = Agent(WorkerSettings(data_dir=tmp_path / "worker"), prototype_run.context.site, "token", clock=clock)
    pauses = []
    for _ in range(LAUNCH_FAILURES_BEFORE_PAUSE + 8):
        agent._note_launch_failure("disk full")
        pauses.append(agent.claims_paused_until - clock.monotonic())
    assert all(pause < 0 for pause in pauses[: LAUNCH_FAILURES_BEFORE_PAUSE - 1])  # not paused yet
    assert pauses[LAUNCH_FAILURES_BEFORE_PAUSE - 1 :][:6] == [30, 60, 120, 240, 480, 600]
    assert max(pauses) == 600


def test_heartbeats_follow_the_services_lease_length_whatever_this_machines_clock_says(tmp_path):
    """Found by review: the lease length was the service's expiry time less the worker's clock, so a
    worker clock 120 s behind with a 45 s lease beat every 55 s, and its tasks were reaped while running."""
    prototype_run = make_run(tmp_path / "proto", RecordingClient())
    clock = FakeClock()
    agent = Agent(WorkerSettings(data_dir=tmp_path / "worker"), prototype_run.context.site, "token", clock=clock)
    service_now = datetime.fromtimestamp(clock.time(), UTC) + timedelta(seconds=120)  # the worker is 120 s behind
    agent._note_lease(service_now + timedelta(seconds=45), 45.0)
    assert agent._heartbeat_interval() == 15.0
    agent._note_lease(service_now + timedelta(seconds=45), None)  # an older service: the clocks decide
    assert agent._heartbeat_interval() == 55.0


class SlowSecondClaim(RecordingClient):
    """The first claim hands out one task; the second hangs until released, as a service busy for a minute.
    Heartbeats are recorded with the time; the answer cancels what ``cancel`` names."""

    def __init__(self, prototype):
        super().__init__()
        self.prototype = prototype
        self.claims = 0
        self.claim_waiting = threading.Event()
        self.release_claim = threading.Event()
        self.cancel: list[str] = []

    def claim(self, worker_id, max_tasks):
        self.claims += 1
        if self.claims == 1:
            expires = datetime.now(UTC) + timedelta(seconds=300)
            task = self.prototype.model_copy(update={"task_id": "realize-1", "lease_expires_at": expires})
            return ClaimAnswer(tasks=[task])
        self.claim_waiting.set()
        self.release_claim.wait(30)
        return ClaimAnswer(tasks=[])

    def heartbeat(self, worker_id, running):
        during_claim = self.claim_waiting.is_set() and not self.release_claim.is_set()
        self.calls.append(("heartbeat", tuple(running), during_claim))
        return HeartbeatAnswer(
            lease_expires_at=datetime.now(UTC) + timedelta(seconds=300),
            extended=list(running),
            cancel=[task for task in self.cancel if task in running],
            lost=[],
        )


def test_heartbeats_go_on_while_a_claim_waits_for_its_answer(tmp_path, monkeypatch):
    """Found by review: heartbeats shared the loop with claims, so a claim waiting 90 s for a busy service
    delayed every heartbeat by as much, and with a short lease the running tasks were reaped."""
    prototype_run = make_run(tmp_path / "proto", RecordingClient())
    client = SlowSecondClaim(prototype_run.task)
    site = prototype_run.context.site.model_copy(update={"max_tasks": 2})  # a free slot: the loop claims again
    clock = FakeClock()
    settings = WorkerSettings(data_dir=tmp_path / "worker", poll_s=0.05, heartbeat_s=0.5)
    agent = Agent(settings, site, "token", clock=clock)
    agent.client = client
    agent.context = dataclasses.replace(prototype_run.context, client=client, site=site, clock=clock)
    agent.worker_id = 1

    def queued_in_parsl(run, app):  # held and never started: what a task waiting for its block looks like
        run.future = concurrent.futures.Future()
        return run.future

    monkeypatch.setattr(TaskRun, "submit", queued_in_parsl)
    with loop_running(agent, clock, before_stop=client.release_claim.set):
        wait_for(lambda: clock.waits_in("loop") > 0, 30, "the loop to wait after its first claim")
        clock.advance(PASS_WAIT_S)  # a free slot: the next pass claims again (poll_s is shorter than a pass's wait)
        assert client.claim_waiting.wait(30)
        wait_for(lambda: clock.waits_in("heartbeat") > 0, 30, "the heartbeat thread to wait")
        for _ in range(3):
            step(clock, "heartbeat", settings.heartbeat_s)
        heartbeats = [c for c in client.calls if c[0] == "heartbeat"]
        assert [c[2] for c in heartbeats] == [True, True, True]  # one per interval, all while the claim waits
        assert all(c[1] == ("realize-1",) for c in heartbeats)
        # A heartbeat's answer still reaches the loop, which owns the runs: the cancel stops the task.
        run = agent.runs["realize-1"]
        client.cancel = ["realize-1"]
        step(clock, "heartbeat", settings.heartbeat_s)
        client.release_claim.set()
        wait_for(lambda: run.stop_reason is not None, 30, "the cancel to stop the task")
        assert run.stop_reason is CancelReason.CANCELLED


def test_a_lost_answer_for_a_task_being_reported_leaves_it_alone(tmp_path, caplog):
    """Found by CI: the heartbeat racing a success report is answered "lost"; the loop logged that it was
    ending the task and wrote a cancel file into the folder the report thread was removing."""
    prototype_run = make_run(tmp_path / "proto", RecordingClient())
    agent = Agent(WorkerSettings(data_dir=tmp_path / "worker"), prototype_run.context.site, "token")
    ended, running = make_run(tmp_path / "ended", RecordingClient()), make_run(tmp_path / "running", RecordingClient())
    for run, task_id in ((ended, "realize-1"), (running, "realize-2")):
        run.task = run.task.model_copy(update={"task_id": task_id})
        run.prepare()
        run.finishing = concurrent.futures.Future()  # handed to the report threads
        agent.runs[task_id] = run
    (ended.placement.workdir / STATUS_FILE).write_text(runner_status("exited", 0).model_dump_json())
    agent.heartbeat_answers.put(
        HeartbeatAnswer(lease_expires_at=datetime.now(UTC), extended=[], cancel=[], lost=["realize-1", "realize-2"])
    )
    with caplog.at_level(logging.WARNING, logger="mapcampaign.worker"):
        agent._apply_heartbeat_answers()
    assert ended.stop_reason is None and not (ended.placement.workdir / "cancel").exists()
    assert "realize-1" not in caplog.text
    # A task stopped before its runner wrote a status (detached) may still have processes: they are ended.
    assert running.stop_reason is CancelReason.LOST and (running.placement.workdir / "cancel").is_file()


class HeldReports(EndlessQueue):
    """An endless queue whose ending reports wait for :attr:`release`, as behind a slow upload and the hooks."""

    def __init__(self, prototype, *, empty_until_a_report: bool = False):
        super().__init__(prototype)
        self.release = threading.Event()
        self.empty_until_a_report = empty_until_a_report
        self.landed = 0  # reports answered

    def claims(self) -> int:
        return sum(1 for call in self.calls if call[0] == "claim")

    def reports(self) -> list[str]:
        return [call[1] for call in self.calls if call[0] in ("succeeded", "failed")]

    def claim(self, worker_id, max_tasks):
        if self.empty_until_a_report and self.claims() > 0 and not self.landed:
            self.calls.append(("claim", max_tasks))  # what a realisation waiting for its plan's report sees
            return ClaimAnswer(tasks=[], lease_s=300.0)
        return super().claim(worker_id, max_tasks)

    def _call(self, *call):
        super()._call(*call)
        if call[0] in ("succeeded", "failed"):
            assert self.release.wait(120), "the test never released the reports"
            self.landed += 1


def agent_with_runs_the_test_ends(tmp_path, monkeypatch, client_class, **client_options):
    """A one-slot agent on ``client_class``; each task submitted is the test's to end (``runs``, in claim
    order), and the long poll interval means any claim the test sees was not the poll's doing."""
    prototype_run = make_run(tmp_path / "proto", RecordingClient())
    client = client_class(prototype_run.task, **client_options)
    clock = FakeClock()
    agent = Agent(
        WorkerSettings(data_dir=tmp_path / "worker", poll_s=3600), prototype_run.context.site, "token", clock=clock
    )
    agent.client = client
    agent.context = dataclasses.replace(prototype_run.context, client=client, clock=clock)
    agent.worker_id = 1
    runs: list[TaskRun] = []

    def submitted(run, app):
        run.future = concurrent.futures.Future()
        runs.append(run)
        return run.future

    monkeypatch.setattr(TaskRun, "submit", submitted)
    return agent, client, clock, runs


def end(run: TaskRun) -> None:
    """The runner exits 1 (a realisation that failed: reported at once) and Parsl's future completes."""
    (run.placement.workdir / STATUS_FILE).write_text(runner_status("exited", 1).model_dump_json())
    run.future.set_result(None)


def test_the_next_task_starts_while_the_last_ones_report_is_in_flight(tmp_path, monkeypatch):
    """A task's upload and report (the service's hooks run before it answers: seconds at nside 1024) went
    before the next claim, leaving the slot idle for a sixth of each realisation's cycle at nside 512."""
    agent, client, clock, runs = agent_with_runs_the_test_ends(tmp_path, monkeypatch, HeldReports)
    with loop_running(agent, clock, before_stop=client.release.set):
        wait_for(lambda: len(runs) == 1, 30, "the first task to be submitted")
        end(runs[0])  # its runner ended; its report now waits on the service
        wait_for(lambda: len(client.reports()) == 1, 30, "the first task's report to be sent")
        wait_for(lambda: len(runs) == 2, 30, "the next task to be claimed and submitted while it waits")
        assert client.reports() == ["realize-100"] and client.landed == 0 and client.claims() == 2
        # One slot: at most one report in flight beside the running task, so the second one ending while the
        # first report still waits is not followed by a claim.
        end(runs[1])
        wait_for(lambda: len(client.reports()) == 2, 30, "the second task's report to be sent")
        for _ in range(3):
            step(clock, "loop", PASS_WAIT_S)
        assert client.claims() == 2 and len(runs) == 2
        client.release.set()  # both reports land: the slot and the report it held are free again
        wait_for(lambda: len(runs) == 3, 30, "a claim once the reports landed")
        assert client.claims() == 3



def test_a_landed_report_is_followed_by_a_claim_at_once_not_after_the_poll_interval(tmp_path, monkeypatch):
    """A plan's report makes the realisations waiting for it claimable: the claim sent when its runner ended
    came back empty, and the next one must follow the report, not the poll interval (an hour here)."""
    agent, client, clock, runs = agent_with_runs_the_test_ends(
        tmp_path, monkeypatch, HeldReports, empty_until_a_report=True
    )
    with loop_running(agent, clock, before_stop=client.release.set):
        wait_for(lambda: len(runs) == 1, 30, "the first task to be submitted")
        end(runs[0])
        wait_for(lambda: len(client.reports()) == 1, 30, "its report to be sent")
        wait_for(lambda: client.claims() == 2, 30, "the claim sent while the report is in flight")
        assert len(runs) == 1 and client.landed == 0  # that claim found nothing
        client.release.set()
        wait_for(lambda: len(runs) == 2, 30, "a claim as soon as the report landed")
        assert client.claims() == 3
