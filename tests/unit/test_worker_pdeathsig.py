"""``python -m worker.pdeathsig``: a child whose launcher is already gone does not start at all."""

from __future__ import annotations

import os
import subprocess
import sys

from worker.pdeathsig import PARENT_VARIABLE


def run_wrapped(parent: str) -> subprocess.CompletedProcess:
    env = {**os.environ, PARENT_VARIABLE: parent}
    return subprocess.run(
        [sys.executable, "-m", "worker.pdeathsig", sys.executable, "-c", "print('started')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_named_launcher_alive_the_program_runs():
    done = run_wrapped(str(os.getpid()))  # this test process is the wrapper's parent
    assert done.returncode == 0 and done.stdout.strip() == "started"


def test_a_launcher_that_died_while_the_wrapper_started_stops_it():
    """Found in CI: `up` was SIGKILLed while its worker's interpreter was starting; the wrapper read the
    reaper as its parent, asked for nothing, and the worker lived on for ever."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = run_wrapped(str(gone.pid))  # not the wrapper's parent: the launcher it names is gone
    assert done.returncode == 1 and "started" not in done.stdout
