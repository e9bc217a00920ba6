"""Benchmark of the pixel reductions: exact bytes, measured time per iteration, and the model's projection.

    .venv/bin/python benchmarks/bench_reductions.py                      # nside 128 and 256, 2 and 4 ranks
    .venv/bin/python benchmarks/bench_reductions.py --nsides 128,256,512 --calibration site.json --json out.json

For a satellite and a ground scan (the bundled examples' geometry) at each
nside and rank count, under ``mpiexec``: the overlap plan is built (phase
times), then every strategy reduces 3 values per pixel ``--repeat`` times;
reported are the bytes and messages each rank hands to MPI per call (max
over ranks, exact) and the median over calls of the slowest rank's seconds.
The bytes are checked against the alpha-beta model's figures.

Then the model projects a Planck-like scan (``benchmarks/specs/projection.toml``:
1 rpm at 85 degrees, no precession, 1 degree per day, one year) to 256 ..
16384 ranks with the paper's Franklin figures (8.15 us, 1.65 GB/s) and with
this site's calibration (``--calibration FILE``, or measured here with
``calibrate`` on 4 ranks). Nothing here is a test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
from mpi4py import MPI

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._support import run_ranks, run_ranks_json
from mapmaker.kernels import implementation
from mapmaker.kernels import preconditioner as reference_blocks
from mapmaker.model.decomposition import chunk_layout, decompose
from mapmaker.model.noise import NoiseModel
from mapmaker.parallel import commodel
from mapmaker.parallel.distributed import DistributedPixels
from mapmaker.parallel.overlap import build_overlap_plan
from mapmaker.parallel.overlap_model import (
    chunk_sets,
    overlap_figures,
    rank_pixel_sets,
    relative_error,
)
from mapmaker.parallel.reduction import make_reduction
from mapmaker.programs.preprocess import overlap_statistics, rank_local_pixels
from mapmaker.solve.local_data import build_local_data
from mapmaker.solve.solver import pcg
from schemas.io import load_spec
from schemas.spec import STRATEGY_NAMES

STRATEGIES = STRATEGY_NAMES
# The whole PCG iteration (operator, reduction, dots, preconditioner) of these: what overlap is for.
ITERATION_STRATEGIES = ("allreduce", "alltoallv", "alltoallv-overlap", "neighbor", "neighbor-overlap")
PCG_ITERATIONS = 4
PROJECTION_SPEC = REPO / "benchmarks" / "specs" / "projection.toml"


def scan_specs(nside: int) -> dict[str, dict]:
    """The two benchmark scans at ``nside``: the bundled satellite (1 day) and ground (12 h) geometries."""
    specs = {}
    for kind in ("satellite", "ground"):
        data = tomllib.loads((REPO / "schemas" / "examples" / f"{kind}.toml").read_text())
        data["pixelization"] = {"nside": nside}
        data["solver"] = {"reduction": "auto"}
        specs[kind] = data
    return specs


# --------------------------------------------------------------------------- the MPI worker


def worker(spec_path: str, repeat: int, calibration: str | None) -> None:
    """Under mpiexec: plan, then time every strategy; rank 0 prints one JSON line."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    spec = load_spec(spec_path)
    machine = commodel.load_machine(calibration) if calibration else commodel.FRANKLIN
    buffer_pixels = spec.solver.allreduce_buffer_pixels
    npix = spec.pixelization.npix
    local_pixels = rank_local_pixels(spec, comm)
    comm.Barrier()
    started = MPI.Wtime()
    plan = build_overlap_plan(comm, local_pixels, npix, buffer_pixels)
    build = comm.allreduce(MPI.Wtime() - started, op=MPI.MAX)
    phases = {name: comm.allreduce(seconds, op=MPI.MAX) for name, seconds in plan.timings.items()}
    statistics_ = overlap_statistics(comm, plan)
    figures = commodel.figures_from_plan(comm, plan)
    modeled = commodel.strategy_costs(figures, machine, k=3, buffer_pixels=buffer_pixels)
    rng = np.random.default_rng(rank)
    base = rng.standard_normal((len(local_pixels), 3))
    strategies = {}
    for name in STRATEGIES:
        reduction = make_reduction(
            name, comm, local_pixels, npix=npix, buffer_pixels=buffer_pixels, plan=plan, machine=machine,
            workload=commodel.Workload.of_spec(spec),
        )
        for _ in range(2):  # warm-up
            reduction.reduce(base.copy())
        times = []
        for _ in range(repeat):
            values = base.copy()
            comm.Barrier()
            tick = MPI.Wtime()
            reduction.reduce(values)
            times.append(comm.allreduce(MPI.Wtime() - tick, op=MPI.MAX))
        counted = np.array(comm.allgather(reduction.bytes_sent), dtype=np.float64)
        messages = np.array(comm.allgather(reduction.messages_sent), dtype=np.float64)
        model = (
            commodel.hybrid_cost(figures, machine, reduction.threshold, k=3, buffer_pixels=buffer_pixels)
            if name == "hybrid" else modeled[name]
        )
        strategies[name] = {
            "bytes_max": float(counted.max()),
            "bytes_mean": float(counted.mean()),
            "messages_max": float(messages.max()),
            "seconds_median": statistics.median(times),
            "seconds_min": min(times),
            "modeled_bytes_max": model.bytes_max,
            "modeled_seconds": model.seconds,
            "bytes_equal_model": bool(counted.max() == model.bytes_max and counted.mean() == model.bytes_mean),
            **(reduction.details or {}),
        }
    strategies["alltoallv"]["datatype_seconds_median"] = datatype_exchange(comm, local_pixels, plan, base, repeat)
    iterations = pcg_iterations(comm, spec, local_pixels, plan, machine)
    if rank == 0:
        print(json.dumps({
            "ranks": comm.Get_size(),
            "pcg_iteration_seconds": iterations,
            "npix": npix,
            "samples": spec.total_samples,
            "plan_build_s": build,
            "phases": phases,
            "overlap": json.loads(statistics_.model_dump_json()),
            "strategies": strategies,
        }))


