"""The contract between the programs: the map-maker's command line and exit codes, the runner's
files and status, the product file names, and the log-tail limit.

The worker never imports the map-maker: it starts ``python -m mapmaker ...`` under the task
runner (``python -m worker.runner``), and reads back what they leave in the task's folder. Both
sides take every name, code and limit of that exchange from here, so neither can drift.

Standard library and pydantic only (the runner starts on compute nodes and must start fast).
"""

from __future__ import annotations

import enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

# --------------------------------------------------------------------------- exit codes


class MapmakerExit(enum.IntEnum):
    """Exit status of ``python -m mapmaker``: anything not listed here is a failure of the run."""

    OK = 0
    BAD_INPUT = 2  # spec, options, sky map, an existing --out: the same command will fail again
    PLAN_REFUSED = 3  # realize --plan with an overlap plan that does not match the run or is damaged
    # realize or bandpowers --coupling with a coupling file built for another mask, binning or estimator, or
    # damaged: apart from PLAN_REFUSED, as the worker removes a stale coupling file and leaves the plan alone
    COUPLING_REFUSED = 4


# --------------------------------------------------------------------------- file names

RESULT_FILE = "result.json"  # schemas.result.RealizationResult, written last into the product folder
MAP_FILES = {"iqu": "map_iqu.fits", "hits": "hits.fits", "rcond": "rcond.fits"}
SPECTRA_FILES = {"mask": "mask.fits", "spectra": "spectra.npz"}
PLAN_REPORT_SUFFIX = ".report.json"  # `mapmaker preprocess --report` beside its plan: <plan>.report.json
SPEC_FILE = "spec.json"  # the campaign spec as the worker hands it to the map-maker


def partial_folder_prefix(out_name: str) -> str:
    """How the map-maker's temporary product folder for ``--out NAME`` begins (``.NAME.partial-XXXX``, renamed
    to NAME at the end): the worker removes those an attempt left."""
    return f".{out_name}.partial-"


# The task's work folder, shared by the worker and the runner (see worker.runner):
LIVENESS_FILE = "liveness"  # touched by the worker while it lives
CANCEL_FILE = "cancel"  # written by the worker: content is a CancelReason
RUNNER_FILE = "runner.json"  # written by the runner at start: host, pids, scheduler job id
STATUS_FILE = "status.json"  # written by the runner at the end: RunnerStatus
STDOUT_FILE = "stdout.txt"
STDERR_FILE = "stderr.txt"
MARKER_VARIABLE = "MAPCAMPAIGN_TASK_MARKER"  # environment variable tagging every process of a task

# --------------------------------------------------------------------------- log tails

LOG_TAIL_LINES = 100  # lines of a failed task's output sent with its report
MAX_LOG_TAIL_CHARS = 65_536  # the most the service stores per attempt
MAX_MESSAGE_CHARS = 4_000  # one line for people: a failure's message, a refused plan's reason


def log_tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text``, at most :data:`MAX_LOG_TAIL_CHARS` characters."""
    tail = "\n".join(text.splitlines()[-lines:])
    return tail[-MAX_LOG_TAIL_CHARS:]


# --------------------------------------------------------------------------- the runner's status


class Ending(str, enum.Enum):
    """How a task ended, as the runner saw it (``status.json`` field ``ending``)."""

    EXITED = "exited"  # the command exited by itself; see exit_code
    WALLTIME = "walltime"  # the runner killed it at the wall-time deadline
    CANCELLED = "cancelled"  # the worker asked (cancel file); see cancel_reason
    ORPHANED = "orphaned"  # the liveness file stopped changing: the worker is gone
    SIGNALLED = "signalled"  # the runner itself got SIGTERM/SIGINT/SIGHUP (scheduler, node shutdown)
    LAUNCH_ERROR = "launch_error"  # the command could not be started


class CancelReason(str, enum.Enum):
    """What the worker writes into the cancel file."""

    CANCELLED = "cancelled"  # the service said so (campaign cancelled, failed or deleted)
    DRAIN = "drain"  # the worker is shutting down and its drain deadline passed
    LOST = "lost"  # the service gave the task to someone else


class RunnerStarted(BaseModel):
    """``runner.json``: the runner launched the command. Times are Unix seconds on the runner's node."""

    model_config = ConfigDict(extra="allow")  # a newer runner may add fields; an older worker keeps reading

    host: str
    runner_pid: int
    marker: str
    scheduler_job_id: str | None = None  # the batch job (block) the task runs in, when there is one
    pid: int  # the command's process, leader of its own session and process group
    pgid: int
    launched_at: float
    walltime_s: float


