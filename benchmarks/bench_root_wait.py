"""What the ranks waiting for root cost it: a blocking ``bcast`` (MPICH polls) against :mod:`mapmaker.parallel.rootwork`.

    .venv/bin/python benchmarks/bench_root_wait.py --ranks 2 --json FILE

Under ``mpiexec -n R`` root runs ``--repeat`` iterated ``healpy.map2alm`` (3 Jacobi iterations, IQU, nside
``--nside``) with the OpenMP threads of every rank on its node, while the others wait, alternately (A, B,
A, B) in a plain ``comm.bcast`` and in :func:`mapmaker.parallel.rootwork.on_root_with_node_cores`'s
``Ibarrier`` tested between sleeps. Reported per way of waiting: root's seconds per transform and the
CPU seconds the waiting ranks burnt (``time.process_time``, the largest over them). This is a benchmark,
not a test; on a shared machine compare the two ways as ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, run_ranks_json, write_json


def run_ranks_here(args: argparse.Namespace) -> dict:
    """Under mpiexec: the alternating rounds; root's figures (an empty dict elsewhere)."""
    import healpy as hp
    import numpy as np
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    from mapmaker.parallel.rootwork import on_root_with_node_cores, root_cores

    comm = MPI.COMM_WORLD
    cores = root_cores(comm, 1)
    iqu = np.random.default_rng(1).standard_normal((3, hp.nside2npix(args.nside)))

    def transform() -> float:
        started = time.perf_counter()
        hp.map2alm(iqu, lmax=3 * args.nside - 1, iter=3)
        return time.perf_counter() - started

    def spinning() -> float | None:
        seconds = None
        if comm.Get_rank() == 0:
            with threadpool_limits(limits={"openmp": cores}):
                seconds = transform()
        comm.bcast(None, root=0)
        return seconds

    ways = {"bcast": spinning, "rootwork": lambda: on_root_with_node_cores(comm, transform, threads=1)}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, float] = dict.fromkeys(ways, 0.0)
    for _ in range(args.repeat):
        for name, way in ways.items():
            comm.Barrier()
            started = time.process_time()
            value = way()
            cpu[name] += time.process_time() - started
            if value is not None:
                seconds[name].append(value)
    waiting_cpu = comm.gather(cpu, root=0)
    if comm.Get_rank() != 0:
        return {}
    assert waiting_cpu is not None
    return {
        "nside": args.nside, "ranks": comm.Get_size(), "root_threads": cores, "repeat": args.repeat,
        "ways": [
            {
                "wait": name,
                "root_seconds_per_transform": sum(seconds[name]) / len(seconds[name]),
                "waiting_cpu_seconds_per_transform": max(rank[name] for rank in waiting_cpu[1:]) / args.repeat
                if len(waiting_cpu) > 1 else 0.0,
            }
            for name in ways
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks under mpiexec (default 2)")
    parser.add_argument("--nside", type=int, default=256, help="the transform's nside (default 256)")
    parser.add_argument("--repeat", type=int, default=4, help="rounds of each way of waiting (default 4)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.worker:
        figures = run_ranks_here(args)
        if figures:
            print(json.dumps(figures))
        return 0
    figures = run_ranks_json(args.ranks, __file__, "--worker", "--nside", str(args.nside), "--repeat", str(args.repeat))
    if args.json != "-":
        for way in figures["ways"]:
            print(f"{way['wait']:>9}: root {way['root_seconds_per_transform']:.2f} s per transform "
                  f"({figures['root_threads']} threads), waiting ranks {way['waiting_cpu_seconds_per_transform']:.2f} CPU s")
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