def datatype_exchange(comm, local_pixels, plan, base: np.ndarray, repeat: int) -> float:
    """Median seconds of the Alltoallv's exchange with MPI derived datatypes instead of hand packing.

    One ``Alltoallw`` whose send type per neighbour is an indexed-block type
    (blocks of k doubles at the shared rows) over the map itself; the
    receive side stays contiguous (the rows are added, not stored). The sums
    are checked against the hand-packed ``alltoallv``.
    """
    reference = make_reduction("alltoallv", comm, local_pixels, npix=plan.npix, buffer_pixels=1 << 16, plan=plan)
    k, size = base.shape[1], comm.Get_size()
    send_types, recv_types = [], []
    zeros = np.zeros(size, dtype=np.int64)
    for j in range(size):
        rows = reference.index[reference.offsets[j] : reference.offsets[j] + reference.counts[j]]
        kind = MPI.DOUBLE.Create_indexed_block(k, (rows * k).astype(np.int64).tolist()).Commit() if len(rows) else MPI.DOUBLE
        send_types.append(kind)
        recv_types.append(MPI.DOUBLE)
    send_counts = (reference.counts > 0).astype(np.int64)  # one indexed block type per neighbour
    recv_counts = reference.counts * k
    recv_displacements = reference.offsets * k * 8  # bytes
    received = np.empty((len(reference.index), k))

    def exchange(values):
        comm.Alltoallw([values, send_counts, zeros, send_types], [received, recv_counts, recv_displacements, recv_types])
        reference._add(values, received)

    values = base.copy()
    exchange(values)
    expected = base.copy()
    reference.reduce(expected)
    np.testing.assert_allclose(values, expected, rtol=1e-13, atol=1e-13 * max(1.0, float(np.abs(expected).max())))
    times = []
    for _ in range(repeat):
        values = base.copy()
        comm.Barrier()
        tick = MPI.Wtime()
        exchange(values)
        times.append(comm.allreduce(MPI.Wtime() - tick, op=MPI.MAX))
    for kind in send_types:
        if kind != MPI.DOUBLE:
            kind.Free()
    return statistics.median(times)