class RunnerStatus(BaseModel):
    """``status.json``: how a task ended. Times are Unix seconds on the runner's node."""

    model_config = ConfigDict(extra="allow")  # a newer runner may add fields; an older worker keeps reading

    host: str
    runner_pid: int
    marker: str
    scheduler_job_id: str | None = None
    ending: Ending
    exit_code: int | None = None  # the command's status; negative: killed by that signal
    launched_at: float | None = None
    ended_at: float
    elapsed_s: float
    walltime_s: float
    cancel_reason: CancelReason | None = None
    launched: bool = True
    signal: str | None = None  # SIGNALLED: the signal the runner got, e.g. "SIGTERM"
    error: str | None = None  # LAUNCH_ERROR: why the command could not be started
    killed_after_grace: int | None = None  # processes that needed SIGKILL when the runner ended the task
    stragglers: int | None = None  # EXITED: processes the command left behind, swept by the runner


# --------------------------------------------------------------------------- the map-maker's command line


def mapmaker_realize_args(
    python: str,
    *,
    spec_file: Path,
    realization: int,
    out: Path,
    threads: int,
    plan_file: Path | None,
    sky_root: Path | None,
    instrument_root: Path | None = None,
    coupling_file: Path | None = None,
    coarse_file: Path | None = None,
) -> list[str]:
    """``python -m mpi4py -m mapmaker realize ...`` (mpi4py in front: an exception on one rank aborts all).

    ``coupling_file``: the bandpowers' mode coupling to read, or to build and write when it does not exist
    (``realize --coupling``), so the realisations of a scan pattern pay for it once. ``coarse_file``: the
    same for the two-level preconditioner's coarse operator (``realize --coarse-cache``); a damaged or
    foreign one is rebuilt and replaced by the run, so it has no exit code of its own.
    """
    args = [
        python, "-m", "mpi4py", "-m", "mapmaker", "realize",
        "--spec", str(spec_file),
        "--realization", str(realization),
        "--out", str(out),
        "--threads", str(threads),
    ]  # fmt: skip
    if plan_file is not None:
        args += ["--plan", str(plan_file)]
    if sky_root is not None:
        args += ["--sky-root", str(sky_root)]
    if instrument_root is not None:
        args += ["--instrument-root", str(instrument_root)]
    if coupling_file is not None:
        args += ["--coupling", str(coupling_file)]
    if coarse_file is not None:
        args += ["--coarse-cache", str(coarse_file)]
    return args


def mapmaker_preprocess_args(
    python: str, *, spec_file: Path, out: Path, report: Path, instrument_root: Path | None = None
) -> list[str]:
    """``python -m mpi4py -m mapmaker preprocess --spec F --out PLAN --report REPORT.json [--instrument-root DIR]``."""
    args = [
        python, "-m", "mpi4py", "-m", "mapmaker", "preprocess",
        "--spec", str(spec_file),
        "--out", str(out),
        "--report", str(report),
    ]  # fmt: skip
    if instrument_root is not None:
        args += ["--instrument-root", str(instrument_root)]
    return args


def mapmaker_bandpowers_args(
    python: str,
    *,
    map_file: Path,
    mask_file: Path,
    mask_sha256: str,
    bin_width: int,
    lmax: int,
    purify_b: bool,
    out: Path,
    coupling_file: Path | None = None,
) -> list[str]:
    """``python -m mapmaker bandpowers ...``: one map's decoupled bandpowers into ``out`` (``schemas.result.MapBandpowers``).

    Exit :attr:`MapmakerExit.BAD_INPUT` for a map that cannot be used (not HEALPix I/Q/U, another nside,
    unobserved pixels inside the mask), :attr:`MapmakerExit.COUPLING_REFUSED` for a mask or coupling that is not
    the one named by ``mask_sha256``.
    """
    args = [
        python, "-m", "mapmaker", "bandpowers",
        "--map", str(map_file),
        "--mask", str(mask_file),
        "--mask-sha256", mask_sha256,
        "--bin-width", str(bin_width),
        "--lmax", str(lmax),
        "--purify-b" if purify_b else "--no-purify-b",
        "--out", str(out),
    ]  # fmt: skip
    if coupling_file is not None:
        args += ["--coupling", str(coupling_file)]
    return args
