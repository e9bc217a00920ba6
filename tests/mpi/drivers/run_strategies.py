"""Run under mpiexec: realisation 0 of a spec once per reduction strategy, in one process start.

    mpiexec -n 2 python -m mpi4py tests/mpi/drivers/run_strategies.py SPEC OUT STRATEGY... [--plan PLAN STRATEGY...]

Each strategy goes through ``mapmaker.programs.realize.realize_to_folder``
(what ``python -m mapmaker realize`` runs) with ``solver.reduction`` set to
it, into ``OUT/STRATEGY``. The strategies before ``--plan`` build the overlap
plan in memory; those after it read the plan file PLAN, loaded and checked
for each run as ``mapmaker realize --plan`` does.
"""
import sys
from pathlib import Path

from mpi4py import MPI

from mapmaker.parallel.planfile import load_plan
from mapmaker.programs.preprocess import plan_identity
from mapmaker.programs.realize import realize_to_folder
from schemas.io import load_spec


def main() -> None:
    spec_path, out, rest = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    plan_path = None
    if "--plan" in rest:
        at = rest.index("--plan")
        rest, plan_path, planned = rest[:at], rest[at + 1], rest[at + 2:]
    else:
        planned = []
    spec = load_spec(spec_path)
    comm = MPI.COMM_WORLD
    for strategy in [*rest, *planned]:
        solver = spec.solver.model_copy(update={"reduction": strategy})
        run_spec = spec.model_copy(update={"solver": solver})
        plan, plan_document = None, None
        if strategy in planned:
            plan, plan_document = load_plan(comm, plan_path, plan_identity(run_spec, comm.Get_size()))
        realize_to_folder(run_spec, 0, out / strategy, comm, plan=plan, plan_document=plan_document)
    if comm.Get_rank() == 0:
        print(f"strategies {', '.join(rest + planned)} done on {comm.Get_size()} ranks", flush=True)


if __name__ == "__main__":
    main()
