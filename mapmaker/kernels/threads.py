"""Threads per rank: one setting for numba, the FFT thread pool, BLAS and OpenMP.

The paper's hybrid runs (MADmap, ICS 2011, section 3.4) use one MPI rank per
socket with as many threads as it has cores, instead of one rank per core.
Here a rank's thread count T sets

* numba's thread count (the ``prange`` loops of the fast kernels),
* the thread pool that runs N^-1 and the fused ``P^T N^-1 P`` over
  stationary intervals (the FFTs release the GIL), and
* the BLAS and OpenMP pools (OpenBLAS; the libgomp of healpy and pspy, whose
  threads spin-wait and run the spectra ten times slower on a busy machine),
  held to T with threadpoolctl, so that 2 ranks on a 2-core machine do not
  each start 2 threads. threadpoolctl holds the libraries loaded when
  :func:`configure` runs: the map-maker's modules import healpy and pspy at
  their top, before the command configures its threads.

With T = 1 (one rank per core) nothing runs in a second thread. Numba cannot
use more threads than ``NUMBA_NUM_THREADS`` (by default the machine's cores),
fixed when numba starts; a larger T is clamped for numba and honoured by the
pool.
"""
from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

from threadpoolctl import threadpool_limits

_pools: dict[int, ThreadPoolExecutor] = {}
_limits = None
_configured = 1


def configure(threads: int, numba_threads: bool = True) -> int:
    """Use ``threads`` threads in this process from now on; returns the numba thread count set (0: numba untouched).

    ``numba_threads=False`` leaves numba alone (and unimported: its runtime
    takes ~30 MiB), for the numpy kernels.
    """
    global _limits, _configured
    threads = max(1, int(threads))
    set_for_numba = 0
    if numba_threads:
        import numba  # deferred: ~0.5 s and ~30 MiB (-X importtime), which numpy-kernel runs never pay

        # numba sets its config attributes through globals() at import, which its typing does not show
        set_for_numba = min(threads, numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
        numba.set_num_threads(set_for_numba)
    if _limits is not None:
        _limits.restore_original_limits()
    _limits = threadpool_limits(limits={"blas": threads, "openmp": threads})
    _configured = threads
    return set_for_numba


def configured() -> int:
    """The thread count of the last :func:`configure` (1 before any)."""
    return _configured


def pool(threads: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``threads`` workers (made once per size, kept for the process)."""
    if threads not in _pools:
        _pools[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mapmaker")
    return _pools[threads]


def balanced_groups(lengths, groups: int) -> list[range]:
    """Split items ``0 .. len(lengths) - 1`` into at most ``groups`` contiguous ranges of similar total length."""
    n = len(lengths)
    groups = max(1, min(groups, n))
    total = float(sum(lengths))
    bounds, running, target = [0], 0.0, total / groups
    for i, length in enumerate(lengths):
        running += length
        if len(bounds) < groups and running >= target * len(bounds) and i + 1 < n:
            bounds.append(i + 1)
    bounds.append(n)
    return [range(a, b) for a, b in itertools.pairwise(bounds) if b > a]
