"""Run under mpiexec: realisations FIRST .. LAST - 1 of a spec, one after another, on all ranks.

    mpiexec -n 2 python -m mpi4py tests/mpi/drivers/run_realizations.py SPEC OUT FIRST LAST

Each realisation goes through ``mapmaker.programs.realize.realize_to_folder``, exactly
what ``python -m mapmaker realize`` runs, into ``OUT/rNNNN``; one process
start serves a whole Monte Carlo set (the interpreter and library start-up
would otherwise cost more than these tiny solves).
"""
import sys
from pathlib import Path

from mpi4py import MPI

from mapmaker.programs.realize import realize_to_folder
from schemas.io import load_spec


def main() -> None:
    spec_path, out, first, last = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    spec = load_spec(spec_path)
    comm = MPI.COMM_WORLD
    for realization in range(first, last):
        target = out / f"r{realization:04d}"
        if comm.Get_rank() == 0 and target.exists():
            raise SystemExit(f"{target} exists")
        realize_to_folder(spec, realization, target, comm)
    if comm.Get_rank() == 0:
        print(f"realisations {first}..{last - 1} done on {comm.Get_size()} ranks", flush=True)


if __name__ == "__main__":
    main()
