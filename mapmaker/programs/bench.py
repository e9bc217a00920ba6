"""``python -m mapmaker bench``: throughput of the kernels and of a PCG iteration, against the memory floor.

A synthetic satellite scan (4 detectors at 100 Hz, 1-hour chunks and
stationary intervals, 1/f noise) with ``--samples`` samples per rank. Every
kernel runs ``--repeat`` times on every rank for each implementation
(``numpy``, the reference, and ``fast``); the best time of the slowest rank
is kept, and the figure printed is samples per second per core = samples
per rank / (time x threads per rank). The PCG iteration is timed in
``--rounds`` blocks of ``PCG_ITERATIONS`` iterations, the implementations
taking turns, so that a slow spell of a shared machine falls on both: the
table keeps each one's best block, and a last line gives each one's median
and range and the median and range of the per-round speed-up (on the
machines of this project the reference's own time moved by up to 1.6x
from run to run, which made a single best-of ratio a lottery).

Memory-bandwidth floor. In the same run each rank measures a STREAM-like
triad ``a = b + s c`` (numba, its T threads, all ranks at once, arrays far
larger than the caches): the bandwidth one rank gets while the whole
configuration runs. Each kernel's floor is the time to move the bytes it
*must* move per sample at that bandwidth, and the table prints the measured
time over that floor (1.0 = at the hardware limit). The triad reads two
streams for each one it writes; P and P^T read and write about as a copy
does, so each floor is given twice: against the triad and against this
core's copy rate (``np.copyto``, memcpy, measured the same way), which is
the higher and the honest yardstick of a one-read-one-write kernel; the
table also prints the must-move bytes per second achieved. Bytes per sample, the
minimum each kernel must read and write from memory (maps and one
interval's buffer are assumed to stay in cache; write-allocate reads not
counted, as STREAM does not count them):

==================  =====  =====================================================
kernel              bytes  what
==================  =====  =====================================================
pointing            16     write the cache: local index (int32) + 3 float32 weights
P                   24     read index + weights (16), write the TOD (8)
P^T                 24     read the TOD (8), index + weights (16)
N^-1                16     read and write the TOD once, in place
PCG iteration       16     read index + weights once: a fully fused operator whose TOD
                           never leaves the cache. Both implementations move ~64 (P, N^-1
                           and P^T as passes over a TOD array or a per-thread batch buffer,
                           index + weights read twice): see mapmaker.kernels.operator_fast
==================  =====  =====================================================

These are lower bounds, not the traffic. Not counted: the read that
allocates each line of P's TOD before it is written (8 bytes a sample; the
copy's ``memcpy`` writes with streaming stores and skips it), and the map
rows a scan misses in cache: on the bench's scan (nside 256, 13 MiB of
local map, 2 MiB of L2) one sample in four starts a new row, and the row
comes from L3 or memory (``benchmarks/bench_projection_limits.py`` times
P and P^T on the scan, on an L1-resident map and on random rows).

Compute floor. N^-1 is bound by the FFTs, not by memory: the bench also
prints the flop rate of the N^-1 FFTs (2 transforms of ``2.5 n log2 n``
flops per n-sample interval, the usual real-FFT count) and, as the
yardstick, the in-cache double-precision rate of a numba FMA loop (8 fused
multiply-adds per element on an L1-resident array, vectorised).

Serial or under ``mpiexec -n P python -m mpi4py -m mapmaker bench``.
``--spec FILE`` benchmarks a campaign's own observation instead (its scan,
detectors, pixelisation and noise intervals, split over the ranks as
``realize`` splits them).
``--hybrid CORES`` runs every ranks x threads split of CORES cores (2x1
and 1x2 on 2 cores) under mpiexec and prints the per-iteration calc/comm
split in core-seconds, as in the paper's Figure 4.

P and P^T run on the solver's own pixel rows (``build_local_data``'s
``pixel_order="auto"``: visit order above
``VISIT_ORDER_MIN_LOCAL_PIXELS`` local pixels with the compiled kernels,
sorted rows otherwise -- at the default 12M samples and nside 256,
549,788 local pixels, visit order), and the report says which
(``pixel_rows``); P^T adds into a kept map, as the PCG operator's scatter
does, rather than into fresh pages.

This is a benchmark, not a test: nothing here asserts on time.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from campaignlib.instrument import resolve_files
from mapmaker.kernels import implementation
from mapmaker.kernels import preconditioner as reference_blocks
from mapmaker.kernels import threads as threading
from mapmaker.model.decomposition import chunk_layout, decompose
from mapmaker.model.noise import NoiseModel
from mapmaker.model.scan import ChunkPointing
from mapmaker.parallel.distributed import DistributedPixels
from mapmaker.parallel.reduction import make_reduction
from mapmaker.solve.local_data import VISIT_ORDER_MIN_LOCAL_PIXELS, build_local_data
from mapmaker.solve.solver import pcg
from schemas.io import load_spec
from schemas.spec import CampaignSpec

SAMPLE_RATE_HZ = 100.0
DETECTORS = 4
PCG_ITERATIONS = 5
STREAM_ELEMENTS = 1 << 25  # 3 arrays of 256 MiB per rank (64 MiB for tiny runs): far beyond the 32 MiB L3

BYTES_PER_SAMPLE = {
    "pointing": 16,  # the default cache (solver.pointing = "cached"): int32 index, float32 weights
    "P": 24,
    "P^T": 24,
    "N^-1": 16,
    "PCG iteration": 16,
}


def bench_spec(total_samples: int, nside: int) -> CampaignSpec:
    duration = max(2.0, total_samples / (SAMPLE_RATE_HZ * DETECTORS))
    detectors = [
        {"name": f"D{i}", "offset_x_deg": (-1.0) ** (i // 2), "pol_angle_deg": 45.0 * i} for i in range(DETECTORS)
    ]
    return CampaignSpec.model_validate(
        {
            "name": "bench",
            "kind": "noise-only",
            "scan": {"kind": "satellite", "duration_s": duration, "chunk_s": min(3600.0, duration),
                     "drift_deg_per_day": 360.0},
            "focal_plane": {"sample_rate_hz": SAMPLE_RATE_HZ, "detectors": detectors},
            "pixelization": {"nside": nside},
            "sky": {"kind": "none"},
            "noise": {"net_k_sqrt_s": 50e-6, "f_knee_hz": 0.1, "alpha": 1.0, "f_min_hz": 1e-4},
        }
    )


# The clock of every timing: wall time, or with --clock cpu the CPU time of the process (all its
# threads), which leaves out the time other work on a shared machine takes the cores away.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def _best_of(comm, repeat: int, operation: Callable[[], object]) -> float:
    """Best over ``repeat`` runs of the slowest rank's time (s) on ``clock``."""
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        start = clock()
        operation()
        elapsed = comm.allreduce(clock() - start, op=MPI.MAX)
        best = min(best, elapsed)
    return best


