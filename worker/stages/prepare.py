"""The prepare stage: where a task's files go, whether it can run here, its work folder, and what to submit.

:func:`place` fixes, at the claim, every path of the task at this site (a :data:`Placement`);
:func:`precheck` says whether the site can run it at all; :func:`prepare` makes a fresh work
folder and returns what the run stage hands to Parsl (a :class:`PreparedTask`).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from schemas.api import PreprocessTask, RealizeTask
from schemas.programs import (
    LIVENESS_FILE,
    PLAN_REPORT_SUFFIX,
    SPEC_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    mapmaker_preprocess_args,
    mapmaker_realize_args,
)
from schemas.spec import coarse_key, coupling_key
from worker.commands import RunnerLimits, bash_command, runner_args, task_resource_specification
from worker.layout import SiteLayout, remove_entry
from worker.outcome import Outcome, Verdict
from worker.site import SiteConfig


@dataclass(frozen=True)
class RealizePlacement:
    """A realize task at this site: the plan it reads and the product folder it writes."""

    task: RealizeTask
    workdir: Path  # spec, runner files, stdout/stderr
    marker: str  # tags every process of the task (worker.runner)
    out: Path  # the attempt's product folder, made by the map-maker (``--out``)
    plan_file: Path | None  # the plan the service named; None when it named no path
    coupling_file: Path | None = None  # the site's coupling of the campaign's scan pattern and products settings
    coarse_file: Path | None = None  # the site's coarse operator (two-level preconditioner only)

    def describe(self) -> str:
        task = self.task
        return (
            f"{task.task_id} (campaign {task.campaign_id} realisation {task.realization} "
            f"attempt {task.attempt}, {task.spec.resources.ranks} ranks)"
        )


@dataclass(frozen=True)
class PreprocessPlacement:
    """A preprocess task at this site: the plan file it builds and the report beside it."""

    task: PreprocessTask
    workdir: Path
    marker: str
    plan_file: Path
    report_file: Path  # ``mapmaker preprocess --report``

    def describe(self) -> str:
        task = self.task
        return f"{task.task_id} (plan {task.plan_id} build {task.build_attempt}, {task.ranks} ranks)"


Placement = RealizePlacement | PreprocessPlacement


def place(task: PreprocessTask | RealizeTask, layout: SiteLayout, *, marker_prefix: str) -> Placement:
    """Where the task's files are at this site (nothing is touched on disk)."""
    workdir = layout.work_dir(task.task_id)
    marker = f"{marker_prefix}:{task.task_id}"
    if isinstance(task, PreprocessTask):
        plan_file = layout.plan_file(
            scan_key=task.scan_key, ranks=task.ranks, plan_id=task.plan_id, build=task.build_attempt
        )
        return PreprocessPlacement(
            task=task,
            workdir=workdir,
            marker=marker,
            plan_file=plan_file,
            report_file=plan_file.with_name(plan_file.name + PLAN_REPORT_SUFFIX),
        )
    return RealizePlacement(
        task=task,
        workdir=workdir,
        marker=marker,
        out=layout.product_dir(task.campaign_id, task.realization, task.attempt),
        plan_file=Path(task.plan.path) if task.plan.path else None,
        coupling_file=layout.coupling_file(coupling_key(task.spec)),
        coarse_file=(
            layout.coarse_file(coarse_key(task.spec)) if task.spec.solver.preconditioner != "block-diagonal" else None
        ),
    )


@dataclass(frozen=True)
class PreparedTask:
    """What the prepare stage made: a fresh work folder holding the spec, and what to hand to Parsl."""

    command: str  # the bash_app's command line (worker.commands.bash_command)
    resource_specification: dict[str, int | str]  # Parsl's parsl_resource_specification
    stdout: Path
    stderr: Path


