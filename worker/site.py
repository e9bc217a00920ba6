"""Site files: where a site's blocks come from, how ranks start, where data lives, how many tasks run at once.

A site is one TOML file (``deploy/sites/local.toml``, ``slurm.toml``,
``pbs.toml``), validated here with pydantic; every field is described in
README.md ("Worker"). The three Parsl layers are three tables:

* ``[provider]`` -- where blocks come from: ``kind = "local"`` (this machine,
  no scheduler), ``"slurm"`` or ``"pbspro"``, with the scheduler's options;
* ``[mpi]`` -- how ranks start: ``launcher = "mpiexec"`` or ``"srun"``, plus
  options added to every launch;
* ``[executor]`` -- how tasks are placed on blocks (``MPIExecutor``).

``[runner]`` tunes :mod:`worker.runner` (kill grace, dead-man switch).
Relative paths are relative to the site file's folder.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from schemas.api import MAX_DECLARED_SKY_MAPS, NAME_PATTERN

log = logging.getLogger("mapcampaign.worker")

_WALLTIME = re.compile(r"^(\d+-)?\d{1,3}:\d{2}:\d{2}$")


class SiteError(ValueError):
    """A site file that cannot be used; the message names the file and the field."""


class SiteModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_walltime(value: str) -> str:
    if not _WALLTIME.match(value):
        raise ValueError("must be HH:MM:SS or D-HH:MM:SS, e.g. '01:00:00'")
    return value


class BlockCounts(SiteModel):
    init_blocks: int = Field(1, ge=0, le=1_000, description="Blocks requested when the worker starts")
    min_blocks: int = Field(0, ge=0, le=1_000, description="Blocks kept even when idle")
    max_blocks: int = Field(1, ge=1, le=1_000, description="Most blocks at once")
    worker_init: str = Field("", max_length=20_000, description="Shell lines run first in every block (modules, venv)")

    @model_validator(mode="after")
    def _ordered(self) -> BlockCounts:
        if self.min_blocks > self.max_blocks:
            raise ValueError("min_blocks must not exceed max_blocks")
        if self.init_blocks > self.max_blocks:
            raise ValueError("init_blocks must not exceed max_blocks")
        return self

    @property
    def nodes(self) -> int:
        return 1


class LocalProviderSpec(BlockCounts):
    """This machine, no scheduler: Parsl ``LocalProvider``; one block, one node."""

    kind: Literal["local"]
    init_blocks: int = Field(1, ge=0, le=1)
    min_blocks: int = Field(1, ge=0, le=1)
    max_blocks: int = Field(1, ge=1, le=1, description="A local site has one node: one block")


class BatchProviderSpec(BlockCounts):
    init_blocks: int = Field(0, ge=0, le=1_000)
    nodes_per_block: int = Field(1, ge=1, le=100_000)
    walltime: str = Field("01:00:00", description="Wall time of one block (the batch job), HH:MM:SS")
    account: str | None = Field(None, max_length=200)
    scheduler_options: str = Field("", max_length=20_000, description="Extra lines for the job script header")
    cmd_timeout_s: int = Field(30, ge=1, le=3_600, description="Timeout of sbatch/squeue/qsub/qstat calls")

    @field_validator("walltime")
    @classmethod
    def _walltime_format(cls, value: str) -> str:
        return _check_walltime(value)

    @property
    def nodes(self) -> int:
        return self.nodes_per_block


class SlurmProviderSpec(BatchProviderSpec):
    """Parsl ``SlurmProvider``: each block is one ``sbatch`` job of ``nodes_per_block`` nodes."""

    kind: Literal["slurm"]
    partition: str | None = Field(None, max_length=200)
    qos: str | None = Field(None, max_length=200)
    constraint: str | None = Field(None, max_length=200)
    cores_per_node: int | None = Field(None, ge=1, le=100_000)
    mem_per_node_gb: int | None = Field(None, ge=1, le=1_000_000)
    exclusive: bool = Field(True, description="Whole nodes per block (srun needs the CPUs of the block)")
    status_poll_s: int = Field(
        60,
        ge=1,
        le=3_600,
        description="Seconds between squeue calls on the site's blocks (Parsl's Slurm default: 60): how soon a "
        "block Slurm ended (a lost node, a requeue, a time limit) is noticed and replaced",
    )


class PBSProProviderSpec(BatchProviderSpec):
    """Parsl ``PBSProProvider``: each block is one ``qsub`` job of ``nodes_per_block`` chunks."""

    kind: Literal["pbspro"]
    queue: str | None = Field(None, max_length=200)
    cpus_per_node: int = Field(1, ge=1, le=100_000, description="ncpus of each select chunk")
    select_options: str = Field("", max_length=2_000, description="Added to each select chunk, e.g. 'mpiprocs=64'")


ProviderSpec = Annotated[LocalProviderSpec | SlurmProviderSpec | PBSProProviderSpec, Field(discriminator="kind")]


class MpiSpec(SiteModel):
    """How ranks start: Parsl's ``$PARSL_MPI_PREFIX`` for this launcher."""

    launcher: Literal["mpiexec", "srun"] = "mpiexec"
    launcher_options: str = Field(
        "", max_length=2_000, description="Added to every launch, e.g. '--mpi=pmi2' for srun with the pip MPICH"
    )


