"""Site file -> Parsl ``Config``: one pure function, :func:`build_parsl_config`.

Parsl's three layers stay apart:

* provider -- ``LocalProvider`` / ``SlurmProvider`` / ``PBSProProvider`` from
  ``[provider]``, always with ``SimpleLauncher()``: MPI mode places one worker
  pool on the first node of a block, and the tasks' own launcher
  (``$PARSL_MPI_PREFIX``) spreads the ranks;
* launcher -- ``mpiexec`` or ``srun`` (``MPIExecutor(mpi_launcher=...)``);
* executor -- ``MPIExecutor`` with ``max_workers_per_block`` tasks at once per block.

MPI mode learns a block's nodes from ``$SLURM_NODELIST`` or ``$PBS_NODEFILE``.
The local site has neither, so its blocks get ``PBS_NODEFILE`` pointing at a
node file that names this host once per task slot (:func:`local_nodefile_text`;
Parsl hands each MPI task whole "nodes" from that list).

Every block starts with the worker's Python on ``PATH`` (``mpiexec`` from the
pip MPICH and ``process_worker_pool.py`` live beside it), then the site's own
``worker_init``, which has the last word.

The interchange is started through :mod:`worker.pdeathsig` so that it ends
with the worker even when the worker is SIGKILLed (Parsl would leave it
running, and its block with it).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from parsl.config import Config
from parsl.executors import MPIExecutor
from parsl.launchers import SimpleLauncher
from parsl.providers import LocalProvider, PBSProProvider, SlurmProvider
from parsl.providers.base import ExecutionProvider

from worker.site import LocalProviderSpec, PBSProProviderSpec, SiteConfig, SlurmProviderSpec

EXECUTOR_LABEL = "mpi"


def local_nodefile_text(host: str, slots: int) -> str:
    """Node file for a site without a scheduler: ``host`` once per task that may run at once."""
    return "".join(f"{host}\n" for _ in range(slots))


def block_init(site: SiteConfig, *, python: str, nodefile: Path | None) -> str:
    """Shell lines every block runs before its worker pool starts."""
    lines = [f'export PATH={shlex.quote(str(Path(python).parent))}:"$PATH"']
    if isinstance(site.provider, LocalProviderSpec):
        if nodefile is None:
            raise ValueError("a local site needs a node file")
        # A local site inside some batch job must still use its own node file.
        lines += ["unset SLURM_NODELIST SLURM_JOB_NODELIST", f"export PBS_NODEFILE={shlex.quote(str(nodefile))}"]
    if site.provider.worker_init.strip():
        lines.append(site.provider.worker_init.strip())
    return "\n".join(lines)


class SlurmBlockProvider(SlurmProvider):
    """Parsl's ``SlurmProvider``, except that a block Slurm no longer knows counts as finished.

    Without accounting storage Parsl polls ``squeue --job IDS``, and takes a job missing from the
    answer as completed. But when *none* of the ids is known any more (the only block was purged
    after ``MinJobAge``, or the controller lost its state), squeue exits 1 with "Invalid job id
    specified"; Parsl then keeps the block RUNNING forever and never starts another one: the
    worker would wait for good. An empty answer lets Parsl's own rule apply.
    """

    def __init__(self, *, status_poll_s: int = 60, **options: Any):
        super().__init__(**options)
        self._status_poll_s = status_poll_s

    @property
    def status_polling_interval(self) -> int:
        """Seconds between Parsl's ``squeue`` calls (Parsl's own Slurm default is 60): the site's choice."""
        return self._status_poll_s

    def execute_wait(self, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        retcode, stdout, stderr = super().execute_wait(cmd, timeout)
        if retcode != 0 and cmd.lstrip().startswith("squeue") and "Invalid job id" in (stderr or ""):
            return 0, "", stderr
        return retcode, stdout, stderr


def build_provider(site: SiteConfig, *, worker_init: str) -> ExecutionProvider:
    spec = site.provider
    counts: dict[str, Any] = {
        "init_blocks": spec.init_blocks,
        "min_blocks": spec.min_blocks,
        "max_blocks": spec.max_blocks,
    }
    if isinstance(spec, LocalProviderSpec):
        return LocalProvider(launcher=SimpleLauncher(), nodes_per_block=1, worker_init=worker_init, **counts)
    if isinstance(spec, SlurmProviderSpec):
        return SlurmBlockProvider(
            partition=spec.partition,
            account=spec.account,
            qos=spec.qos,
            constraint=spec.constraint,
            nodes_per_block=spec.nodes_per_block,
            cores_per_node=spec.cores_per_node,
            mem_per_node=spec.mem_per_node_gb,
            walltime=spec.walltime,
            scheduler_options=spec.scheduler_options,
            worker_init=worker_init,
            exclusive=spec.exclusive,
            cmd_timeout=spec.cmd_timeout_s,
            launcher=SimpleLauncher(),
            status_poll_s=spec.status_poll_s,
            **counts,
        )
    if isinstance(spec, PBSProProviderSpec):
        return PBSProProvider(
            account=spec.account,
            queue=spec.queue,
            scheduler_options=spec.scheduler_options,
            select_options=spec.select_options,
            nodes_per_block=spec.nodes_per_block,
            cpus_per_node=spec.cpus_per_node,
            walltime=spec.walltime,
            worker_init=worker_init,
            cmd_timeout=spec.cmd_timeout_s,
            launcher=SimpleLauncher(),
            **counts,
        )
    raise TypeError(f"unknown provider {spec!r}")


def build_parsl_config(site: SiteConfig, *, run_dir: Path, python: str, nodefile: Path | None) -> Config:
    """The Parsl configuration of ``site``: one ``MPIExecutor`` on the site's provider.

    ``python`` is the interpreter the blocks and tasks use; ``nodefile`` is the
    local node file (local sites only; see :func:`local_nodefile_text`).
    Pure: builds objects, starts and writes nothing.
    """
    provider = build_provider(site, worker_init=block_init(site, python=python, nodefile=nodefile))
    port_range = site.executor.worker_port_range
    optional: dict[str, Any] = {"worker_port_range": port_range} if port_range else {}  # else Parsl's default
    executor = MPIExecutor(
        label=EXECUTOR_LABEL,
        provider=provider,
        max_workers_per_block=site.tasks_per_block,
        mpi_launcher=site.mpi.launcher,
        heartbeat_period=site.executor.heartbeat_period_s,
        heartbeat_threshold=site.executor.heartbeat_threshold_s,
        address=site.executor.address,
        encrypted=site.executor.encrypted,
        **optional,
    )
    # MPIExecutor types this argument as a string, which Popen would take as one program name;
    # HighThroughputExecutor, which runs it, wants a list.
    executor.interchange_launch_cmd = [python, "-m", "worker.pdeathsig", "interchange.py"]
    return Config(
        executors=[executor],
        run_dir=str(run_dir),
        retries=0,  # the service owns retries
        strategy="simple",
        strategy_period=site.executor.strategy_period_s,
        max_idletime=site.executor.max_idletime_s,
        usage_tracking=0,
        initialize_logging=True,
    )