def pcg_iterations(comm, spec, local_pixels, plan, machine) -> dict[str, dict[str, float]]:
    """Seconds per PCG iteration (slowest rank, best of 3 blocks of PCG_ITERATIONS) per strategy.

    The realize solve's loop: the overlap variants start their exchange
    half-way through P^T (:meth:`LocalData.apply_operator_overlapped`); the
    blocking ones apply the fused operator, then reduce.
    """
    layout = chunk_layout(spec)
    chunks = decompose(layout, comm.Get_size()).chunks_of(comm.Get_rank())
    implementation.warm_up(implementation.DEFAULT)
    local = build_local_data(spec, layout, chunks, NoiseModel(spec, layout), implementation.DEFAULT)
    if not np.array_equal(local.local_pixels, local_pixels):
        raise AssertionError("the solve's pixels are not the plan's")
    npix, buffer_pixels = spec.pixelization.npix, spec.solver.allreduce_buffer_pixels
    pixels = DistributedPixels(comm, local_pixels, npix, buffer_pixels, owner=plan.owner)
    blocks = local.accumulate_blocks(noise_weighted=True)
    make_reduction("allreduce", comm, local_pixels, npix=npix, buffer_pixels=buffer_pixels).reduce(blocks)
    keep = reference_blocks.rcond(blocks) > 1e-3
    inverse = reference_blocks.invert(blocks, keep)
    local.exclude_pixels(~keep)
    b = np.random.default_rng(comm.Get_rank()).standard_normal((local.n_local, 3))
    make_reduction("allreduce", comm, local_pixels, npix=npix, buffer_pixels=buffer_pixels).reduce(b)
    kernels = implementation.get(implementation.DEFAULT)
    out = {}
    for name in ITERATION_STRATEGIES:
        reduction = make_reduction(name, comm, local_pixels, npix=npix, buffer_pixels=buffer_pixels, plan=plan,
                                   machine=machine)
        product, preconditioned = np.empty_like(b), np.empty_like(b)
        split = local.operator_split(reduction.shared_rows) if reduction.overlaps else None

        def apply_matrix(direction, reduction=reduction, product=product, split=split):
            if split is None:
                return reduction.reduce(local.apply_operator(direction, out=product))
            local.apply_operator_overlapped(direction, split, reduction.start, out=product)
            return reduction.finish()

        def run(apply_matrix=apply_matrix, preconditioned=preconditioned):
            return pcg(apply_matrix, lambda r: kernels.blocks.apply(inverse, r, out=preconditioned), pixels.dot, b,
                       tol=1e-300, max_iter=PCG_ITERATIONS)

        run()  # warm-up
        blocks_s = []
        for _ in range(3):
            comm.Barrier()
            tick = MPI.Wtime()
            result = run()
            blocks_s.append(comm.allreduce(MPI.Wtime() - tick, op=MPI.MAX) / PCG_ITERATIONS)
        out[name] = {"seconds_per_iteration": min(blocks_s), "residual": result.residual_history[-1]}
        if split is not None:
            out[name]["private_samples_fraction"] = comm.allreduce(split.private_fraction, op=MPI.MIN)
    for name, twin in (("alltoallv-overlap", "alltoallv"), ("neighbor-overlap", "neighbor")):
        out[name]["gain_vs_blocking"] = out[twin]["seconds_per_iteration"] / out[name]["seconds_per_iteration"]
    return out


# --------------------------------------------------------------------------- driver



def measure(nsides: list[int], rank_counts: list[int], repeat: int, calibration: str | None) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for nside in nsides:
            for kind, data in scan_specs(nside).items():
                path = Path(folder) / f"{kind}-{nside}.json"
                path.write_text(json.dumps(data))
                for ranks in rank_counts:
                    extra = ["--calibration", calibration] if calibration else []
                    row = run_ranks_json(ranks, __file__, "--worker", str(path), "--repeat", str(repeat), *extra)
                    row.update({"scan": kind, "nside": nside, "load": os.getloadavg()[0]})
                    rows.append(row)
                    print(f"measured {kind} nside {nside} on {ranks} ranks", file=sys.stderr, flush=True)
    return rows