class ExecutorSpec(SiteModel):
    """Parsl ``MPIExecutor`` settings."""

    tasks_per_block: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Tasks at once in one block (default: max_tasks locally, nodes_per_block in batch)",
    )
    heartbeat_period_s: int = Field(30, ge=1, le=3_600)
    heartbeat_threshold_s: int = Field(
        120, ge=2, le=86_400, description="A worker pool that hears nothing this long exits (ends its block)"
    )
    max_idletime_s: float = Field(120.0, ge=0, le=86_400, description="Idle blocks above min_blocks end after this")
    strategy_period_s: float = Field(5.0, gt=0, le=3_600, description="How often Parsl decides to start or end blocks")
    # Blocks' worker pools connect back to the worker's interchange (inside the cluster, never to the service).
    address: str | None = Field(
        None, max_length=255, description="Address of the worker's host that compute nodes reach; default: probe all"
    )
    worker_port_range: tuple[int, int] | None = Field(
        None, description="Ports the interchange listens on for worker pools, [low, high]; default Parsl's 54000-55000"
    )
    encrypted: bool = Field(False, description="CurveZMQ-encrypt the interchange <-> worker pool traffic")

    @model_validator(mode="after")
    def _threshold(self) -> ExecutorSpec:
        if self.heartbeat_threshold_s <= self.heartbeat_period_s:
            raise ValueError("heartbeat_threshold_s must exceed heartbeat_period_s")
        if self.worker_port_range is not None:
            low, high = self.worker_port_range
            if not 1024 <= low < high <= 65535:
                raise ValueError("worker_port_range must be [low, high] with 1024 <= low < high <= 65535")
        return self


class RunnerSpec(SiteModel):
    """Settings of :mod:`worker.runner`, the program every task runs under."""

    kill_grace_s: float = Field(10.0, ge=0.1, le=600, description="SIGTERM to SIGKILL grace when a task is ended")
    liveness_timeout_s: float = Field(
        120.0,
        ge=1,
        le=86_400,
        description="A task whose worker stopped touching its liveness file this long ends itself",
    )
    preprocess_walltime_s: float = Field(
        3_600.0,
        ge=1,
        le=7 * 86_400,
        description="Wall-time limit of a plan build; a plan is shared by campaigns, so the site sets it, not a spec",
    )


class ProductsSpec(SiteModel):
    """Where a realisation's maps go: to the service, or kept in the site's storage (``products.maps``)."""

    maps: Literal["upload", "keep"] = Field(
        "upload",
        description="'upload': the maps (iqu, hits, rcond) go to the service with the spectra (one machine, small "
        "campaigns); 'keep': they stay in the site's store, the service records their path, size and sha256 and "
        "gets the site's partial sums for the mean and variance maps",
    )
    store: Path | None = Field(
        None, description="Folder of kept maps and partial sums (maps = 'keep'); default <data_dir>/products"
    )
    sums_interval_s: float = Field(
        300.0,
        ge=1,
        le=86_400,
        description="Shortest time between two sends of a campaign's partial sums (maps = 'keep'); the sums are also "
        "sent when the site's last task of the campaign ends and when the worker stops",
    )


