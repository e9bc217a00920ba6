"""The Slurm cluster of ``deploy/slurm/start-local-slurm --nodes 3`` for tests: find it, start it, stop what we started.

Three nodes (node1..node3, each a network namespace with its own slurmd and 2 CPUs): a realisation
spans two of them, and when one dies a new two-node block still fits on the other two.

A session uses a Slurm that already answers (``sinfo`` shows an idle node and
``srun hostname`` runs) as it is and leaves it running; otherwise it starts one
with ``deploy/slurm/start-local-slurm --install --nodes 3`` and stops it at the end with
``deploy/slurm/stop-local-slurm``. Under ``CI=true`` a Slurm that cannot be had
fails the tests instead of skipping them: CI's machine is meant to have one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.databases import on_database

REPO = Path(__file__).resolve().parents[2]
START = REPO / "deploy" / "slurm" / "start-local-slurm"
STOP = REPO / "deploy" / "slurm" / "stop-local-slurm"
NODE = REPO / "deploy" / "slurm" / "local-slurm-node"
CLUSTER_NODES = 3
NAMESPACE_PREFIX = "mcslurm-"  # the nodes' network namespaces: mcslurm-node1 ...
PARTITION = os.environ.get("MAPCAMPAIGN_SLURM_PARTITION", "debug")
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
# The marks of every test that runs the worker on this Slurm: on SQLite only, as the worker's protocol runs
# on both databases in tests/integration and here the scheduler is under test.
SLURM_WORKER_MARKS = [
    pytest.mark.slurm,
    pytest.mark.integration,
    pytest.mark.mpi,
    pytest.mark.timeout(600),
    on_database("sqlite"),
]


class SlurmUnavailable(RuntimeError):
    """No Slurm answers here and none could be started; the message says why."""


@dataclass(frozen=True)
class LocalSlurm:
    partition: str
    started_here: bool  # this session started it, so this session stops it
    nodes: tuple[str, ...] = ()  # the partition's nodes


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


def partition_nodes() -> tuple[str, ...]:
    done = _run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N"], timeout=20)
    return tuple(sorted(set(done.stdout.split()))) if done.returncode == 0 else ()


def start_local_slurm() -> LocalSlurm:
    if slurm_answers():
        return LocalSlurm(PARTITION, started_here=False, nodes=partition_nodes())
    if os.geteuid() != 0:
        raise SlurmUnavailable("no Slurm answers and starting one needs root (deploy/slurm/start-local-slurm)")
    try:
        done = _run([str(START), "--install", "--nodes", str(CLUSTER_NODES)], timeout=600)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{START} did not finish within 600 s") from None
    if done.returncode != 0:
        raise SlurmUnavailable(f"{START} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    if not slurm_answers():
        stop_local_slurm()
        raise SlurmUnavailable(f"{START} succeeded but sinfo/srun do not work:\n{done.stderr[-4000:]}")
    return LocalSlurm(PARTITION, started_here=True, nodes=partition_nodes())


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



def scontrol(*args: str) -> None:
    done = _run(["scontrol", *args], timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"scontrol {' '.join(args)}: {done.stderr}")


def node_state(node: str) -> str:
    """``sinfo``'s state of one node, e.g. ``idle``, ``alloc``, ``down*``."""
    return _run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], timeout=30).stdout.strip()


def fail_node(node: str) -> None:
    """``deploy/slurm/local-slurm-node fail NODE``: its link down, every process in its namespace killed."""
    done = _run([str(NODE), "fail", node], timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"local-slurm-node fail {node}: {done.stderr}")


def restore_node(node: str) -> None:
    done = _run([str(NODE), "restore", node], timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"local-slurm-node restore {node}: {done.stderr}")


def node_processes(node: str) -> dict[int, list[str]]:
    """The processes in NODE's network namespace: pid -> argument list."""
    done = _run(["ip", "netns", "pids", NAMESPACE_PREFIX + node], timeout=30)
    found = {}
    for pid in done.stdout.split():
        try:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # ended meanwhile
        found[int(pid)] = arguments
    return found


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def write_slurm_site(
    path: Path,
    *,
    partition: str,
    bundled: str = "slurm-mpiexec.toml",
    walltime: str = "00:10:00",
    python: Path | None = None,
    scheduler_options: str | None = None,
) -> Path:
    """A bundled deploy/sites/ Slurm site file with test-sized timings: the files users start from."""
    site = tomllib.loads((REPO / "deploy" / "sites" / bundled).read_text())
    site["name"] = "slurm-test"
    if python is not None:
        site["python"] = str(python)
    site["provider"].update(partition=partition, walltime=walltime, status_poll_s=5)  # a lost block seen in seconds
    if scheduler_options is not None:
        site["provider"]["scheduler_options"] = scheduler_options
    site["executor"].update(
        heartbeat_period_s=1,  # a lost block is noticed in seconds
        heartbeat_threshold_s=10,
        max_idletime_s=5,
        strategy_period_s=0.5,
    )
    site["runner"].update(kill_grace_s=1, liveness_timeout_s=60)  # grace below Slurm's KillWait (5 s here)
    lines = [f"{key} = {toml_value(value)}" for key, value in site.items() if not isinstance(value, dict)]
    for table, values in site.items():
        if isinstance(values, dict):
            lines += [f"[{table}]", *(f"{key} = {toml_value(value)}" for key, value in values.items())]
    path.write_text("\n".join(lines) + "\n")
    return path
