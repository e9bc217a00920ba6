"""The single-node Slurm of ``deploy/slurm/start-local-slurm`` for tests: find it, start it, stop what we started.

A session uses a Slurm that already answers (``sinfo`` shows an idle node and
``srun hostname`` runs) as it is and leaves it running; otherwise it starts one
with ``deploy/slurm/start-local-slurm --install`` and stops it at the end with
``deploy/slurm/stop-local-slurm``. Under ``CI=true`` a Slurm that cannot be had
fails the tests instead of skipping them: CI's machine is meant to have one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START = REPO / "deploy" / "slurm" / "start-local-slurm"
STOP = REPO / "deploy" / "slurm" / "stop-local-slurm"
PARTITION = os.environ.get("MAPCAMPAIGN_SLURM_PARTITION", "debug")
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


class SlurmUnavailable(RuntimeError):
    """No Slurm answers here and none could be started; the message says why."""


@dataclass(frozen=True)
class LocalSlurm:
    partition: str
    started_here: bool  # this session started it, so this session stops it


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, check=False, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PATH": SBIN_PATH}
    )


def slurm_answers() -> bool:
    """A node of the partition is usable and a one-task job runs on it."""
    if shutil.which("sinfo", path=SBIN_PATH) is None:
        return False
    try:
        states = _run(["sinfo", "-h", "-p", PARTITION, "-o", "%T"], timeout=20)
        if states.returncode != 0 or not any(s.startswith(("idle", "mix", "alloc")) for s in states.stdout.split()):
            return False
        return _run(["srun", "-p", PARTITION, "-N1", "-n1", "hostname"], timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_local_slurm() -> LocalSlurm:
    if slurm_answers():
        return LocalSlurm(PARTITION, started_here=False)
    if os.geteuid() != 0:
        raise SlurmUnavailable("no Slurm answers and starting one needs root (deploy/slurm/start-local-slurm)")
    try:
        done = _run([str(START), "--install"], timeout=600)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{START} did not finish within 600 s") from None
    if done.returncode != 0:
        raise SlurmUnavailable(f"{START} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    if not slurm_answers():
        stop_local_slurm()
        raise SlurmUnavailable(f"{START} succeeded but sinfo/srun do not work:\n{done.stderr[-4000:]}")
    return LocalSlurm(PARTITION, started_here=True)


def stop_local_slurm() -> None:
    _run([str(STOP)], timeout=120)


def scontrol_job(job_id: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as a dict (empty when Slurm does not know the job)."""
    done = _run(["scontrol", "show", "job", "-o", job_id], timeout=30)
    if done.returncode != 0:
        return {}
    fields = {}
    for item in done.stdout.split():
        key, _, value = item.partition("=")
        fields.setdefault(key, value)
    return fields


def scancel(job_id: str) -> None:
    done = _run(["scancel", job_id], timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"scancel {job_id}: {done.stderr}")