class SiteConfig(SiteModel):
    """One site file."""

    name: str = Field(pattern=NAME_PATTERN, description="Site name: the service keys overlap plans by it")
    max_tasks: int = Field(1, ge=1, le=10_000, description="Tasks this worker runs at once (its claim capacity)")
    data_dir: Path | None = Field(
        None, description="Plans, products, work folders; default <MAPCAMPAIGN_DATA_DIR>/sites/<name>"
    )
    sky_root: Path | None = Field(None, description="Folder that sky.kind = 'map' paths are relative to")
    instrument_root: Path | None = Field(
        None,
        description="Folder that a spec's TOAST files (focal_plane.file, a schedule's file) are relative to; uploads "
        "the service keeps are fetched into its uploads/ when missing",
    )
    python: str | None = Field(None, description="Python on the nodes that run tasks; default: the worker's own")
    provider: ProviderSpec
    mpi: MpiSpec = Field(default_factory=MpiSpec)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    runner: RunnerSpec = Field(default_factory=RunnerSpec)
    products: ProductsSpec = Field(default_factory=ProductsSpec)

    @model_validator(mode="after")
    def _consistent(self) -> SiteConfig:
        if self.mpi.launcher == "srun" and self.provider.kind != "slurm":
            raise ValueError("mpi.launcher 'srun' needs provider.kind = 'slurm'")
        if self.max_tasks > self.tasks_per_block * self.provider.max_blocks:
            raise ValueError(
                f"max_tasks ({self.max_tasks}) exceeds executor.tasks_per_block x provider.max_blocks "
                f"({self.tasks_per_block} x {self.provider.max_blocks})"
            )
        if self.provider.kind != "local" and self.tasks_per_block > self.provider.nodes:
            raise ValueError(
                "executor.tasks_per_block must not exceed provider.nodes_per_block: each MPI task takes whole nodes"
            )
        return self

    @property
    def tasks_per_block(self) -> int:
        if self.executor.tasks_per_block is not None:
            return self.executor.tasks_per_block
        return self.max_tasks if self.provider.kind == "local" else self.provider.nodes

    @property
    def nodes_per_block(self) -> int:
        return self.provider.nodes


def _field_path(location: tuple[str | int, ...]) -> str:
    # Drop the discriminator tags pydantic inserts ("provider.slurm.partition" -> "provider.partition").
    parts = [str(part) for part in location if part not in ("local", "slurm", "pbspro")]
    return ".".join(parts) or "(file)"


def parse_site(data: dict, *, source: str = "site file", base_dir: Path | None = None) -> SiteConfig:
    """Validate site data; relative paths are taken relative to ``base_dir``. Raises :class:`SiteError`."""
    try:
        site = SiteConfig.model_validate(data)
    except ValidationError as error:
        problems = "\n".join(
            f"  {_field_path(item['loc'])}: {item['msg'].removeprefix('Value error, ')}" for item in error.errors()
        )
        raise SiteError(f"{source}: invalid site\n{problems}") from None
    updates: dict[str, Path | ProductsSpec] = {}
    for name in ("data_dir", "sky_root", "instrument_root"):
        value = getattr(site, name)
        if value is not None:
            updates[name] = _resolved(value, base_dir)
    if site.products.store is not None:
        updates["products"] = site.products.model_copy(update={"store": _resolved(site.products.store, base_dir)})
    return site.model_copy(update=updates) if updates else site


def _resolved(value: Path, base_dir: Path | None) -> Path:
    value = value.expanduser()
    if not value.is_absolute() and base_dir is not None:
        value = base_dir / value
    return value.resolve()


def load_site(path: str | Path) -> SiteConfig:
    """Read and validate a site TOML file. Raises :class:`SiteError` naming the file and the field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SiteError(f"{path}: no such site file (see deploy/sites/ for examples)") from None
    except OSError as error:
        raise SiteError(f"{path}: cannot read the site file: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise SiteError(f"{path}: not valid TOML: {error}") from None
    return parse_site(data, source=str(path), base_dir=path.resolve().parent)


SKY_MAP_SUFFIXES = (".fits", ".fit", ".fits.gz")


def declared_sky_maps(sky_root: Path | None) -> list[str] | None:
    """The FITS files under ``sky_root`` (relative POSIX paths, sorted), which the worker declares when it
    registers so that the service refuses at submit a spec naming another; None without a sky_root.

    Files whose real path leaves the root (a symlink out) are left out: the map-maker would refuse them.
    At most ``MAX_DECLARED_SKY_MAPS``, the first in sorted order.
    """
    if sky_root is None:
        return None
    root = sky_root.expanduser()
    if not root.is_dir():
        log.warning("sky_root %s is not a folder: no sky map is declared", root)
        return []
    real_root = root.resolve()
    found = []
    for folder, folders, files in os.walk(root):
        folders.sort()
        for name in files:
            if not name.lower().endswith(SKY_MAP_SUFFIXES):
                continue
            path = Path(folder) / name
            if not path.resolve().is_relative_to(real_root):
                continue
            relative = path.relative_to(root).as_posix()
            if len(relative) <= 255:
                found.append(relative)
    found.sort()
    if len(found) > MAX_DECLARED_SKY_MAPS:
        log.warning("sky_root %s holds %d maps: only the first %d are declared", root, len(found), MAX_DECLARED_SKY_MAPS)
    return found[:MAX_DECLARED_SKY_MAPS]
