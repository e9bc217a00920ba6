"""``python -m mapmaker bench``: throughput of the kernels and of a PCG iteration, against the memory floor.

A synthetic satellite scan (4 detectors at 100 Hz, 1-hour chunks and
stationary intervals, 1/f noise) with ``--samples`` samples per rank. Every
operation runs ``--repeat`` times on every rank for each implementation
(``numpy``, the reference, and ``fast``); the best time of the slowest rank
is kept, and the figure printed is samples per second per core = samples
per rank / (time x threads per rank).

Memory-bandwidth floor. In the same run each rank measures a STREAM-like
triad ``a = b + s c`` (numba, its T threads, all ranks at once, arrays far
larger than the caches): the bandwidth one rank gets while the whole
configuration runs. Each kernel's floor is the time to move the bytes it
*must* move per sample at that bandwidth, and the table prints the measured
time over that floor (1.0 = at the hardware limit). Bytes per sample, the
minimum each kernel must read and write from memory (maps and one
interval's buffer are assumed to stay in cache; write-allocate reads not
counted, as STREAM does not count them):

==================  =====  =====================================================
kernel              bytes  what
==================  =====  =====================================================
pointing            28     write the cache: local index (int32) + 3 float64 weights
P                   36     read index + weights (28), write the TOD (8)
P^T                 36     read the TOD (8), index + weights (28)
N^-1                16     read and write the TOD once, in place
PCG iteration       28     read index + weights once: a fully fused operator whose TOD
                           never leaves the cache. Both implementations move ~88 (P, N^-1
                           and P^T as passes over a TOD array or a per-thread batch buffer,
                           index + weights read twice): see mapmaker.kernels.operator_fast
==================  =====  =====================================================

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

This is a benchmark, not a test: nothing here asserts on time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

SAMPLE_RATE_HZ = 100.0
DETECTORS = 4
PCG_ITERATIONS = 5
STREAM_ELEMENTS = 1 << 25  # 3 arrays of 256 MiB per rank (64 MiB for tiny runs): far beyond the 32 MiB L3

BYTES_PER_SAMPLE = {
    "pointing": 28,
    "P": 36,
    "P^T": 36,
    "N^-1": 16,
    "PCG iteration": 28,
}


def bench_spec(total_samples: int, nside: int):
    from schemas.spec import CampaignSpec

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
    from mpi4py import MPI

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
    import numpy as np

    from mapmaker.kernels.projection_fast import triad

    a = np.zeros(elements)
    b = np.ones(elements)
    c = np.full(elements, 2.0)
    triad(a, b, c, 3.0)
    seconds = _best_of(comm, repeat, lambda: triad(a, b, c, 3.0))
    return 24.0 * elements / seconds


def fft_flops(interval_lengths) -> float:
    """Flops of one N^-1 application: forward and inverse real FFT of each interval, 2.5 n log2 n each."""
    import math

    return sum(2 * 2.5 * n * math.log2(n) for n in interval_lengths if n > 1)


def fma_rate(comm, repeat: int) -> float:
    """Double-precision flop/s of one core on an L1-resident vectorised FMA loop (the compute yardstick)."""
    import numpy as np

    from mapmaker.kernels.projection_fast import polynomial

    values = np.random.default_rng(0).uniform(-1, 1, 512)
    out = np.empty_like(values)
    passes = 20_000
    polynomial(values, out, 1)
    seconds = _best_of(comm, repeat, lambda: polynomial(values, out, passes))
    return 16.0 * len(values) * passes / seconds


def _pointing_rate_setup(spec, layout, chunks, kernels: str) -> Callable[[], None]:
    from mapmaker.scan import ChunkPointing

    def generate() -> None:
        pointer = ChunkPointing(spec, layout, kernels)
        for chunk in chunks:
            pointer(chunk.time_chunk, chunk.detector)

    return generate


def _measure(comm, kernels: str, spec, layout, chunks, noise, repeat: int, threads: int) -> dict:
    """Seconds per call of each operation with one implementation, plus the PCG calc/comm split."""
    import numpy as np
    from mpi4py import MPI

    from mapmaker.distributed import DistributedPixels
    from mapmaker.kernels import implementation
    from mapmaker.kernels import preconditioner as reference_blocks
    from mapmaker.local_data import build_local_data
    from mapmaker.reduction import make_reduction
    from mapmaker.solver import pcg

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
    seconds["P^T"] = _best_of(
        comm, repeat, lambda: projection.accumulate_tod_to_map(tod, index, weights, local.n_local)
    )
    seconds["N^-1"] = _best_of(comm, repeat, lambda: local.apply_inverse_noise(tod, workers=threads))
    scratch = None  # the TOD-sized arrays go before the solve

    npix = spec.pixelization.npix
    pixels = DistributedPixels(comm, local.local_pixels, npix, spec.solver.allreduce_buffer_pixels)
    reduction = make_reduction("allreduce", comm, local.local_pixels, npix=npix, buffer_pixels=spec.solver.allreduce_buffer_pixels)
    weighted = local.accumulate_blocks(noise_weighted=True)
    reduction.reduce(weighted)
    keep = reference_blocks.rcond(weighted) > 1e-3
    inverse = reference_blocks.invert(weighted, keep)
    local.exclude_pixels(~keep)
    b = local.to_sorted(projection.accumulate_tod_to_map(tod, local.local_index, local.weights, local.n_local))
    reduction.reduce(b)
    tod = None
    split = {"calc": 0.0, "comm": 0.0}

    def timed(kind: str, operation: Callable[[], object]):
        start = clock()
        value = operation()
        split[kind] += clock() - start
        return value

    product_buffer, preconditioned_buffer = np.empty_like(b), np.empty_like(b)  # as realize does

    def apply_matrix(direction):
        product = timed("calc", lambda: local.apply_operator(direction, workers=threads, out=product_buffer))
        return timed("comm", lambda: reduction.reduce(product))

    def iterations() -> None:
        pcg(apply_matrix, lambda r: timed("calc", lambda: kernel_set.blocks.apply(inverse, r, out=preconditioned_buffer)),
            lambda u, v: timed("comm", lambda: pixels.dot(u, v)), b, tol=1e-300, max_iter=PCG_ITERATIONS)

    best_split = None
    best = float("inf")
    for _ in range(max(1, repeat // 2)):
        split.update(calc=0.0, comm=0.0)
        elapsed = _best_of(comm, 1, iterations)
        if elapsed < best:
            best = elapsed
            best_split = dict(split)
    seconds["PCG iteration"] = best / PCG_ITERATIONS
    calc = comm.allreduce(best_split["calc"] / PCG_ITERATIONS, op=MPI.MAX)
    communication = comm.allreduce(best_split["comm"] / PCG_ITERATIONS, op=MPI.MAX)
    return {
        "seconds": seconds,
        "fft_flops": fft_flops(local.interval_lengths.tolist()) if not local.white else 0.0,
        "pcg_split_seconds": {"calc": calc, "comm": communication},
        "samples_per_rank": n_samp,
        "local_pixels_rank0": local.n_local,
        "reduction_bytes_per_call": reduction.bytes_sent,
    }


def run_bench(
    *, samples: int, nside: int, repeat: int, threads: int, as_json: bool, kernels: str = "numpy,fast",
    spec_path: str | None = None, clock_name: str = "wall",
) -> int:
    global clock
    import numpy as np
    from mpi4py import MPI

    from mapmaker import threads as threading
    from mapmaker.decomposition import chunk_layout, decompose
    from mapmaker.noise import NoiseModel

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    clock = CLOCKS[clock_name]
    threading.configure(threads)
    if spec_path is not None:  # a campaign's own scan, focal plane, pixels and noise, split over the ranks
        from schemas.io import load_spec

        spec = load_spec(spec_path)
        nside = spec.pixelization.nside
    else:
        spec = bench_spec(samples * size, nside)
    layout = chunk_layout(spec)
    chunks = decompose(layout, size).chunks_of(rank)
    noise = NoiseModel(spec, layout)
    load_before = os.getloadavg()[0]
    bandwidth = stream_triad(comm, repeat, STREAM_ELEMENTS if samples >= 1 << 20 else 1 << 23)
    flop_rate = fma_rate(comm, repeat)
    results = {}
    for name in [k.strip() for k in kernels.split(",") if k.strip()]:
        results[name] = _measure(comm, name, spec, layout, chunks, noise, repeat, threads)
    n_samp = next(iter(results.values()))["samples_per_rank"]

    cores_per_second = threads if clock_name == "wall" else 1  # CPU time already sums the threads
    table = {}
    for operation in ("pointing", "P", "P^T", "N^-1", "PCG iteration"):
        row = {}
        for name, result in results.items():
            seconds = result["seconds"][operation]
            per_sample = BYTES_PER_SAMPLE[operation]
            floor = per_sample * n_samp / bandwidth
            row[name] = {
                "seconds": seconds,
                "samples_per_second_per_core": n_samp / (seconds * cores_per_second),
                "bytes_per_sample": per_sample,
                "floor_seconds": floor,
                "times_floor": seconds / floor,
            }
        table[operation] = row
    report = {
        "ranks": size,
        "threads_per_rank": threads,
        "clock": clock_name,
        "samples_per_rank": n_samp,
        "nside": nside,
        "local_pixels_rank0": next(iter(results.values()))["local_pixels_rank0"],
        "stream_triad_bytes_per_second_per_rank": bandwidth,
        "fma_flops_per_second_per_core": flop_rate,
        "n_inverse_fft_flops_per_second_per_core": {
            name: r["fft_flops"] / (r["seconds"]["N^-1"] * cores_per_second) for name, r in results.items()
        },
        "load_average": {"before": load_before, "after": os.getloadavg()[0]},
        "operations": table,
        "pcg_split_seconds_per_iteration": {name: r["pcg_split_seconds"] for name, r in results.items()},
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


def _print_report(report: dict, names: list[str]) -> None:
    print(
        f"mapmaker bench: {report['ranks']} ranks x {report['threads_per_rank']} threads, "
        f"{report['samples_per_rank']:,} samples per rank, nside {report['nside']} "
        f"({report['local_pixels_rank0']:,} local pixels on rank 0); {report['clock']} clock; load average "
        f"{report['load_average']['before']:.2f} -> {report['load_average']['after']:.2f}"
    )
    print(f"memory bandwidth (triad, per rank, all ranks at once): {report['stream_triad_bytes_per_second_per_rank'] / 1e9:.1f} GB/s; "
          f"in-cache FMA loop: {report['fma_flops_per_second_per_core'] / 1e9:.1f} GFlop/s per core")
    header = f"{'operation':<15}{'bytes/sample':>13}"
    for name in names:
        header += f"{name + ' s':>12}{name + ' samples/s/core':>24}{name + ' x floor':>15}"
    if len(names) == 2:
        header += f"{'speedup':>9}"
    print(header)
    for operation, row in report["operations"].items():
        sizes = sorted({str(row[name]["bytes_per_sample"]) for name in names})
        line = f"{operation:<15}{'/'.join(sizes):>13}"
        for name in names:
            line += f"{row[name]['seconds']:>12.4f}{row[name]['samples_per_second_per_core']:>24.3e}{row[name]['times_floor']:>15.1f}"
        if len(names) == 2:
            line += f"{row[names[0]]['seconds'] / row[names[1]]['seconds']:>8.1f}x"
        print(line)
    for name, rate in report["n_inverse_fft_flops_per_second_per_core"].items():
        print(f"N^-1 FFTs ({name}): {rate / 1e9:.1f} GFlop/s per core "
              f"({rate / report['fma_flops_per_second_per_core']:.0%} of the FMA loop)")
    for name, split in report["pcg_split_seconds_per_iteration"].items():
        print(f"PCG iteration split ({name}): calc {split['calc']:.4f} s, comm {split['comm']:.4f} s (max over ranks)")


def run_hybrid(
    *, cores: int, samples_total: int, nside: int, repeat: int, kernels: str, as_json: bool, spec_path: str | None = None,
    clock_name: str = "wall",
) -> int:
    """Every ranks x threads = ``cores`` split under mpiexec at a fixed total of samples; calc/comm per iteration."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    launcher = str(mpiexec) if mpiexec.exists() else "mpiexec"
    rows = []
    for ranks in [r for r in range(cores, 0, -1) if cores % r == 0]:
        threads = cores // ranks
        command = [launcher, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "mapmaker", "bench", "--json",
                   "--samples", str(samples_total // ranks), "--nside", str(nside), "--repeat", str(repeat),
                   "--threads", str(threads), "--kernels", kernels, "--clock", clock_name]
        command += ["--spec", spec_path] if spec_path else []
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
    print(f"{'kernels':<8}{'ranks x threads':>16}{'s/iteration':>13}{'samples/s/core':>16}{'calc core-s':>13}{'comm core-s':>13}{'load':>12}")
    for row in rows:
        load = f"{row['load_average']['before']:.1f}-{row['load_average']['after']:.1f}"
        print(f"{row['kernels']:<8}{row['ranks']:>9} x {row['threads_per_rank']:<4}{row['seconds_per_iteration']:>13.4f}"
              f"{row['samples_per_second_per_core']:>16.3e}{row['calc_core_seconds']:>13.4f}{row['comm_core_seconds']:>13.4f}{load:>12}")
    return 0
