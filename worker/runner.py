"""The task runner: ``python -m worker.runner --workdir DIR [options] -- COMMAND ...``.

Every task (a ``mapmaker preprocess`` or ``realize`` under MPI) runs under this
small program, started by the Parsl ``bash_app`` on the node where the task
runs: the worker's own host for the local site, a compute node under Slurm or
PBS, where the worker process cannot send signals. It talks to the worker
only through files in the task's work folder (a shared file system at a
batch site):

===============  =====================  ===================================================
file             written by             meaning
===============  =====================  ===================================================
``liveness``     the worker             touched every few seconds while the worker lives
``cancel``       the worker             stop the task; content: ``cancelled``, ``drain`` or ``lost``
``runner.json``  the runner, at start   host, pids, scheduler job id, launch time, marker
``status.json``  the runner, at end     how the task ended and its exit code
===============  =====================  ===================================================

The names, the cancel reasons and the two JSON documents (``RunnerStarted``,
``RunnerStatus``) are the contract in :mod:`schemas.programs`.

What it does:

1. If ``cancel`` already exists (cancelled while queued), it launches nothing.
2. It starts COMMAND in a session of its own with ``MAPCAMPAIGN_TASK_MARKER``
   in its environment. MPICH's ``hydra_pmi_proxy`` and the ranks it starts
   each call ``setsid``, so neither the process group nor the parent chain
   finds every rank; the inherited marker does.
3. It watches, every 0.1 s, the command's exit and the wall-time deadline
   (counted from the launch on this node, not from the claim); every second
   the cancel file and the liveness file, whose modification time must change at least once
   every ``--liveness-timeout-s`` (a dead-man switch: when the worker dies,
   its orphaned tasks end themselves instead of running on); and SIGTERM,
   SIGINT or SIGHUP sent to the runner itself (a scheduler ending the block).
   Only changes of the liveness file's time are compared, never clocks, so
   nodes whose clocks disagree do not matter.
4. To end a task it sends SIGTERM to the command's process group and to
   every process of the task (descendants and marked processes), waits
   ``--grace-s``, then SIGKILLs whatever is left, and repeats the sweep until
   nothing marked survives. ``mpiexec`` and ``srun`` get the SIGTERM with the
   rest and take down the ranks on other nodes, which the runner cannot see.
   Marked processes left behind by a command that exited by itself are swept
   the same way.
5. It writes ``status.json`` atomically and exits with the command's exit
   status (128 + signal when it was killed).

Imports the standard library, psutil and :mod:`schemas.programs` /
:mod:`schemas.files`, which bring pydantic (``status.json`` is written from a
``RunnerStatus``); ``schemas/__init__`` imports nothing, so the spec models are
not loaded. Measured on the 2-core test machine under load (CPU time of
``python -m worker.runner --help``, medians of 12 in two runs): 60-90 ms with
the standard library and psutil alone, 190-260 ms with pydantic and the two
schemas modules. Paid once per task before the launch; the wall-time deadline
counts from after it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from schemas.files import atomic_write_json, atomic_write_text
from schemas.programs import (
    CANCEL_FILE,
    LIVENESS_FILE,
    MARKER_VARIABLE,
    RUNNER_FILE,
    STATUS_FILE,
    CancelReason,
    Ending,
    RunnerStarted,
    RunnerStatus,
)
from worker.clock import SYSTEM_CLOCK, Clock

POLL_S = 0.1  # how often the command's exit and the deadline are checked
FILE_POLL_S = 1.0  # how often the cancel and liveness files are looked at (metadata load on shared file systems)
# Scheduler variables naming the batch job the task runs in (the block), in order of preference.
SCHEDULER_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "COBALT_JOBID", "FLUX_JOB_ID")


# --------------------------------------------------------------------------- the cancel file


def read_cancel(workdir: Path) -> CancelReason | None:
    """The cancel reason, or None when the task is not cancelled (or the file cannot be read just now).

    A read error (ESTALE or EIO on a network file system) is not a cancel: the runner looks again at
    its next poll, and a worker that is really gone is caught by the liveness file instead. Content
    that is no :class:`CancelReason` counts as ``cancelled``.
    """
    try:
        text = (workdir / CANCEL_FILE).read_text().strip()
    except OSError:
        return None
    try:
        return CancelReason(text)
    except ValueError:
        return CancelReason.CANCELLED


def write_cancel(workdir: Path, reason: CancelReason) -> None:
    """Ask the runner of the task in ``workdir`` to stop it (the worker's side of the cancel file).

    Raises FileNotFoundError when ``workdir`` is gone: a cancel file must never bring back a work
    folder that was removed.
    """
    if not workdir.is_dir():
        raise FileNotFoundError(f"no work folder {workdir}")
    atomic_write_text(workdir / CANCEL_FILE, reason.value + "\n")


# --------------------------------------------------------------------------- finding a task's processes


def marked_processes(marker: str, *, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Live (not zombie) processes whose environment carries ``MAPCAMPAIGN_TASK_MARKER=marker``."""
    skip = set(exclude)
    found = []
    for process in psutil.process_iter():
        if process.pid in skip:
            continue
        try:
            if process.environ().get(MARKER_VARIABLE) == marker and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _alive(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            alive.append(process)
    return alive


def _signal_all(pgid: int, processes: Iterable[psutil.Process], signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
    for process in processes:
        try:
            process.send_signal(signum)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) also succeeds for a group of zombies; look for a live member.
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
            continue
    return False


def terminate_task(child: subprocess.Popen, marker: str, grace_s: float) -> int:
    """End every process of the task: SIGTERM, ``grace_s``, then SIGKILL until none is left.

    Returns the number of processes that needed SIGKILL.
    """
    pgid = child.pid  # start_new_session: the command leads its own group
    own = {os.getpid()}
    targets = _descendants(child.pid) + marked_processes(marker, exclude=own)
    _signal_all(pgid, targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()
        targets = _alive(targets + _descendants(child.pid))
        quiet = child.returncode is not None and not targets and not _group_alive(pgid)
        if quiet and not marked_processes(marker, exclude=own):
            return 0
        time.sleep(POLL_S)
    killed = 0
    for _ in range(50):  # new processes may appear while an MPI launcher tears down; sweep until quiet
        child.poll()
        survivors = _alive(targets + _descendants(child.pid) + marked_processes(marker, exclude=own))
        group = _group_alive(pgid)
        if not survivors and not group and child.returncode is not None:
            break
        killed += len(survivors)
        _signal_all(pgid, survivors, signal.SIGKILL)
        targets = survivors
        time.sleep(POLL_S)
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return killed


def sweep_stragglers(marker: str, grace_s: float) -> int:
    """Kill marked processes left behind after the command exited by itself; return how many there were."""
    own = {os.getpid()}
    stragglers = marked_processes(marker, exclude=own)
    if not stragglers:
        return 0
    for process in stragglers:
        try:
            process.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    _, alive = psutil.wait_procs(stragglers, timeout=grace_s)
    for _ in range(50):
        alive = _alive(alive + marked_processes(marker, exclude=own))
        if not alive:
            break
        for process in alive:
            try:
                process.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        time.sleep(POLL_S)
    return len(stragglers)


# --------------------------------------------------------------------------- the watch


class _Signals:
    """Records SIGTERM/SIGINT/SIGHUP sent to the runner instead of dying on them."""

    def __init__(self) -> None:
        self.received: int | None = None
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.received = self.received or signum


class _Liveness:
    """Dead-man switch: the liveness file's modification time must change within ``timeout_s`` of ``clock``."""

    def __init__(self, path: Path, timeout_s: float, clock: Clock = SYSTEM_CLOCK):
        self.path = path
        self.timeout_s = timeout_s
        self.clock = clock
        self.seen = self._stamp()
        self.changed_at = clock.monotonic()

    def _stamp(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    def stale(self) -> bool:
        stamp = self._stamp()
        now = self.clock.monotonic()
        if stamp is not None and stamp != self.seen:
            self.seen, self.changed_at = stamp, now
        return now - self.changed_at > self.timeout_s


def scheduler_job_id(environ: dict[str, str]) -> str | None:
    for name in SCHEDULER_JOB_VARS:
        if environ.get(name):
            return environ[name]
    return None


def describe(details: dict[str, Any]) -> str:
    """`` (cancel_reason: drain)``, as the runner says on stderr why it ends a task; empty without details."""
    if not details:
        return ""
    return " (" + ", ".join(f"{name}: {getattr(value, 'value', value)}" for name, value in details.items()) + ")"


def run(
    command: list[str],
    *,
    workdir: Path,
    marker: str,
    walltime_s: float,
    grace_s: float,
    liveness_timeout_s: float | None,
) -> int:
    """Run ``command`` as described in the module docstring; return the runner's exit status."""
    signals = _Signals()
    host = socket.gethostname()
    started_wall = time.time()
    started = time.monotonic()
    job_id = scheduler_job_id(dict(os.environ))
    launched_at: float | None = None

    def finish(ending: Ending, exit_code: int | None, **details: Any) -> int:
        """Write ``status.json``; ``details``: the optional fields of :class:`RunnerStatus` that apply."""
        ended_wall = time.time()
        status = RunnerStatus(
            host=host,
            runner_pid=os.getpid(),
            marker=marker,
            scheduler_job_id=job_id,
            ending=ending,
            exit_code=exit_code,
            launched_at=launched_at,
            ended_at=ended_wall,
            elapsed_s=round(ended_wall - (launched_at or started_wall), 3),
            walltime_s=walltime_s,
            **details,
        )
        atomic_write_json(workdir / STATUS_FILE, status.model_dump(mode="json"))
        if exit_code is None:
            return 1
        return exit_code if exit_code >= 0 else 128 - exit_code

    reason = read_cancel(workdir)
    if reason is not None:
        return finish(Ending.CANCELLED, None, cancel_reason=reason, launched=False)

    environment = dict(os.environ)
    environment[MARKER_VARIABLE] = marker
    launched_at = time.time()
    try:
        child = subprocess.Popen(command, env=environment, start_new_session=True, close_fds=True)
    except OSError as error:
        print(f"worker.runner: cannot start {command[0]!r}: {error}", file=sys.stderr, flush=True)
        return finish(Ending.LAUNCH_ERROR, 127, error=str(error))
    runner_started = RunnerStarted(
        host=host,
        runner_pid=os.getpid(),
        marker=marker,
        scheduler_job_id=job_id,
        pid=child.pid,
        pgid=child.pid,
        launched_at=launched_at,
        walltime_s=walltime_s,
    )
    atomic_write_json(workdir / RUNNER_FILE, runner_started.model_dump(mode="json"))

    liveness = _Liveness(workdir / LIVENESS_FILE, liveness_timeout_s) if liveness_timeout_s else None
    deadline = started + walltime_s
    ending: Ending | None = None
    details: dict[str, Any] = {}
    next_file_check = time.monotonic() + FILE_POLL_S
    while True:
        try:
            child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        look_at_files = now >= next_file_check
        if look_at_files:
            next_file_check = now + FILE_POLL_S
        if signals.received is not None:
            ending, details = Ending.SIGNALLED, {"signal": signal.Signals(signals.received).name}
        elif now >= deadline:
            ending = Ending.WALLTIME
        elif look_at_files and (reason := read_cancel(workdir)) is not None:
            ending, details = Ending.CANCELLED, {"cancel_reason": reason}
        elif look_at_files and liveness is not None and liveness.stale():
            ending = Ending.ORPHANED
        if ending is not None:
            print(
                f"worker.runner: {ending.value}{describe(details)}: "
                f"ending every process of the task (grace {grace_s:g} s)",
                file=sys.stderr,
                flush=True,
            )
            killed = terminate_task(child, marker, grace_s)
            return finish(ending, child.returncode, killed_after_grace=killed, **details)
    if signals.received is not None and child.returncode != 0:
        # The scheduler signals every process of the block at once: the command may die of it before the
        # runner's own check, and its exit is then a consequence of the block ending, not of the task
        # (a command that had already exited 0 finished its work: that stays a success).
        killed = terminate_task(child, marker, grace_s)
        return finish(
            Ending.SIGNALLED, child.returncode, killed_after_grace=killed, signal=signal.Signals(signals.received).name
        )
    stragglers = sweep_stragglers(marker, grace_s)
    if stragglers:
        print(f"worker.runner: killed {stragglers} processes the command left behind", file=sys.stderr, flush=True)
    return finish(Ending.EXITED, child.returncode, stragglers=stragglers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m worker.runner",
        description="Run one MapCampaign task: enforce its wall time, obey the cancel file, end it with every "
        "process it started when the worker is gone, and record how it ended in status.json.",
    )
    parser.add_argument("--workdir", required=True, type=Path, help="the task's work folder")
    parser.add_argument("--marker", required=True, help=f"value of {MARKER_VARIABLE} for every process of the task")
    parser.add_argument("--walltime-s", required=True, type=float, help="wall-time limit from launch (s)")
    parser.add_argument("--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL grace (s)")
    parser.add_argument(
        "--liveness-timeout-s",
        type=float,
        default=None,
        help="end the task when the liveness file stays unchanged this long",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("worker.runner: no command given after --", file=sys.stderr)
        return 2
    if args.walltime_s <= 0 or args.grace_s < 0:
        print("worker.runner: --walltime-s must be positive and --grace-s not negative", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    return run(
        command,
        workdir=args.workdir,
        marker=args.marker,
        walltime_s=args.walltime_s,
        grace_s=args.grace_s,
        liveness_timeout_s=args.liveness_timeout_s,
    )


if __name__ == "__main__":
    sys.exit(main())
