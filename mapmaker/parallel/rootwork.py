"""Work that runs on root alone, given the cores of every rank on root's node while the others wait without spinning.

Three steps of a realisation are one process's work: the sky synthesis (``healpy.alm2map``), the
mode-coupling build (pspy's Fortran ``calc_mcm_spin0and2_pure``, O(lmax^3)) and the spectra and
bandpowers (``map2alm`` with Jacobi iterations; pspy's spin-1 and spin-2 transforms through pixell and
ducc0). Each library threads its transforms over the cores it is given: healpy's and pspy's OpenMP
(libgomp, held by ``threadpoolctl``'s ``"openmp"`` limit), and ducc0's own pool under pixell, whose
``nthread`` pspy does not pass: pixell reads ``OMP_NUM_THREADS`` at each call (unset: every core the
process may run on), so root's work sets it for its duration (the worker exports the per-rank count
for the whole run). ducc0 caps that request at its pool's size, which it fixes when it is imported
from the same variable: a rank started with ``OMP_NUM_THREADS=1`` (every worker-launched run with one
thread per rank) would run root's transforms on one thread whatever pixell asks. So root's work also
resizes ducc0's pool to its cores (``ducc0.misc.resize_thread_pool``) and gives it back after: through
``mapcampaign up`` the products of a realisation on two cores took 14.6-15.4 s at nside 512 without it and
10.6-10.9 s with it, 98-107 s and 62-66 s at nside 1024 (docs/results/campaign-up.md). So these steps are threaded,
not distributed: one rank runs them with the node's cores, and the result is the same computation as on
one process, changed only by the order of the threads' sums (round-off).

Why threads and not ranks: a HEALPix transform has no MPI form in these libraries (ducc0 and healpy
are shared-memory only), and the bandpower pieces are a handful of unequal transforms that would
balance over two or three ranks at most; the coupling build is once per mask (cached in the
``--coupling`` file). Threads on root's node give each of them every core of that node, whatever
the rank count. Ranks on other nodes wait (their cores idle for these steps).

Waiting without spinning: MPICH polls in a blocking collective, so a rank waiting in ``bcast`` keeps
its core busy and the threads of root run on fewer cores than they count. Here the others post an
``Ibarrier`` and test it with a growing sleep (0.1 ms doubling to 20 ms), which costs them no core and
root at most 20 ms at the end.

Cores given to root: ``threads`` (per rank) times the ranks on root's node
(``Split_type(COMM_TYPE_SHARED)``), at most ``os.cpu_count()``. Root must be free to run on them:
launch without binding each rank to one core (``srun --cpu-bind=none``, or bind to sockets).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from mpi4py import MPI
from threadpoolctl import threadpool_limits

T = TypeVar("T")

FIRST_PAUSE_S = 1e-4  # the first sleep of a waiting rank; doubled at each test
LONGEST_PAUSE_S = 0.02  # the longest: how late at most a waiting rank notices that root is done
OMP_VARIABLE = "OMP_NUM_THREADS"


def ranks_on_root_node(comm: MPI.Comm) -> int:
    """Collective: the number of ranks of ``comm`` that share root's node (its shared-memory group)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        size = node.Get_size()
    finally:
        node.Free()
    return int(comm.bcast(size, root=0))


def root_cores(comm: MPI.Comm, threads: int) -> int:
    """Collective: the cores root uses for its own work: ``threads`` x ranks on its node, at most the machine's."""
    return max(1, min(max(1, threads) * ranks_on_root_node(comm), os.cpu_count() or 1))


def wait_quietly(request: MPI.Request) -> None:
    """Complete ``request`` by testing it between sleeps of growing length (no core held while waiting)."""
    pause = FIRST_PAUSE_S
    while not request.Test():
        time.sleep(pause)
        pause = min(2.0 * pause, LONGEST_PAUSE_S)


def on_root_with_node_cores(comm: MPI.Comm, work: Callable[[], T], *, threads: int) -> T | None:
    """Collective: ``work()`` on root with :func:`root_cores` threads for OpenMP, BLAS and ducc0; its value there, None elsewhere.

    The other ranks wait in an ``Ibarrier`` (:func:`wait_quietly`). An exception of ``work`` is raised on
    root after the barrier is reached, so the others go on to the next collective (where a program's
    ``comm.Abort`` guard ends the run) instead of hanging here.
    """
    cores = root_cores(comm, threads)
    if comm.Get_rank() != 0:
        wait_quietly(comm.Ibarrier())
        return None
    # ducc0 loaded already has the pool it was imported with (module doc); loaded by the work, it takes the
    # OMP_NUM_THREADS set here. Not imported here: the numpy kernels' path runs without it.
    ducc0 = sys.modules.get("ducc0")
    ducc0_pool = ducc0.misc.thread_pool_size() if ducc0 is not None else 0
    exported = os.environ.get(OMP_VARIABLE)
    os.environ[OMP_VARIABLE] = str(cores)  # pixell's ducc0 transforms under pspy (module doc)
    if ducc0 is not None:
        ducc0.misc.resize_thread_pool(cores)
    try:
        with threadpool_limits(limits={"openmp": cores, "blas": cores}):
            return work()
    finally:
        if ducc0 is not None:
            ducc0.misc.resize_thread_pool(ducc0_pool)
        if exported is None:
            del os.environ[OMP_VARIABLE]
        else:
            os.environ[OMP_VARIABLE] = exported
        comm.Ibarrier().Wait()  # the others are all in the barrier already
