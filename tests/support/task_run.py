"""A task run with a recording client in place of the service: the helpers of the worker task tests."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from schemas.api import PlanRef, RealizeTask
from schemas.files import sha256_file
from schemas.programs import RUNNER_FILE, STATUS_FILE, STDERR_FILE, Ending, RunnerStarted, RunnerStatus
from schemas.spec import CampaignSpec
from tests.support.worker_helpers import tiny_spec
from worker.client import ServiceError, TaskGone
from worker.layout import SiteLayout
from worker.site import parse_site
from worker.tasks import TaskContext, TaskRun


class RecordingClient:
    """Records the worker's calls; those named in ``gone`` answer 409, those in ``unreachable`` never answer."""

    def __init__(self, gone: set[str] = frozenset(), unreachable: set[str] = frozenset()):
        self.calls: list[tuple] = []
        self.gone = gone
        self.unreachable = unreachable

    def _call(self, *call):
        self.calls.append(call)
        if call[0] in self.gone:
            raise TaskGone(f"{call[0]}: 409", status=409)
        if call[0] in self.unreachable:
            raise ServiceError(f"{call[0]}: the service did not answer (ConnectError)")

    def started(self, task_id, report):
        self._call("started", task_id, report.host)

    def upload(self, task_id, name, path, sha256):
        assert sha256_file(path) == sha256
        self._call("upload", task_id, name)

    def succeeded(self, task_id, result):
        self._call("succeeded", task_id, result.realization)

    def failed(self, task_id, report):
        self._call("failed", task_id, report.failure_class, report.exit_code, report.message, report.log_tail)

    def plan_invalid(self, plan_id, report):
        self._call("plan_invalid", plan_id, report.task_id, report.checksum)


def make_run(
    tmp_path: Path, client: RecordingClient, *, attempt: int = 2, plan_exists: bool = True, **changes
) -> TaskRun:
    site = parse_site({"name": "local", "max_tasks": 1, "provider": {"kind": "local"}})
    layout = SiteLayout(tmp_path / "site")
    layout.create()
    plan = layout.plans / "p.plan"
    if plan_exists:
        plan.write_bytes(b"plan")
    spec = CampaignSpec.model_validate(tiny_spec(**changes))
    task = RealizeTask(
        task_id="realize-5",
        attempt_id=5,
        campaign_id=1,
        realization=0,
        attempt=attempt,
        spec=spec,
        plan=PlanRef(id=3, path=str(plan), checksum="sha:plan"),
        lease_expires_at=datetime.now(UTC),
    )
    context = TaskContext(
        site=site, layout=layout, python="/venv/bin/python", marker_prefix="local:w:run", client=client
    )
    return TaskRun(task, context)


def runner_status(ending: Ending | str, exit_code: int | None = None, **fields: Any) -> RunnerStatus:
    """A ``status.json`` as the runner writes it (on host node7, launched at 1.0, ended at 2.0, 300 s limit)."""
    status = {
        "host": "node7",
        "runner_pid": 4321,
        "marker": "local:w:run:realize-5",
        "ending": ending,
        "exit_code": exit_code,
        "launched_at": 1.0,
        "ended_at": 2.0,
        "elapsed_s": 1.0,
        "walltime_s": 300.0,
    }
    return RunnerStatus.model_validate({**status, **fields})


def runner_started(**fields: Any) -> RunnerStarted:
    """A ``runner.json`` as the runner writes it at launch (host node7, launched at 1.0)."""
    started = {"host": "node7", "runner_pid": 4321, "marker": "local:w:run:realize-5", "pid": 4322, "pgid": 4322,
               "launched_at": 1.0, "walltime_s": 300.0}  # fmt: skip
    return RunnerStarted.model_validate({**started, **fields})


def finish_with(run: TaskRun, ending: str, exit_code: int | None, stderr: str = "", **extra: Any) -> dict:
    """Leave in the run's work folder what a runner leaves when the task ended so, then finish the run."""
    workdir = run.placement.workdir
    (workdir / RUNNER_FILE).write_text(runner_started().model_dump_json())
    (workdir / STDERR_FILE).write_text(stderr)
    (workdir / STATUS_FILE).write_text(runner_status(ending, exit_code, **extra).model_dump_json())
    assert run.ended()
    return run.finish()
