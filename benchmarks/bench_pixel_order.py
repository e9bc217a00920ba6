#!/usr/bin/env python3
"""Sorted against visit-order pixel rows: the PCG operator and a whole PCG iteration, side by side.

    .venv/bin/python benchmarks/bench_pixel_order.py --json FILE
    .venv/bin/python benchmarks/bench_pixel_order.py --problems 24e6:512,24e6:1024 --ranks 1,2 --rounds 7

With the compiled kernels ``build_local_data`` numbers a rank's local pixels in the order its samples first
visit them when the local map is larger than ``VISIT_ORDER_MIN_LOCAL_PIXELS`` (``pixel_order="auto"``,
:mod:`mapmaker.solve.local_data`): P and P^T then gather and scatter within few cache lines, and every
operator application pays two row permutations (sorted order in and out). This script builds ``mapmaker
bench``'s synthetic satellite scan (``--problems SAMPLES:NSIDE``, split over ``--ranks`` ranks under
mpiexec as ``realize`` splits it, one thread each) twice, with rows sorted and in visit order, and times in
alternating rounds (``--rounds``, CPU clock: a shared machine's other work counts less; the slowest rank's
time) ``apply_operator`` (``P^T N^-1 P``, permutations included) and ``mapmaker bench``'s block of PCG
iterations (operator, block-diagonal preconditioner, Allreduce reduction, dot products). Printed per problem
and rank count: samples per local pixel and the local map's MiB (rank 0), the median of each, and visit over
sorted.

This is a benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, print_json_on_root, run_ranks_json, write_json

ORDERS = ("sorted", "visit")


def measure(samples: int, nside: int, rounds: int) -> dict:
    """Under mpiexec: operator and PCG-iteration seconds (best, median and worst round; slowest rank) of both
    row orders on one problem."""
    import numpy as np
    from mpi4py import MPI

    from mapmaker.kernels import implementation
    from mapmaker.model.decomposition import chunk_layout, decompose
    from mapmaker.model.noise import NoiseModel
    from mapmaker.programs import bench
    from mapmaker.solve.local_data import build_local_data

    bench.clock = bench.CLOCKS["cpu"]  # the PCG blocks' clock, as `mapmaker bench --clock cpu`
    spec = bench.bench_spec(samples, nside)
    layout = chunk_layout(spec)
    comm = MPI.COMM_WORLD
    chunks = decompose(layout, comm.Get_size()).chunks_of(comm.Get_rank())
    noise = NoiseModel(spec, layout)
    implementation.warm_up("fast")
    kernels = implementation.get("fast")
    operators, blocks = {}, {}
    for order in ORDERS:
        local = build_local_data(spec, layout, chunks, noise, "fast", pixel_order=order)
        tod = np.random.default_rng(0).standard_normal(local.n_samples)
        blocks[order] = bench.PCGBlock(comm, kernels, spec, local, tod, 1)
        direction = np.random.default_rng(1).standard_normal((local.n_local, 3))
        operators[order] = (local, direction, np.empty_like(direction))

    def apply(order: str) -> float:
        local, direction, out = operators[order]
        comm.Barrier()
        start = time.process_time()
        local.apply_operator(direction, out=out)
        return comm.allreduce(time.process_time() - start, op=MPI.MAX)

    operator_seconds: dict[str, list[float]] = {order: [] for order in ORDERS}
    for r in range(rounds):
        for order in ORDERS if r % 2 == 0 else reversed(ORDERS):
            operator_seconds[order].append(apply(order))
    iteration_seconds = {order: [s for s, _ in runs] for order, runs in bench.interleaved_rounds(blocks, rounds).items()}
    n_local = operators["sorted"][0].n_local
    figures: dict = {"samples": samples, "nside": nside, "ranks": comm.Get_size(), "local_pixels": n_local,
                     "samples_per_local_pixel": operators["sorted"][0].n_samples / n_local, "map_mib": 24 * n_local / 2**20}
    for name, seconds in (("operator", operator_seconds), ("pcg_iteration", iteration_seconds)):
        figures[name] = {order: {"best": min(values), "median": statistics.median(values), "worst": max(values)}
                         for order, values in seconds.items()}
        figures[name]["visit_over_sorted_median"] = figures[name]["visit"]["median"] / figures[name]["sorted"]["median"]
    return figures


def print_table(problems: list[dict]) -> None:
    print(f"{'samples':>12}{'nside':>7}{'ranks':>6}{'local px':>11}{'per px':>8}{'map MiB':>9}"
          f"{'operator sorted / visit ms (median)':>38}{'ratio':>7}{'PCG iteration sorted / visit ms':>34}{'ratio':>7}")
    for p in problems:
        op, it = p["operator"], p["pcg_iteration"]
        print(f"{p['samples']:>12,}{p['nside']:>7}{p['ranks']:>6}{p['local_pixels']:>11,}{p['samples_per_local_pixel']:>8.1f}"
              f"{p['map_mib']:>9.1f}{op['sorted']['median'] * 1e3:>26.1f} / {op['visit']['median'] * 1e3:<9.1f}"
              f"{op['visit_over_sorted_median']:>7.3f}{it['sorted']['median'] * 1e3:>22.1f} / "
              f"{it['visit']['median'] * 1e3:<9.1f}{it['visit_over_sorted_median']:>7.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", default="1e6:256,3e6:256,12e6:256,6e6:512,24e6:512,24e6:1024",
                        help="SAMPLES:NSIDE, comma-separated (default: 1e6:256 ... 24e6:1024)")
    parser.add_argument("--ranks", default="1", help="rank counts, comma-separated, each under mpiexec (default 1)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds per order (default 7)")
    parser.add_argument("--worker", nargs=2, metavar=("SAMPLES", "NSIDE"), help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.worker:
        print_json_on_root(measure(int(float(args.worker[0])), int(args.worker[1]), args.rounds))
        return 0
    problems = []
    for problem in args.problems.split(","):
        samples, _, nside = problem.partition(":")
        for ranks in (int(r) for r in args.ranks.split(",")):
            problems.append(run_ranks_json(ranks, __file__, "--worker", samples, nside, "--rounds", str(args.rounds)))
    if args.json != "-":
        print_table(problems)
    write_json(args.json, {"clock": "cpu", "threads": 1, "problems": problems})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