def precheck(placement: Placement, site: SiteConfig) -> Verdict | None:
    """A verdict when the task cannot run at this site at all; None when it may be launched."""
    resources = placement.task.spec.resources
    if resources.nodes > site.nodes_per_block:
        return Verdict(
            Outcome.LAUNCH_ERROR,
            None,
            f"the task needs {resources.nodes} nodes; blocks of site {site.name!r} have {site.nodes_per_block}",
        )
    if isinstance(placement, RealizePlacement):
        named = placement.task.plan.path
        try:
            present = placement.plan_file is not None and placement.plan_file.is_file()
        except OSError as error:  # e.g. a folder of another user's data_dir this worker may not enter
            return Verdict(
                Outcome.PLAN_REFUSED,
                None,
                f"plan refused: the plan file {named!r} cannot be read at this site: {error}",
            )
        if not present:
            return Verdict(Outcome.PLAN_REFUSED, None, f"plan refused: the plan file {named!r} is missing at this site")
    return None


def runner_limits(placement: Placement, site: SiteConfig) -> RunnerLimits:
    """What the runner enforces: the task's wall time (a site-wide one for preprocessing), grace, liveness."""
    runner = site.runner
    if isinstance(placement, PreprocessPlacement):
        walltime_s = runner.preprocess_walltime_s
    else:
        walltime_s = placement.task.spec.resources.walltime_s
    return RunnerLimits(
        walltime_s=walltime_s, grace_s=runner.kill_grace_s, liveness_timeout_s=runner.liveness_timeout_s
    )


def task_command(placement: Placement, site: SiteConfig, *, python: str) -> str:
    """The bash_app's command: the runner around ``python -m mpi4py -m mapmaker preprocess|realize ...``."""
    spec_file = placement.workdir / SPEC_FILE
    threads = placement.task.spec.resources.threads_per_rank
    if isinstance(placement, PreprocessPlacement):
        program = mapmaker_preprocess_args(
            python, spec_file=spec_file, out=placement.plan_file, report=placement.report_file,
            instrument_root=site.instrument_root,
        )
    else:
        program = mapmaker_realize_args(
            python,
            spec_file=spec_file,
            realization=placement.task.realization,
            out=placement.out,
            threads=threads,
            plan_file=placement.plan_file,
            sky_root=site.sky_root,
            instrument_root=site.instrument_root,
            coupling_file=placement.coupling_file,
            coarse_file=placement.coarse_file,
        )
    runner = runner_args(
        python, workdir=placement.workdir, marker=placement.marker, limits=runner_limits(placement, site)
    )
    return bash_command(runner=runner, program=program, threads=threads)


def prepare(placement: Placement, site: SiteConfig, *, python: str) -> PreparedTask:
    """Make a fresh work folder with the spec, clear what an earlier incarnation may have left, say what to run.

    The service handed this task to this worker and it holds the lease, so anything
    already at the task's own paths (work folder, product folder, plan file) is stale.
    """
    workdir = placement.workdir
    if workdir.exists():
        remove_entry(workdir)
    workdir.mkdir(parents=True)
    (workdir / SPEC_FILE).write_text(placement.task.spec.model_dump_json(indent=1) + "\n")
    (workdir / LIVENESS_FILE).touch()
    if isinstance(placement, RealizePlacement):
        out = placement.out
        out.parent.mkdir(parents=True, exist_ok=True)
        for shared in (placement.coupling_file, placement.coarse_file):
            if shared is not None:
                shared.parent.mkdir(parents=True, exist_ok=True)
        if out.exists() or out.is_symlink():
            stale = out.with_name(f".{out.name}.stale-{uuid.uuid4().hex[:8]}")
            os.rename(out, stale)  # out of the way at once, however long the removal takes
            remove_entry(stale)
    else:
        placement.plan_file.parent.mkdir(parents=True, exist_ok=True)
        for path in (placement.plan_file, placement.report_file):
            path.unlink(missing_ok=True)
    mpi = site.mpi
    return PreparedTask(
        command=task_command(placement, site, python=python),
        resource_specification=task_resource_specification(
            placement.task.spec.resources, launcher=mpi.launcher, launcher_options=mpi.launcher_options
        ),
        stdout=workdir / STDOUT_FILE,
        stderr=workdir / STDERR_FILE,
    )
