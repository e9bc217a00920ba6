"""Run under mpiexec: a failure only rank 0 meets (writing the report) ends every rank, none waits for ever.

argv: SPEC FOLDER. Rank 0's report write is made to fail (ENOSPC) after the plan is
written; every rank must then raise that OSError from run_preprocess. Prints
"report failure reached N ranks" from rank 0.
"""
import errno
import sys
from pathlib import Path

from mpi4py import MPI

from mapmaker.programs import preprocess
from schemas.io import load_spec


def main() -> None:
    comm = MPI.COMM_WORLD
    spec_path, folder = Path(sys.argv[1]), Path(sys.argv[2])

    def disk_full(path, data, *, indent=1):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    preprocess.atomic_write_json = disk_full
    try:
        preprocess.run_preprocess(load_spec(spec_path), folder / "plan.bin", comm, report_path=folder / "report.json")
    except OSError as error:
        failed = error.errno == errno.ENOSPC
    else:
        failed = False
    everyone = comm.gather(failed, root=0)
    if comm.Get_rank() == 0:
        assert all(everyone), everyone
        print(f"report failure reached {comm.Get_size()} ranks")


main()