def stream_triad(comm, repeat: int, elements: int = STREAM_ELEMENTS) -> float:
    """Bandwidth (bytes/s) one rank gets for ``a = b + s c`` with its threads while every rank runs it."""
    # Deferred: the yardsticks are numba kernels (numba ~0.5 s to import, -X importtime), and every
    # command of the map-maker imports this module (mapmaker.programs.commands).
    from mapmaker.kernels.projection_fast import triad

    a = np.zeros(elements)
    b = np.ones(elements)
    c = np.full(elements, 2.0)
    triad(a, b, c, 3.0)
    seconds = _best_of(comm, repeat, lambda: triad(a, b, c, 3.0))
    return 24.0 * elements / seconds


def copy_rate(comm, repeat: int, elements: int = STREAM_ELEMENTS) -> float:
    """Bandwidth (bytes/s, read + write) one rank gets copying an array (``np.copyto``: memcpy) while every rank does.

    The other yardstick of the floor: a copy reads and writes each byte once, as P (read the cache, write
    the TOD) and P^T (read the TOD and the cache) do, where the triad reads two streams for one written.
    """
    source = np.ones(elements)
    target = np.zeros(elements)
    np.copyto(target, source)
    seconds = _best_of(comm, repeat, lambda: np.copyto(target, source))
    return 16.0 * elements / seconds


def fft_flops(interval_lengths) -> float:
    """Flops of one N^-1 application: forward and inverse real FFT of each interval, 2.5 n log2 n each."""
    return sum(2 * 2.5 * n * math.log2(n) for n in interval_lengths if n > 1)


def fma_rate(comm, repeat: int) -> float:
    """Double-precision flop/s of one core on an L1-resident vectorised FMA loop (the compute yardstick)."""
    from mapmaker.kernels.projection_fast import polynomial  # deferred: see stream_triad

    values = np.random.default_rng(0).uniform(-1, 1, 512)
    out = np.empty_like(values)
    passes = 20_000
    polynomial(values, out, 1)
    seconds = _best_of(comm, repeat, lambda: polynomial(values, out, passes))
    return 16.0 * len(values) * passes / seconds