def project(rank_counts: list[int], machines: dict, time_step: int) -> dict:
    """The projection spec's figures at each rank count, evaluated for every machine."""
    spec = load_spec(PROJECTION_SPEC)
    workload = commodel.Workload.of_spec(spec)
    started = time.perf_counter()
    sets = chunk_sets(spec, time_step)
    out = {"spec": str(PROJECTION_SPEC.relative_to(REPO)), "pointing_s": time.perf_counter() - started,
           "time_step": time_step, "npix": spec.pixelization.npix, "projections": []}
    for size in rank_counts:
        tick = time.perf_counter()
        figures = overlap_figures(rank_pixel_sets(sets, size), spec.pixelization.npix)
        entry = {
            "ranks": size,
            "n_local_max": int(figures.n_local.max()),
            "total_local": figures.total_local,
            "observed": int(figures.histogram[1:].sum()),
            "shared_max": int(figures.shared.max()),
            "neighbours_max": int(figures.neighbours.max()),
            "neighbours_exact": figures.neighbours_exact,
            "machines": {},
        }
        for label, machine in machines.items():
            costs = commodel.strategy_costs(figures, machine, k=3, buffer_pixels=workload.buffer_pixels)
            pre = commodel.preprocessing_cost(figures, machine, workload.buffer_pixels)
            entry["machines"][label] = {
                "preprocessing_s": pre["total_s"],
                "chosen": commodel.select_strategy(figures, machine, workload).chosen,
                "strategies": {
                    name: {"bytes_max": c.bytes_max, "messages_max": c.messages_max, "seconds": c.seconds, **c.details}
                    for name, c in costs.items()
                },
            }
        entry["model_s"] = time.perf_counter() - tick
        out["projections"].append(entry)
        print(f"projected {size} ranks in {entry['model_s']:.0f} s", file=sys.stderr, flush=True)
    return out


def subsampling_error(rank_counts: list[int], steps: list[int]) -> list[dict]:
    """Error of the model with --time-step N against the exact one (projection spec, small rank counts)."""
    spec = load_spec(PROJECTION_SPEC)
    npix = spec.pixelization.npix
    exact_sets = chunk_sets(spec, 1)
    out = []
    for size in rank_counts:
        exact = overlap_figures(rank_pixel_sets(exact_sets, size), npix)
        exact_cost = commodel.strategy_costs(exact, commodel.FRANKLIN)
        for step in steps:
            approximate = overlap_figures(rank_pixel_sets(chunk_sets(spec, step), size), npix)
            cost = commodel.strategy_costs(approximate, commodel.FRANKLIN)
            error = relative_error(exact, approximate)
            error.update({
                f"seconds_{name}": abs(cost[name].seconds - exact_cost[name].seconds) / exact_cost[name].seconds
                for name in STRATEGIES
            })
            out.append({"ranks": size, "time_step": step, **error})
            print(f"subsampling: {size} ranks, time step {step}", file=sys.stderr, flush=True)
    return out


