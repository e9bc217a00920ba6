"""Asking the scheduler why a block ended (worker/scheduler.py) and what that makes of a lost task.

The scheduler commands are replaced by small scripts on PATH; the real Slurm is asked in tests/slurm.
"""

from __future__ import annotations

import json
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.task_run import RecordingClient, finish_with, make_run, runner_status
from worker.outcome import Evidence, Outcome, classify
from worker.scheduler import BlockEnding, BlockEndings, block_ending
from worker.site import parse_site
from worker.tasks import TaskContext


def fake_command(bin_dir: Path, name: str, stdout: str, exit_code: int = 0) -> None:
    """``name`` on PATH prints ``stdout``, exits ``exit_code``, and appends its arguments to ``bin_dir/name.calls``."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    calls = shlex.quote(str(bin_dir / f"{name}.calls"))
    # printf and echo are shell builtins: PATH holds nothing but these fakes.
    script.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nprintf '%s\\n' {shlex.quote(stdout)}\nexit {exit_code}\n")
    script.chmod(0o755)


def calls_of(bin_dir: Path, name: str) -> list[str]:
    path = bin_dir / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def fake_bin(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # nothing else: a missing command must be harmless too
    return bin_dir


@pytest.mark.parametrize(
    "scontrol_line, ending",
    [
        ("JobId=12 JobName=parsl.mpi.block-0 JobState=TIMEOUT Reason=TimeLimit", BlockEnding.WALLTIME),
        ("JobId=12 JobName=parsl.mpi.block-0 JobState=CANCELLED Reason=None", BlockEnding.ENDED),
        ("JobId=12 JobName=parsl.mpi.block-0 JobState=NODE_FAIL Reason=NodeDown", BlockEnding.NODE_FAILURE),
        ("JobId=12 JobName=parsl.mpi.block-0 JobState=PENDING Reason=BeginTime Restarts=1", None),  # requeued
        ("JobId=12 JobName=parsl.mpi.block-0 JobState=RUNNING Reason=None", None),  # not over: nothing to add
    ],
)
def test_slurm_job_state_decides_the_ending(fake_bin, scontrol_line, ending):
    fake_command(fake_bin, "scontrol", scontrol_line)
    assert block_ending("slurm", "12", settle_s=0) == ending


def test_unknown_jobs_and_missing_or_broken_commands_give_none(fake_bin):
    assert block_ending("slurm", "12", settle_s=0) is None  # no scontrol at all
    fake_command(fake_bin, "scontrol", "slurm_load_jobs error: Invalid job id specified", exit_code=1)
    assert block_ending("slurm", "99999999", settle_s=0) is None
    fake_command(fake_bin, "scontrol", "")  # answers, but says nothing
    assert block_ending("slurm", "12", settle_s=0) is None
    assert block_ending("slurm", "12; rm -rf /", settle_s=0) is None  # never passed to a command
    assert block_ending("local", "12") is None and block_ending("slurm", None) is None


@pytest.mark.parametrize(
    "job, ending",
    [
        ({"job_state": "F", "Exit_status": -29, "comment": "Job run at ... exceeded resource walltime"}, "walltime"),
        ({"job_state": "F", "Exit_status": 271, "comment": "Job run at ... and finished"}, "ended"),
        ({"job_state": "R"}, None),
    ],
)
def test_pbs_job_state_decides_the_ending(fake_bin, job, ending):
    fake_command(fake_bin, "qstat", json.dumps({"Jobs": {"12.pbs": job}}))
    result = block_ending("pbspro", "12.pbs", settle_s=0)
    assert (result.value if result else None) == ending


def test_a_block_time_limit_turns_a_lost_worker_into_walltime():
    signalled = runner_status("signalled", 143, signal="SIGTERM", scheduler_job_id="12")
    assert classify(Evidence("realize", signalled)).outcome is Outcome.LOST_WORKER
    assert classify(Evidence("realize", signalled, block_ending="ended")).outcome is Outcome.LOST_WORKER
    verdict = classify(Evidence("realize", signalled, block_ending="walltime"))
    assert verdict.outcome is Outcome.WALLTIME and "batch job 12" in verdict.message
    lost = Evidence("realize", None, app_exception="ManagerLost", block_ending="walltime")
    assert classify(lost).outcome is Outcome.WALLTIME
    # The task's own limit, an orphaned task, an ordinary exit: the block's ending does not matter.
    orphaned = runner_status("orphaned", -15)
    assert classify(Evidence("realize", orphaned, block_ending="walltime")).outcome is Outcome.LOST_WORKER


def test_a_failed_node_turns_a_lost_worker_into_node_failure():
    signalled = runner_status("signalled", 143, signal="SIGTERM", scheduler_job_id="12")
    verdict = classify(Evidence("realize", signalled, block_ending="node_failure"))
    assert verdict.outcome is Outcome.NODE_FAILURE and verdict.outcome.failure_class == "node_failure"
    assert "batch job 12" in verdict.message
    # The runner died with the node (it ran there): Parsl lost the manager, Slurm says why.
    lost = Evidence("realize", None, app_exception="ManagerLost", block_ending="node_failure")
    assert classify(lost).outcome is Outcome.NODE_FAILURE
    orphaned = runner_status("orphaned", -15)
    assert classify(Evidence("realize", orphaned, block_ending="node_failure")).outcome is Outcome.LOST_WORKER


def slurm_run(tmp_path: Path, client: RecordingClient):
    run = make_run(tmp_path, client)
    site = parse_site(
        {"name": "slurm", "provider": {"kind": "slurm", "partition": "debug"}, "mpi": {"launcher": "srun"}}
    )
    run.context = TaskContext(
        site=site, layout=run.context.layout, python="/venv/bin/python", marker_prefix="slurm:w:run", client=client
    )
    run.prepare()
    return run


@pytest.mark.parametrize(
    "scontrol_line, exit_code, failure_class",
    [
        ("JobId=12 JobState=TIMEOUT Reason=TimeLimit", 0, "walltime"),
        ("JobId=12 JobState=CANCELLED Reason=None", 0, "lost_worker"),
        ("JobId=12 JobState=NODE_FAIL Reason=NodeDown", 0, "node_failure"),
        ("slurm_load_jobs error: Invalid job id specified", 1, "lost_worker"),  # a job Slurm does not know
    ],
)
def test_a_task_of_a_signalled_block_is_reported_by_what_slurm_says(
    tmp_path, fake_bin, scontrol_line, exit_code, failure_class
):
    fake_command(fake_bin, "scontrol", scontrol_line, exit_code=exit_code)
    client = RecordingClient()
    run = slurm_run(tmp_path, client)
    finish_with(run, "signalled", 143, signal="SIGTERM", scheduler_job_id="12")
    [failed] = [call for call in client.calls if call[0] == "failed"]
    assert failed[2] == failure_class


def test_the_tasks_of_one_block_share_one_scheduler_query(fake_bin):
    """Eight tasks of block 12 end at once on eight report threads: one scontrol call answers them all."""
    fake_command(fake_bin, "scontrol", "JobId=12 JobState=TIMEOUT Reason=TimeLimit")
    endings = BlockEndings(settle_s=0)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: endings("slurm", "12"), range(8)))
    assert answers == [BlockEnding.WALLTIME] * 8
    assert calls_of(fake_bin, "scontrol") == ["show job -o 12"]
    fake_command(fake_bin, "scontrol", "JobId=13 JobState=CANCELLED Reason=None")
    assert endings("slurm", "13") is BlockEnding.ENDED  # another block is asked on its own
    assert endings("slurm", "12") is BlockEnding.WALLTIME  # a final answer stays
    assert calls_of(fake_bin, "scontrol") == ["show job -o 12", "show job -o 13"]
    assert endings.queries == 2


def test_an_open_answer_is_reused_only_briefly(fake_bin):
    """Still RUNNING after settling: the block's next task is not held up again, but once the answer is
    old the job is asked afresh and its final state is found."""
    fake_command(fake_bin, "scontrol", "JobId=12 JobState=RUNNING Reason=None")
    endings = BlockEndings(settle_s=0)
    assert endings("slurm", "12") is None and endings("slurm", "12") is None
    assert len(calls_of(fake_bin, "scontrol")) == 1
    endings = BlockEndings(settle_s=0, open_answer_ttl_s=0.0)
    assert endings("slurm", "12") is None
    fake_command(fake_bin, "scontrol", "JobId=12 JobState=TIMEOUT Reason=TimeLimit")
    assert endings("slurm", "12") is BlockEnding.WALLTIME and endings("slurm", "12") is BlockEnding.WALLTIME
    assert len(calls_of(fake_bin, "scontrol")) == 3 and endings.queries == 2


def test_two_lost_tasks_of_one_block_ask_slurm_once(tmp_path, fake_bin):
    fake_command(fake_bin, "scontrol", "JobId=12 JobState=TIMEOUT Reason=TimeLimit")
    client = RecordingClient()
    first = slurm_run(tmp_path / "a", client)
    second = slurm_run(tmp_path / "b", client)
    second.context = first.context  # one worker: one context for all its tasks
    for run in (first, second):
        finish_with(run, "signalled", 143, signal="SIGTERM", scheduler_job_id="12")
    assert [call[2] for call in client.calls if call[0] == "failed"] == ["walltime", "walltime"]
    assert calls_of(fake_bin, "scontrol") == ["show job -o 12"]