def _pointing_rate_setup(spec, layout, chunks, kernels: str) -> Callable[[], None]:
    kernel_set = implementation.get(kernels)

    def generate() -> None:
        pointer = ChunkPointing(spec, layout, kernel_set)
        for chunk in chunks:
            pointer(chunk.time_chunk, chunk.detector)

    return generate


def _measure(comm, kernels: str, spec, layout, chunks, noise, repeat: int, threads: int) -> tuple[dict, PCGBlock]:
    """Seconds per call of each kernel with one implementation, and its PCG solve ready to be timed."""
    kernel_set = implementation.get(kernels)
    implementation.warm_up(kernels)
    seconds: dict[str, float] = {}
    seconds["pointing"] = _best_of(comm, max(1, repeat // 2), _pointing_rate_setup(spec, layout, chunks, kernels))

    local = build_local_data(spec, layout, chunks, noise, kernels)
    n_samp = local.n_samples
    generator = np.random.default_rng(comm.Get_rank())
    local_map = generator.standard_normal((local.n_local, 3))
    tod = generator.standard_normal(n_samp)
    scratch = np.empty(n_samp)
    projection = kernel_set.projection
    index, weights = local.local_index, local.weights
    seconds["P"] = _best_of(comm, repeat, lambda: projection.project_map_to_tod(local_map, index, weights, out=scratch))
    # Into a kept map, as the PCG operator's scatter adds into its kept buffers: a fresh 13 MiB map per call
    # would be fresh pages, and faulting them in is no part of P^T in a solve (about 10% of it at nside 256).
    kept_map = np.zeros((local.n_local, 3))
    seconds["P^T"] = _best_of(
        comm, repeat, lambda: projection.accumulate_tod_to_map(tod, index, weights, local.n_local, out=kept_map)
    )
    seconds["N^-1"] = _best_of(comm, repeat, lambda: local.apply_inverse_noise(tod, workers=threads))
    block = PCGBlock(comm, kernel_set, spec, local, tod, threads)
    measured = {
        "seconds": seconds,
        "fft_flops": fft_flops(local.interval_lengths.tolist()) if not local.white else 0.0,
        "samples_per_rank": n_samp,
        "local_pixels_rank0": local.n_local,
        "pixel_rows": "sorted" if local.order is None else "visit",
        "reduction_bytes_per_call": block.reduction.bytes_sent,
    }
    return measured, block


class PCGBlock:
    """``PCG_ITERATIONS`` iterations of one implementation's solve, timed as a block with its calc/comm split.

    Set up once (preconditioner, right-hand side from ``tod``, the output
    buffers realize uses); :meth:`run` solves from zero again each time, so
    every block does the same work.
    """

    def __init__(self, comm, kernel_set, spec, local, tod, threads: int):
        npix = spec.pixelization.npix
        self.comm, self.kernel_set, self.local, self.threads = comm, kernel_set, local, threads
        self.pixels = DistributedPixels(comm, local.local_pixels, npix, spec.solver.allreduce_buffer_pixels,
                                        vectors=kernel_set.vectors)
        self.reduction = make_reduction(
            "allreduce", comm, local.local_pixels, npix=npix, buffer_pixels=spec.solver.allreduce_buffer_pixels
        )
        weighted = local.accumulate_blocks(noise_weighted=True)
        self.reduction.reduce(weighted)
        keep = reference_blocks.rcond(weighted) > 1e-3
        self.inverse = reference_blocks.invert(weighted, keep)
        local.exclude_pixels(~keep)
        projection = kernel_set.projection
        self.b = local.to_sorted(projection.accumulate_tod_to_map(tod, local.local_index, local.weights, local.n_local))
        self.reduction.reduce(self.b)
        self.product_buffer, self.preconditioned_buffer = np.empty_like(self.b), np.empty_like(self.b)  # as realize

    def run(self) -> tuple[float, dict[str, float]]:
        """Seconds per iteration (slowest rank) and the calc/comm seconds per iteration (max over ranks)."""
        split = {"calc": 0.0, "comm": 0.0}

        def timed(kind: str, operation: Callable[[], object]):
            start = clock()
            value = operation()
            split[kind] += clock() - start
            return value

        def apply_matrix(direction):
            product = timed(
                "calc", lambda: self.local.apply_operator(direction, workers=self.threads, out=self.product_buffer)
            )
            return timed("comm", lambda: self.reduction.reduce(product))

        def precondition(r):
            return timed("calc", lambda: self.kernel_set.blocks.apply(self.inverse, r, out=self.preconditioned_buffer))

        def iterations() -> None:
            pcg(apply_matrix, precondition, lambda u, v: timed("comm", lambda: self.pixels.dot(u, v)), self.b,
                tol=1e-300, max_iter=PCG_ITERATIONS, vectors=self.kernel_set.vectors,
                dot_and_norm=lambda r, z: timed("comm", lambda: self.pixels.dot_and_norm(r, z)))

        elapsed = _best_of(self.comm, 1, iterations)
        return elapsed / PCG_ITERATIONS, {
            kind: self.comm.allreduce(value / PCG_ITERATIONS, op=MPI.MAX) for kind, value in split.items()
        }


def interleaved_rounds(blocks: dict[str, Any], rounds: int) -> dict[str, list[Any]]:
    """Each implementation's block (anything with ``run()``, e.g. a :class:`PCGBlock`) ``rounds`` times, taking turns.

    The order is reversed every round. A shared machine's slow spells then
    fall on both implementations alike, and round r of each gives a speed-up
    measured minutes apart at most. Returns, per implementation, the
    ``rounds`` values of ``run()`` (for a PCGBlock: seconds per iteration, split).
    """
    names = list(blocks)
    timings: dict[str, list[Any]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            timings[name].append(blocks[name].run())
    return timings


def run_bench(
    *, samples: int, nside: int, repeat: int, threads: int, as_json: bool, kernels: str = "numpy,fast",
    spec_path: str | None = None, clock_name: str = "wall", rounds: int = 5, instrument_root: str | None = None,
) -> int:
    global clock
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    clock = CLOCKS[clock_name]
    threading.configure(threads)
    if spec_path is not None:  # a campaign's own scan, focal plane, pixels and noise, split over the ranks
        spec = resolve_files(load_spec(spec_path), instrument_root)  # its TOAST files, if it names any
        nside = spec.pixelization.nside
    else:
        spec = bench_spec(samples * size, nside)
    layout = chunk_layout(spec)
    chunks = decompose(layout, size).chunks_of(rank)
    noise = NoiseModel(spec, layout)
    load_before = os.getloadavg()[0]
    bandwidth = stream_triad(comm, repeat, STREAM_ELEMENTS if samples >= 1 << 20 else 1 << 23)
    copy_bandwidth = copy_rate(comm, repeat, STREAM_ELEMENTS if samples >= 1 << 20 else 1 << 23)
    flop_rate = fma_rate(comm, repeat)
    results, blocks = {}, {}
    for name in [k.strip() for k in kernels.split(",") if k.strip()]:
        results[name], blocks[name] = _measure(comm, name, spec, layout, chunks, noise, repeat, threads)
    timings = interleaved_rounds(blocks, rounds)
    for name, result in results.items():
        per_iteration = [seconds for seconds, _ in timings[name]]
        best_round = min(range(rounds), key=per_iteration.__getitem__)
        result["seconds"]["PCG iteration"] = per_iteration[best_round]
        result["pcg_split_seconds"] = timings[name][best_round][1]
        result["pcg_rounds_seconds"] = per_iteration
    n_samp = next(iter(results.values()))["samples_per_rank"]

    cores_per_second = threads if clock_name == "wall" else 1  # CPU time already sums the threads
    table = {}
    for operation in ("pointing", "P", "P^T", "N^-1", "PCG iteration"):
        row = {}
        for name, result in results.items():
            seconds = result["seconds"][operation]
            per_sample = BYTES_PER_SAMPLE[operation]
            floor = per_sample * n_samp / bandwidth
            copy_floor = per_sample * n_samp / copy_bandwidth
            row[name] = {
                "seconds": seconds,
                "samples_per_second_per_core": n_samp / (seconds * cores_per_second),
                "bytes_per_sample": per_sample,
                "bytes_per_second": per_sample * n_samp / seconds,  # the must-move bytes over the time taken
                "floor_seconds": floor,
                "times_floor": seconds / floor,
                "copy_floor_seconds": copy_floor,
                "times_copy_floor": seconds / copy_floor,
            }
        table[operation] = row
    report = {
        "ranks": size,
        "threads_per_rank": threads,
        "clock": clock_name,
        "samples_per_rank": n_samp,
        "nside": nside,
        "local_pixels_rank0": next(iter(results.values()))["local_pixels_rank0"],
        "pixel_rows": {name: r["pixel_rows"] for name, r in results.items()},
        "stream_triad_bytes_per_second_per_rank": bandwidth,
        "copy_bytes_per_second_per_rank": copy_bandwidth,
        "fma_flops_per_second_per_core": flop_rate,
        "n_inverse_fft_flops_per_second_per_core": {
            name: r["fft_flops"] / (r["seconds"]["N^-1"] * cores_per_second) for name, r in results.items()
        },
        "load_average": {"before": load_before, "after": os.getloadavg()[0]},
        "operations": table,
        "pcg_split_seconds_per_iteration": {name: r["pcg_split_seconds"] for name, r in results.items()},
        "pcg_rounds": _rounds_summary({name: r["pcg_rounds_seconds"] for name, r in results.items()}),
        "reduction": {"strategy": "allreduce", "bytes_per_call": next(iter(results.values()))["reduction_bytes_per_call"]},
        "numpy": np.__version__,
    }
    if rank == 0:
        if as_json:
            print(json.dumps(report, indent=2))
        else:
            _print_report(report, list(results))
        sys.stdout.flush()
    return 0


def _rounds_summary(per_iteration: dict[str, list[float]]) -> dict:
    """Median and range of each implementation's rounds and, for numpy vs fast, of the per-round speed-up."""
    summary: dict = {
        "seconds_per_iteration": per_iteration,
        "median_seconds_per_iteration": {name: statistics.median(values) for name, values in per_iteration.items()},
    }
    if set(per_iteration) == {"numpy", "fast"}:
        ratios = [slow / fast for slow, fast in zip(per_iteration["numpy"], per_iteration["fast"])]
        summary["speedup"] = {
            "per_round": ratios, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)
        }
    return summary


def _print_report(report: dict, names: list[str]) -> None:
    print(
        f"mapmaker bench: {report['ranks']} ranks x {report['threads_per_rank']} threads, "
        f"{report['samples_per_rank']:,} samples per rank, nside {report['nside']} "
        f"({report['local_pixels_rank0']:,} local pixels on rank 0); {report['clock']} clock; load average "
        f"{report['load_average']['before']:.2f} -> {report['load_average']['after']:.2f}"
    )
    rows = ", ".join(f"{name} {order}" for name, order in report["pixel_rows"].items())
    print(f"P and P^T on the pixel rows a solve uses here ({report['samples_per_rank'] / report['local_pixels_rank0']:.0f} "
          f"samples per local pixel; visit order above {VISIT_ORDER_MIN_LOCAL_PIXELS:,} local pixels with compiled "
          f"kernels): {rows}; "
          f"P^T adds into a kept map")
    print(f"memory bandwidth (per rank, all ranks at once): triad {report['stream_triad_bytes_per_second_per_rank'] / 1e9:.1f} GB/s, "
          f"copy {report['copy_bytes_per_second_per_rank'] / 1e9:.1f} GB/s; "
          f"in-cache FMA loop: {report['fma_flops_per_second_per_core'] / 1e9:.1f} GFlop/s per core")
    header = f"{'operation':<15}{'bytes/sample':>13}"
    for name in names:
        header += (f"{name + ' s':>12}{name + ' samples/s/core':>24}{name + ' GB/s':>12}{name + ' x triad':>14}"
                   f"{name + ' x copy':>13}")
    if len(names) == 2:
        header += f"{'speedup':>9}"
    print(header)
    for operation, row in report["operations"].items():
        sizes = sorted({str(row[name]["bytes_per_sample"]) for name in names})
        line = f"{operation:<15}{'/'.join(sizes):>13}"
        for name in names:
            line += (f"{row[name]['seconds']:>12.4f}{row[name]['samples_per_second_per_core']:>24.3e}"
                     f"{row[name]['bytes_per_second'] / 1e9:>12.1f}{row[name]['times_floor']:>14.1f}"
                     f"{row[name]['times_copy_floor']:>13.1f}")
        if len(names) == 2:
            line += f"{row[names[0]]['seconds'] / row[names[1]]['seconds']:>8.1f}x"
        print(line)
    for name, rate in report["n_inverse_fft_flops_per_second_per_core"].items():
        print(f"N^-1 FFTs ({name}): {rate / 1e9:.1f} GFlop/s per core "
              f"({rate / report['fma_flops_per_second_per_core']:.0%} of the FMA loop)")
    for name, split in report["pcg_split_seconds_per_iteration"].items():
        print(f"PCG iteration split ({name}): calc {split['calc']:.4f} s, comm {split['comm']:.4f} s (max over ranks)")
    rounds = report["pcg_rounds"]
    spans = ", ".join(
        f"{name} {rounds['median_seconds_per_iteration'][name]:.4f} s ({min(values):.4f}-{max(values):.4f})"
        for name, values in rounds["seconds_per_iteration"].items()
    )
    count = len(next(iter(rounds["seconds_per_iteration"].values())))
    line = f"PCG iteration, {count} interleaved rounds of {PCG_ITERATIONS}: {spans} per iteration (median, range)"
    if "speedup" in rounds:
        speedup = rounds["speedup"]
        line += f"; speed-up median {speedup['median']:.1f}x ({speedup['min']:.1f}-{speedup['max']:.1f}x)"
    print(line)


def run_hybrid(
    *, cores: int, samples_total: int, nside: int, repeat: int, kernels: str, as_json: bool, spec_path: str | None = None,
    clock_name: str = "wall", rounds: int = 5, instrument_root: str | None = None,
) -> int:
    """Every ranks x threads = ``cores`` split under mpiexec at a fixed total of samples; calc/comm per iteration."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    launcher = str(mpiexec) if mpiexec.exists() else "mpiexec"
    rows = []
    for ranks in [r for r in range(cores, 0, -1) if cores % r == 0]:
        threads = cores // ranks
        command = [launcher, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "mapmaker", "bench", "--json",
                   "--samples", str(samples_total // ranks), "--nside", str(nside), "--repeat", str(repeat),
                   "--rounds", str(rounds),
                   "--threads", str(threads), "--kernels", kernels, "--clock", clock_name]
        command += ["--spec", spec_path] if spec_path else []
        command += ["--instrument-root", instrument_root] if instrument_root else []
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        report = json.loads(output)
        samples_total = report["samples_per_rank"] * ranks if spec_path else samples_total
        nside = report["nside"]
        # Core-seconds: wall seconds x cores, or CPU seconds (already summed over a rank's threads) x ranks.
        scale = cores if clock_name == "wall" else ranks
        for name, split in report["pcg_split_seconds_per_iteration"].items():
            iteration = report["operations"]["PCG iteration"][name]["seconds"]
            rows.append({
                "kernels": name, "ranks": ranks, "threads_per_rank": threads,
                "seconds_per_iteration": iteration,
                "median_seconds_per_iteration": report["pcg_rounds"]["median_seconds_per_iteration"][name],
                "calc_core_seconds": split["calc"] * scale, "comm_core_seconds": split["comm"] * scale,
                "samples_per_second_per_core": samples_total / (iteration * scale),
                "load_average": report["load_average"],
            })
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    rule = "seconds x cores" if clock_name == "wall" else "CPU seconds of a rank (all its threads) x ranks"
    print(f"mapmaker bench --hybrid {cores}: {samples_total:,} samples in all, nside {nside}, {clock_name} clock; "
          f"per PCG iteration, core-seconds = {rule} (calc and comm: max over ranks)")
    print(f"{'kernels':<8}{'ranks x threads':>16}{'s/iteration':>13}{'median s/it':>13}{'samples/s/core':>16}"
          f"{'calc core-s':>13}{'comm core-s':>13}{'load':>12}")
    for row in rows:
        load = f"{row['load_average']['before']:.1f}-{row['load_average']['after']:.1f}"
        print(f"{row['kernels']:<8}{row['ranks']:>9} x {row['threads_per_rank']:<4}{row['seconds_per_iteration']:>13.4f}"
              f"{row['median_seconds_per_iteration']:>13.4f}"
              f"{row['samples_per_second_per_core']:>16.3e}{row['calc_core_seconds']:>13.4f}{row['comm_core_seconds']:>13.4f}{load:>12}")
    best = {  # each implementation's fastest split, by its median round
        name: min((row for row in rows if row["kernels"] == name), key=lambda row: row["median_seconds_per_iteration"])
        for name in {row["kernels"] for row in rows}
    }
    if set(best) == {"numpy", "fast"}:
        slow, fast = best["numpy"], best["fast"]
        print(f"best split by median: numpy {slow['ranks']} x {slow['threads_per_rank']} "
              f"{slow['median_seconds_per_iteration']:.4f} s, fast {fast['ranks']} x {fast['threads_per_rank']} "
              f"{fast['median_seconds_per_iteration']:.4f} s per iteration: "
              f"{slow['median_seconds_per_iteration'] / fast['median_seconds_per_iteration']:.1f}x at {cores} cores")
    return 0
