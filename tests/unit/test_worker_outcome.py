"""How a task ended -> outcome -> the service's failure class."""

from __future__ import annotations

import pytest

from schemas.programs import CancelReason, RunnerStatus, log_tail
from tests.support.task_run import runner_status
from worker.outcome import Evidence, Outcome, classify


def status(ending: str, exit_code: int | None = None, **extra) -> RunnerStatus:
    return runner_status(ending, exit_code, **{"walltime_s": 60.0, **extra})


@pytest.mark.parametrize(
    "evidence, outcome, failure_class, exit_code",
    [
        (Evidence("realize", status("exited", 0)), Outcome.SUCCEEDED, None, 0),
        (Evidence("preprocess", status("exited", 0)), Outcome.SUCCEEDED, None, 0),
        (Evidence("realize", status("exited", 1), stderr_tail="Traceback\nValueError: boom"), Outcome.APP_ERROR, "app_error", 1),
        (Evidence("realize", status("exited", 2), stderr_tail="mapmaker realize: sky: no such map"), Outcome.APP_ERROR, "app_error", 2),
        (Evidence("realize", status("exited", 3), stderr_tail="mapmaker realize: plan refused: x"), Outcome.PLAN_REFUSED, "app_error", 3),
        (Evidence("preprocess", status("exited", 3)), Outcome.APP_ERROR, "app_error", 3),
        (
            Evidence("realize", status("exited", 4), stderr_tail="mapmaker realize: --coupling 'c.npz': built for the mask x"),
            Outcome.COUPLING_REFUSED, "site_error", 4,
        ),
        (Evidence("preprocess", status("exited", 4)), Outcome.APP_ERROR, "app_error", 4),
        (Evidence("realize", status("exited", 137)), Outcome.OOM, "oom", 137),
        (Evidence("realize", status("exited", -9)), Outcome.OOM, "oom", -9),
        (
            Evidence("realize", status("exited", 9), stderr_tail="=   KILLED BY SIGNAL: 9 (Killed)\n===="),
            Outcome.OOM, "oom", 9,
        ),
        (Evidence("realize", status("exited", 1), stderr_tail="MemoryError: Unable to allocate 3 GiB"), Outcome.OOM, "oom", 1),
        (Evidence("realize", status("exited", 127)), Outcome.LAUNCH_ERROR, "launch_error", 127),
        (
            Evidence("realize", status("exited", 255), stderr_tail="[mpiexec@vm] HYDU_create_process: execvp error"),
            Outcome.LAUNCH_ERROR, "launch_error", 255,
        ),
        (Evidence("realize", status("walltime", 15)), Outcome.WALLTIME, "walltime", 15),
        (Evidence("realize", status("cancelled", 15, cancel_reason="cancelled")), Outcome.CANCELLED, "cancelled", 15),
        (Evidence("realize", status("cancelled", 15, cancel_reason="drain")), Outcome.DRAINED, "drained", 15),
        (Evidence("realize", status("cancelled", None, cancel_reason="lost")), Outcome.DROPPED, None, None),
        (Evidence("realize", status("orphaned", -15)), Outcome.LOST_WORKER, "lost_worker", -15),
        (Evidence("realize", status("signalled", 143, signal="SIGTERM")), Outcome.LOST_WORKER, "lost_worker", 143),
        (Evidence("realize", status("launch_error", 127, error="No such file")), Outcome.LAUNCH_ERROR, "launch_error", 127),
        (Evidence("realize", None, app_exception="ManagerLost", app_exception_text="lost"), Outcome.LOST_WORKER, "lost_worker", None),
        (
            Evidence("realize", None, app_exception="BashExitFailure", stderr_tail="ModuleNotFoundError: worker"),
            Outcome.LAUNCH_ERROR, "launch_error", None,
        ),
        (Evidence("realize", None, requested_stop=CancelReason.CANCELLED), Outcome.CANCELLED, "cancelled", None),
        (Evidence("realize", None, requested_stop=CancelReason.DRAIN), Outcome.DRAINED, "drained", None),
        (Evidence("realize", None, status_problem="status.json is damaged"), Outcome.LAUNCH_ERROR, "launch_error", None),
    ],
)  # fmt: skip
def test_classify(evidence, outcome, failure_class, exit_code):
    verdict = classify(evidence)
    assert verdict.outcome is outcome
    assert verdict.outcome.failure_class == failure_class
    assert verdict.exit_code == exit_code


def test_messages_say_what_happened():
    assert "60.0 s" in classify(Evidence("realize", status("walltime", 15))).message
    refused = classify(
        Evidence("realize", status("exited", 3), stderr_tail="x\nmapmaker realize: plan refused: checksum\n")
    )
    assert refused.message == "plan refused: mapmaker realize: plan refused: checksum"
    crash = classify(Evidence("realize", status("exited", 1), stderr_tail="Traceback\nKeyError: 'x'\n\n===\n"))
    assert crash.message == "failed (exit code 1): KeyError: 'x'"


def test_log_tail_keeps_the_last_100_lines():
    text = "\n".join(f"line {i}" for i in range(250))
    tail = log_tail(text)
    assert tail.splitlines() == [f"line {i}" for i in range(150, 250)]
    assert len(log_tail("x" * 100_000)) == 65_536