def print_tables(rows: list[dict], projection: dict | None) -> None:
    if not rows and projection is None:
        return
    print("| scan | nside | ranks | n_local max | shared max | strategy | bytes/iter (max rank) | msgs | "
          "measured ms/iter | bytes / allreduce |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for row in rows:
        base = row["strategies"]["allreduce"]["bytes_max"]
        for name in STRATEGIES:
            s = row["strategies"][name]
            tag = f" (tau {s['threshold']:.0f}, {s['heavy_pixels']:.0f} heavy)" if name == "hybrid" else ""
            print(
                f"| {row['scan']} | {row['nside']} | {row['ranks']} | {row['overlap']['local_pixels']['max']:.0f} | "
                f"{row['overlap']['shared_pixels']['max']:.0f} | {name}{tag} | {s['bytes_max']:.0f} | "
                f"{s['messages_max']:.0f} | {1e3 * s['seconds_median']:.2f} | {s['bytes_max'] / base:.3f} |"
            )
    print("\nWhole PCG iterations (operator, reduction, dots, preconditioner), ms per iteration, slowest rank:")
    print("| scan | nside | ranks | " + " | ".join(ITERATION_STRATEGIES) + " | overlap gain (alltoallv, neighbor) | "
          "private samples | alltoallv hand-packed / derived datatypes ms |")
    print("|---|---:|---:|" + "---:|" * len(ITERATION_STRATEGIES) + "---|---:|---|")
    for row in rows:
        it = row["pcg_iteration_seconds"]
        cells = " | ".join(f"{1e3 * it[name]['seconds_per_iteration']:.1f}" for name in ITERATION_STRATEGIES)
        a = row["strategies"]["alltoallv"]
        print(f"| {row['scan']} | {row['nside']} | {row['ranks']} | {cells} | {it['alltoallv-overlap']['gain_vs_blocking']:.3f}, "
              f"{it['neighbor-overlap']['gain_vs_blocking']:.3f} | {it['alltoallv-overlap']['private_samples_fraction']:.2f} | "
              f"{1e3 * a['seconds_median']:.2f} / {1e3 * a['datatype_seconds_median']:.2f} |")
    if projection is None:
        return
    labels = list(projection["projections"][0]["machines"])
    print(f"\nProjection of {projection['spec']} ({projection['npix']} pixels), seconds per iteration (k = 3):")
    print("| ranks | n_local max | n_all / observed | machine | allreduce | alltoallv | butterfly | hybrid | "
          "best speedup | auto |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for entry in projection["projections"]:
        for label in labels:
            m = entry["machines"][label]["strategies"]
            best = min(m[s]["seconds"] for s in STRATEGIES[1:])
            hybrid = f"{m['hybrid']['seconds']:.3g} (tau {m['hybrid']['threshold']:.0f})"
            print(
                f"| {entry['ranks']} | {entry['n_local_max']} | {entry['total_local'] / entry['observed']:.1f} | {label} | "
                f"{m['allreduce']['seconds']:.3g} | {m['alltoallv']['seconds']:.3g} | {m['butterfly']['seconds']:.3g} | "
                f"{hybrid} | {m['allreduce']['seconds'] / best:.1f}x | {entry['machines'][label]['chosen']} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--nsides", default="128,256", help="comma-separated nsides (default 128,256; '' for none)")
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per strategy (default 30)")
    parser.add_argument("--calibration", default=None, help="site calibration file (default: measure one on 4 ranks)")
    parser.add_argument("--project", default="256,1024,4096,16384", help="rank counts of the projection ('' for none)")
    parser.add_argument("--time-step", type=int, default=1, help="time step of the projection's pointing (default 1)")
    parser.add_argument("--subsampling", default="", metavar="STEPS",
                        help="also measure the model's error with these time steps, e.g. 2,4 (at 256 and 1024 ranks)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write every figure here")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.repeat, args.calibration)
        return 0

    load = os.getloadavg()
    calibration = args.calibration
    if calibration is None and (args.nsides or args.project):
        calibration = str(Path(tempfile.mkdtemp()) / "calibration.json")
        run_ranks(4, "-m", "mapmaker", "calibrate", "--out", calibration, "--repeat", "7")
    machine = commodel.load_machine(calibration) if calibration else commodel.FRANKLIN
    nsides = [int(n) for n in args.nsides.split(",")] if args.nsides else []
    rows = measure(nsides, [int(r) for r in args.ranks.split(",")], args.repeat, calibration)
    projection = None
    if args.project:
        machines = {"Franklin": commodel.FRANKLIN, "this machine": machine}
        projection = project([int(r) for r in args.project.split(",")], machines, args.time_step)
    errors = subsampling_error([256, 1024], [int(n) for n in args.subsampling.split(",")]) if args.subsampling else []
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end {os.getloadavg()[0]:.2f}")
    print_tables(rows, projection)
    if errors:
        print("\nModel with --time-step N against the exact model (max over ranks of |error| / max exact; time: Franklin):")
        print("| ranks | time step | n_local | shared | neighbours | butterfly rows | time: alltoallv | butterfly | hybrid |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for e in errors:
            print(f"| {e['ranks']} | {e['time_step']} | {e['n_local']:.3f} | {e['shared']:.3f} | {e['neighbours']:.3f} | "
                  f"{e['butterfly']:.3f} | {e['seconds_alltoallv']:.3f} | {e['seconds_butterfly']:.3f} | "
                  f"{e['seconds_hybrid']:.3f} |")
    if args.json:
        recorded = json.loads(Path(calibration).read_text()) if calibration else None
        Path(args.json).write_text(json.dumps({"load": load, "calibration": recorded,
                                               "measured": rows, "projection": projection,
                                               "subsampling": errors}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
