"""``python -m mapmaker bench``: throughput of the kernels and of one PCG iteration.

A synthetic satellite scan (4 detectors at 100 Hz, 1-hour chunks, 1/f noise)
with ``--samples`` samples per rank. Each operation runs ``--repeat`` times on
every rank; the best time of the slowest rank is kept, and the figure printed
is samples per second per core = samples per rank / (time x threads per rank).
Serial or under ``mpiexec -n P python -m mpi4py -m mapmaker bench``.

This is a benchmark, not a test: nothing here asserts on time.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from mapmaker.decomposition import chunk_layout, decompose
from mapmaker.distributed import DistributedPixels
from mapmaker.kernels import projection
from mapmaker.kernels import preconditioner as blocks
from mapmaker.local_data import build_local_data
from mapmaker.noise import NoiseModel
from mapmaker.reduction import make_reduction
from mapmaker.scan import ChunkPointing
from mapmaker.solver import pcg
from schemas.spec import CampaignSpec

SAMPLE_RATE_HZ = 100.0
DETECTORS = 4
PCG_ITERATIONS = 5


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


def _best_of(comm: MPI.Comm, repeat: int, operation: Callable[[], object]) -> float:
    """Best over ``repeat`` runs of the slowest rank's wall time (s)."""
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        start = time.perf_counter()
        operation()
        elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        best = min(best, elapsed)
    return best


def run_bench(*, samples: int, nside: int, repeat: int, threads: int, as_json: bool) -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    spec = bench_spec(samples * size, nside)
    layout = chunk_layout(spec)
    chunks = decompose(layout, size).chunks_of(rank)
    noise = NoiseModel(spec, layout)

    def generate_pointing() -> None:
        pointer = ChunkPointing(spec, layout)
        for chunk in chunks:
            pointer(chunk.time_chunk, chunk.detector)

    timings: dict[str, float] = {}
    timings["pointing"] = _best_of(comm, repeat, generate_pointing)

    local = build_local_data(spec, layout, chunks, noise)
    n_samp = local.n_samples
    generator = np.random.default_rng(rank)
    local_map = generator.standard_normal((local.n_local, 3))
    tod = generator.standard_normal(n_samp)

    timings["P"] = _best_of(comm, repeat, lambda: projection.project_map_to_tod(local_map, local.local_index, local.weights, out=tod))
    timings["P^T"] = _best_of(
        comm, repeat, lambda: projection.accumulate_tod_to_map(tod, local.local_index, local.weights, local.n_local)
    )
    timings["N^-1"] = _best_of(comm, repeat, lambda: local.apply_inverse_noise(tod, workers=threads))

    pixels = DistributedPixels(comm, local.local_pixels, spec.pixelization.npix, spec.solver.allreduce_buffer_pixels)
    reduction = make_reduction("allreduce", comm, local.local_pixels, npix=spec.pixelization.npix,
                               buffer_pixels=spec.solver.allreduce_buffer_pixels)
    weighted = blocks.accumulate_blocks(local.local_index, local.weights, local.n_local, local.sample_noise_diagonal())
    reduction.reduce(weighted)
    keep = blocks.rcond(weighted) > 1e-3
    inverse = blocks.invert(weighted, keep)
    local.exclude_pixels(~keep)
    b = projection.accumulate_tod_to_map(tod, local.local_index, local.weights, local.n_local)
    reduction.reduce(b)
    scratch = np.empty(n_samp)

    def apply_matrix(direction: np.ndarray) -> np.ndarray:
        projection.project_map_to_tod(direction, local.local_index, local.weights, out=scratch)
        local.apply_inverse_noise(scratch, workers=threads)
        return reduction.reduce(projection.accumulate_tod_to_map(scratch, local.local_index, local.weights, local.n_local))

    def iterations() -> None:
        pcg(apply_matrix, lambda r: blocks.apply(inverse, r), pixels.dot, b, tol=1e-300, max_iter=PCG_ITERATIONS)

    timings["PCG iteration"] = _best_of(comm, max(1, repeat // 2), iterations) / PCG_ITERATIONS

    rates = {name: n_samp / (seconds * threads) for name, seconds in timings.items()}
    report = {
        "ranks": size,
        "threads_per_rank": threads,
        "samples_per_rank": n_samp,
        "nside": nside,
        "local_pixels_rank0": local.n_local,
        "seconds": timings,
        "samples_per_second_per_core": rates,
        "reduction": {"strategy": reduction.name, "bytes_per_call": reduction.bytes_sent},
        "numpy": np.__version__,
    }
    if rank == 0:
        if as_json:
            print(json.dumps(report, indent=2))
        else:
            print(f"mapmaker bench: {size} ranks x {threads} threads, {n_samp:,} samples per rank, nside {nside}")
            print(f"{'operation':<16}{'seconds':>10}{'samples/s/core':>18}")
            for name, seconds in timings.items():
                print(f"{name:<16}{seconds:>10.4f}{rates[name]:>18.3e}")
            sys.stdout.flush()
    return 0
