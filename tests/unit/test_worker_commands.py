"""Command builders: the map-maker and runner command lines, the bash line around them, resource specifications."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from schemas.programs import mapmaker_preprocess_args, mapmaker_realize_args
from schemas.spec import ResourceSpec
from worker.commands import (
    RunnerLimits,
    bash_command,
    resource_specification,
    runner_args,
    task_resource_specification,
)

PY = "/venv/bin/python"


def test_realize_and_preprocess_arguments():
    args = mapmaker_realize_args(
        PY, spec_file=Path("/w/spec.json"), realization=7, out=Path("/d/attempt-2"), threads=4,
        plan_file=Path("/d/plans/p.plan"), sky_root=Path("/skies"),
    )  # fmt: skip
    assert args[:6] == [PY, "-m", "mpi4py", "-m", "mapmaker", "realize"]
    assert args[6:] == [
        "--spec", "/w/spec.json", "--realization", "7", "--out", "/d/attempt-2", "--threads", "4",
        "--plan", "/d/plans/p.plan", "--sky-root", "/skies",
    ]  # fmt: skip
    plain = mapmaker_realize_args(
        PY, spec_file=Path("s"), realization=0, out=Path("o"), threads=1, plan_file=None, sky_root=None
    )
    assert "--plan" not in plain and "--sky-root" not in plain and "--coupling" not in plain
    coupled = mapmaker_realize_args(
        PY, spec_file=Path("s"), realization=0, out=Path("o"), threads=1, plan_file=None, sky_root=None,
        coupling_file=Path("/d/couplings/c.npz"),
    )  # fmt: skip
    assert coupled[-2:] == ["--coupling", "/d/couplings/c.npz"]
    assert "--coarse-cache" not in coupled
    coarse = mapmaker_realize_args(
        PY, spec_file=Path("s"), realization=0, out=Path("o"), threads=1, plan_file=None, sky_root=None,
        coarse_file=Path("/d/coarse/k.npz"),
    )  # fmt: skip
    assert coarse[-2:] == ["--coarse-cache", "/d/coarse/k.npz"]
    assert mapmaker_preprocess_args(PY, spec_file=Path("s.json"), out=Path("p.plan"), report=Path("p.json"))[5:] == [
        "preprocess", "--spec", "s.json", "--out", "p.plan", "--report", "p.json",
    ]  # fmt: skip



def test_the_instrument_root_goes_to_both_programs():
    """A site's instrument_root reaches realize and preprocess: both read a spec's focal-plane file."""
    realize = mapmaker_realize_args(
        PY, spec_file=Path("s"), realization=0, out=Path("o"), threads=1, plan_file=None, sky_root=None,
        instrument_root=Path("/data/instruments"),
    )  # fmt: skip
    preprocess = mapmaker_preprocess_args(
        PY, spec_file=Path("s"), out=Path("p"), report=Path("r"), instrument_root=Path("/data/instruments")
    )
    for args in (realize, preprocess):
        assert args[-2:] == ["--instrument-root", "/data/instruments"]
    assert "--instrument-root" not in mapmaker_preprocess_args(PY, spec_file=Path("s"), out=Path("p"), report=Path("r"))


def test_runner_arguments():
    limits = RunnerLimits(walltime_s=600.0, grace_s=2.5, liveness_timeout_s=30.0)
    args = runner_args(PY, workdir=Path("/w/t 1"), marker="local:w:abc:realize-3", limits=limits)
    assert args == [
        PY, "-m", "worker.runner", "--workdir", "/w/t 1", "--marker", "local:w:abc:realize-3",
        "--walltime-s", "600", "--grace-s", "2.5", "--liveness-timeout-s", "30",
    ]  # fmt: skip
    assert "--liveness-timeout-s" not in runner_args(PY, workdir=Path("w"), marker="m", limits=RunnerLimits(1, 1, None))


def test_bash_command_quotes_everything_but_the_mpi_prefix(tmp_path):
    runner = ["/venv/bin/python", "-m", "worker.runner", "--workdir", str(tmp_path / "it's here")]
    program = ["/venv/bin/python", "-c", "print('a b')"]
    command = bash_command(runner=runner, program=program, threads=3)
    lines = command.splitlines()
    assert lines[0] == "export OMP_NUM_THREADS=3"
    assert lines[1] == f"exec {shlex.join(runner)} -- $PARSL_MPI_PREFIX {shlex.join(program)}"
    # Run it with echo in place of exec's target: the prefix splits into words, the rest stays whole.
    probe = command.replace("exec ", "printf '<%s>' ", 1)
    done = subprocess.run(
        ["bash", "-c", probe + "; echo; echo $OMP_NUM_THREADS"],
        env={"PARSL_MPI_PREFIX": "mpiexec -n 2 -ppn 2 -hosts vm", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    words = done.stdout.splitlines()[0]
    assert "<--><mpiexec><-n><2><-ppn><2><-hosts><vm></venv/bin/python><-c><print('a b')>" in words
    assert f"<{tmp_path / 'it'}" in words and "s here>" in words
    assert done.stdout.splitlines()[1] == "3"


@pytest.mark.parametrize(
    "ranks, per_node, launcher, options, threads, expected",
    [
        (2, None, "mpiexec", "", 1, {"num_nodes": 1, "ranks_per_node": 2, "num_ranks": 2}),
        (8, 4, "mpiexec", "", 1, {"num_nodes": 2, "ranks_per_node": 4, "num_ranks": 8}),
        (6, 4, "mpiexec", "", 1, {"num_nodes": 2, "ranks_per_node": 4, "num_ranks": 6}),
        (2, 8, "mpiexec", "-bind-to core", 1, {"num_nodes": 1, "ranks_per_node": 2, "num_ranks": 2, "launcher_options": "-bind-to core"}),
        (4, None, "srun", "--mpi=pmi2", 1, {"num_nodes": 1, "ranks_per_node": 4, "num_ranks": 4, "launcher_options": "--mpi=pmi2"}),
        (
            4, 2, "srun", "--mpi=pmi2", 8,
            {"num_nodes": 2, "ranks_per_node": 2, "num_ranks": 4, "launcher_options": "--mpi=pmi2 --cpus-per-task=8"},
        ),
        (1, None, "mpiexec", "", 4, {"num_nodes": 1, "ranks_per_node": 1, "num_ranks": 1}),
    ],
)  # fmt: skip
def test_resource_specification(ranks, per_node, launcher, options, threads, expected):
    spec = resource_specification(
        ranks=ranks, ranks_per_node=per_node, threads=threads, launcher=launcher, launcher_options=options
    )
    assert spec == expected
    resources = ResourceSpec(ranks=ranks, ranks_per_node=per_node, threads_per_rank=threads)
    assert task_resource_specification(resources, launcher=launcher, launcher_options=options) == expected
    assert spec["num_nodes"] == resources.nodes
