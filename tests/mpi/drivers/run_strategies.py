"""Run under mpiexec: realisation 0 of a spec once per reduction strategy, in one process start.

    mpiexec -n 2 python -m mpi4py tests/mpi/drivers/run_strategies.py SPEC OUT STRATEGY...

Each strategy goes through ``mapmaker.programs.realize.realize_to_folder``
(what ``python -m mapmaker realize`` runs) with ``solver.reduction`` set to
it, into ``OUT/STRATEGY``; the overlap plan is built in memory by each run.
"""
import sys
from pathlib import Path

from mpi4py import MPI

from mapmaker.programs.realize import realize_to_folder
from schemas.io import load_spec


def main() -> None:
    spec_path, out, strategies = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    spec = load_spec(spec_path)
    comm = MPI.COMM_WORLD
    for strategy in strategies:
        solver = spec.solver.model_copy(update={"reduction": strategy})
        realize_to_folder(spec.model_copy(update={"solver": solver}), 0, out / strategy, comm)
    if comm.Get_rank() == 0:
        print(f"strategies {', '.join(strategies)} done on {comm.Get_size()} ranks", flush=True)


if __name__ == "__main__":
    main()
