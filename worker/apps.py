"""The one Parsl app every task runs through: a ``bash_app`` whose command :mod:`worker.commands` built.

Parsl sets ``$PARSL_MPI_PREFIX`` for the nodes it gives the task from the
``parsl_resource_specification``; the command uses it to start the ranks.
"""

from __future__ import annotations

from parsl.app.app import bash_app

from worker.parsl_config import EXECUTOR_LABEL


@bash_app(executors=[EXECUTOR_LABEL])
def mpi_task(command: str, parsl_resource_specification: dict | None = None, stdout=None, stderr=None) -> str:
    return command
