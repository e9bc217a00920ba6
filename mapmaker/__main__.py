"""``python -m mapmaker``; under MPI use ``mpiexec -n P python -m mpi4py -m mapmaker ...``."""
import sys

from mapmaker.programs.cli import main

sys.exit(main())
