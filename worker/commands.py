"""Pure builders of what a task runs: the runner around the map-maker's command, Parsl's resource specification.

The ``bash_app`` of a task returns :func:`bash_command`: it exports
``OMP_NUM_THREADS`` and ``exec``\\s the runner (:mod:`worker.runner`), which
starts ``$PARSL_MPI_PREFIX python -m mpi4py -m mapmaker ...`` (that command line is
built by :func:`schemas.programs.mapmaker_realize_args` and ``mapmaker_preprocess_args``). The MPI
prefix is the one Parsl composed for the nodes it gave the task (``mpiexec
-n R -ppn R -hosts ...`` or ``srun --ntasks R ...``) and is left unquoted so
that bash splits it into words. Everything else is quoted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from schemas.spec import ResourceSpec

MPI_PREFIX_VARIABLE = "PARSL_MPI_PREFIX"


@dataclass(frozen=True)
class RunnerLimits:
    """What the runner enforces (seconds)."""

    walltime_s: float
    grace_s: float
    liveness_timeout_s: float | None


def runner_args(python: str, *, workdir: Path, marker: str, limits: RunnerLimits) -> list[str]:
    """``python -m worker.runner --workdir W --marker M --walltime-s S --grace-s G [--liveness-timeout-s L]``."""
    args = [
        python, "-m", "worker.runner",
        "--workdir", str(workdir),
        "--marker", marker,
        "--walltime-s", f"{limits.walltime_s:g}",
        "--grace-s", f"{limits.grace_s:g}",
    ]  # fmt: skip
    if limits.liveness_timeout_s is not None:
        args += ["--liveness-timeout-s", f"{limits.liveness_timeout_s:g}"]
    return args


def bash_command(*, runner: list[str], program: list[str], threads: int) -> str:
    """The bash_app's command line: threads for OpenMP/BLAS, then the runner around the MPI launch."""
    return (
        f"export OMP_NUM_THREADS={int(threads)}\n"
        f"exec {shlex.join(runner)} -- ${MPI_PREFIX_VARIABLE} {shlex.join(program)}"
    )


def resource_specification(
    *, ranks: int, ranks_per_node: int | None, threads: int, launcher: str, launcher_options: str
) -> dict[str, int | str]:
    """Parsl's ``parsl_resource_specification`` for an MPI task of ``ranks`` ranks.

    ``num_nodes`` nodes of ``ranks_per_node`` ranks (all on one node by default).
    srun also gets ``--cpus-per-task`` so threaded ranks have their cores.
    """
    per_node = min(ranks_per_node or ranks, ranks)
    nodes = -(-ranks // per_node)
    options = launcher_options.strip()
    if launcher == "srun" and threads > 1 and "--cpus-per-task" not in options and "-c " not in options:
        options = f"{options} --cpus-per-task={threads}".strip()
    spec: dict[str, int | str] = {"num_nodes": nodes, "ranks_per_node": per_node, "num_ranks": ranks}
    if options:
        spec["launcher_options"] = options
    return spec


def task_resource_specification(
    resources: ResourceSpec, *, launcher: str, launcher_options: str
) -> dict[str, int | str]:
    return resource_specification(
        ranks=resources.ranks,
        ranks_per_node=resources.ranks_per_node,
        threads=resources.threads_per_rank,
        launcher=launcher,
        launcher_options=launcher_options,
    )
