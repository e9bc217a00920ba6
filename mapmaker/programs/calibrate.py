"""``python -m mapmaker calibrate``: measure alpha and beta of this site's MPI, per operation the model uses.

Under ``mpiexec -n P`` (P >= 2), each measurement is the median over
``repeat`` trials of the mean time of a loop of calls, after a warm-up:

1. point-to-point ping-pong between ranks 0 and 1 (others wait): half the
   round trip, fitted to alpha + n beta;
2. ``Allreduce`` of n doubles: fitted to 2 lg p alpha + 2 n 8 (p - 1) / p beta
   (Rabenseifner, as the model counts it);
3. ``Alltoallv`` with n doubles to every other rank: fitted to
   (p - 1) alpha + 8 n (p - 1) beta, the model's per-rank form;
4. ``Allgatherv`` of n int32 pixel ids per rank: lg p alpha + 4 n (p - 1) beta;
5. the sift: seconds per received id of :class:`mapmaker.parallel.overlap.OverlapSifter`;
6. ``Neighbor_alltoallv`` over a distributed graph joining every rank to
   every other (``reorder=True``), n doubles per neighbour: fitted like the
   Alltoallv, (p - 1) alpha + 8 n (p - 1) beta;
7. the pairwise exchange in XOR order (``Sendrecv`` with rank XOR s, s = 1 ..
   P - 1), n doubles per partner: the same form. Measured beside the
   library's Alltoallv (3.) because which wins depends on the machine
   (seed 002's transposition study); the model then chooses.

The fits are least squares of the relative residuals (weights 1/t, so that
the small messages that fix alpha count as much as the large ones that fix
beta); intercept -> alpha, slope -> beta; a negative intercept is refitted
through the origin and alpha set to 0.
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from mapmaker.parallel.overlap import OverlapSifter
from mapmaker.programs.versions import mpi_library
from schemas.calibration import OperationFit, SiteCalibration

P2P_BYTES = (8, 64, 512, 4096, 32768, 262144, 2097152)
COLLECTIVE_DOUBLES = (1, 64, 1024, 16384, 131072, 524288)


def _timed(comm, call, repeat: int, inner: int) -> float:
    """Median over ``repeat`` trials of the mean seconds per call (slowest rank's view, via a barrier)."""
    call()
    trials = []
    for _ in range(repeat):
        comm.Barrier()
        start = MPI.Wtime()
        for _ in range(inner):
            call()
        elapsed = (MPI.Wtime() - start) / inner
        trials.append(comm.allreduce(elapsed, op=MPI.MAX))
    return statistics.median(trials)


def _inner(nbytes: int) -> int:
    return int(max(3, min(200, 2e6 / max(nbytes, 1))))


def fit(points: Sequence[tuple[float, float]], latency_factor: float, bandwidth_factor: float, formula: str) -> OperationFit:
    """Weighted least squares t = a + b x (weights 1/t); alpha = a / latency_factor, beta = b / bandwidth_factor."""
    x = np.array([p[0] for p in points], dtype=np.float64)
    t = np.array([p[1] for p in points], dtype=np.float64)
    weights = 1.0 / np.maximum(t, 1e-12)
    slope, intercept = np.polyfit(x, t, 1, w=weights)
    if intercept < 0:
        slope, intercept = float(np.dot(x * weights**2, t) / np.dot(x * weights**2, x)), 0.0
    predicted = intercept + slope * x
    total = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - float(((t - predicted) ** 2).sum()) / total if total > 0 else None  # unweighted, in seconds
    return OperationFit(
        alpha_s=max(intercept, 0.0) / latency_factor,
        beta_s_per_byte=max(slope, 0.0) / bandwidth_factor,
        formula=formula,
        r2=r2,
        points=[[float(a), float(b)] for a, b in points],
    )


def measure_sift(seconds: float = 0.5) -> float:
    """Seconds per received id of the preprocessing sift (a 2**16-pixel range, 8 sources)."""
    rng = np.random.default_rng(0)
    npix, size = 1 << 16, 8
    local = np.unique(rng.integers(0, npix, npix // 4)).astype(np.int64)
    pieces = [np.unique(rng.integers(0, npix, npix // 4)) for _ in range(size)]
    ids = np.concatenate(pieces).astype(np.int32)
    lengths = np.array([len(p) for p in pieces])
    sifter = OverlapSifter(1, size, npix, local)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or done == 0:
        sifter.start_range(0, npix)
        sifter.sift(ids, np.arange(size), lengths)
        sifter.finish_range()
        done += len(ids)
    return (time.perf_counter() - started) / done


def run_calibration(comm, *, repeat: int = 7, site: str = "local", progress=None) -> SiteCalibration | None:
    """Collective: every measurement and fit; the calibration on rank 0, None elsewhere."""
    rank, size = comm.Get_rank(), comm.Get_size()
    say = progress if (progress is not None and rank == 0) else (lambda message: None)
    if size < 2:
        raise ValueError("calibrate measures communication: run it under mpiexec with at least 2 ranks")
    load = list(os.getloadavg())
    lg = math.ceil(math.log2(size))

    # 1. ping-pong, ranks 0 and 1.
    p2p = []
    for nbytes in P2P_BYTES:
        buffer = np.zeros(nbytes, dtype=np.uint8)

        def ping(buffer=buffer):
            if rank == 0:
                comm.Send(buffer, dest=1, tag=7)
                comm.Recv(buffer, source=1, tag=7)
            elif rank == 1:
                comm.Recv(buffer, source=0, tag=7)
                comm.Send(buffer, dest=0, tag=7)

        p2p.append((nbytes, _timed(comm, ping, repeat, _inner(nbytes)) / 2))
    say(f"ping-pong: {len(p2p)} sizes")

    # 2. Allreduce.
    allreduce = []
    for n in COLLECTIVE_DOUBLES:
        data = np.ones(n)
        seconds = _timed(comm, lambda data=data: comm.Allreduce(MPI.IN_PLACE, data, op=MPI.SUM), repeat, _inner(8 * n))
        allreduce.append((2.0 * n * 8 * (size - 1) / size, seconds))
    say(f"Allreduce: {len(allreduce)} sizes")

    # 3. Alltoallv, n doubles to every other rank.
    alltoallv = []
    for n in COLLECTIVE_DOUBLES:
        counts = np.full(size, n, dtype=np.int32)
        counts[rank] = 0
        displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
        send, recv = np.ones(int(counts.sum())), np.empty(int(counts.sum()))

        def exchange(send=send, recv=recv, counts=counts, displacements=displacements):
            comm.Alltoallv([send, counts, displacements, MPI.DOUBLE], [recv, counts, displacements, MPI.DOUBLE])

        alltoallv.append((8.0 * n * (size - 1), _timed(comm, exchange, repeat, _inner(8 * n * size))))
    say(f"Alltoallv: {len(alltoallv)} sizes")

    # 4. Allgatherv of int32 ids.
    allgather = []
    for n in COLLECTIVE_DOUBLES:
        mine = np.arange(n, dtype=np.int32)
        counts = np.full(size, n, dtype=np.int32)
        displacements = (np.arange(size) * n).astype(np.int32)
        recv = np.empty(n * size, dtype=np.int32)

        def gather(mine=mine, recv=recv, counts=counts, displacements=displacements):
            comm.Allgatherv([mine, MPI.INT32_T], [recv, counts, displacements, MPI.INT32_T])

        allgather.append((4.0 * n * (size - 1), _timed(comm, gather, repeat, _inner(4 * n * size))))
    say(f"Allgatherv: {len(allgather)} sizes")

    # 6. Neighbor_alltoallv on the complete graph.
    others = [r for r in range(size) if r != rank]
    graph = comm.Create_dist_graph_adjacent(others, others, reorder=True)
    neighbor = []
    for n in COLLECTIVE_DOUBLES:
        counts = np.full(size - 1, n, dtype=np.int32)
        displacements = (np.arange(size - 1) * n).astype(np.int32)
        send, recv = np.ones(n * (size - 1)), np.empty(n * (size - 1))

        def neighbourhood(send=send, recv=recv, counts=counts, displacements=displacements):
            graph.Neighbor_alltoallv([send, counts, displacements, MPI.DOUBLE], [recv, counts, displacements, MPI.DOUBLE])

        neighbor.append((8.0 * n * (size - 1), _timed(comm, neighbourhood, repeat, _inner(8 * n * size))))
    graph.Free()
    say(f"Neighbor_alltoallv: {len(neighbor)} sizes")

    # 7. pairwise exchange in XOR order.
    steps = 1 << (size - 1).bit_length()
    pairwise = []
    for n in COLLECTIVE_DOUBLES:
        send, recv = np.ones(n), np.empty(n)

        def exchange_pairs(send=send, recv=recv):
            for step in range(1, steps):
                partner = rank ^ step
                if partner < size:
                    comm.Sendrecv([send, MPI.DOUBLE], dest=partner, sendtag=9, recvbuf=[recv, MPI.DOUBLE],
                                  source=partner, recvtag=9)

        pairwise.append((8.0 * n * (size - 1), _timed(comm, exchange_pairs, repeat, _inner(8 * n * size))))
    say(f"pairwise XOR: {len(pairwise)} sizes")

    # 5. the sift, on every rank at once (as in a real build), the slowest rank's figure.
    sift = comm.allreduce(measure_sift(), op=MPI.MAX)
    if rank != 0:
        return None
    return SiteCalibration(
        site=site,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        host=socket.gethostname(),
        ranks=size,
        mpi=mpi_library(),
        load_average=load,
        p2p=fit(p2p, 1.0, 1.0, "alpha + n beta (half the ping-pong round trip, n bytes)"),
        allreduce=fit(allreduce, 2 * lg, 1.0, "2 ceil(log2 p) alpha + 2 n (p - 1) / p beta (n bytes)"),
        alltoallv=fit(alltoallv, size - 1, 1.0, "(p - 1) alpha + beta * bytes sent per rank"),
        allgather=fit(allgather, max(lg, 1), 1.0, "ceil(log2 p) alpha + beta * bytes received per rank"),
        sift_s_per_id=sift,
        neighbor=fit(neighbor, size - 1, 1.0, "(p - 1) alpha + beta * bytes sent per rank (Neighbor_alltoallv)"),
        pairwise=fit(pairwise, size - 1, 1.0, "(p - 1) alpha + beta * bytes sent per rank (XOR Sendrecv)"),
    )
