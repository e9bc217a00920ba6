"""One realisation end to end on a communicator: simulate, solve, gather.

Steps (every rank, collectives in the same order on all):

1. root builds the input sky (synfast or the user map) and tells everyone
   whether that worked;
2. each rank computes the pointing of its own chunks (time-major,
   contiguous, balanced) and caches local pixel indices and weights;
3. set-up of the pixel distribution (owners) and of the reduction;
4. 3x3 blocks per pixel, summed over ranks: the geometric (unit-weight) hit
   matrix gives the hits and the rcond cut, which depends on the pointing
   only; the N^-1-diagonal-weighted matrix gives the preconditioner;
5. the sky is broadcast piecewise and each rank keeps its pixels;
6. ``b = P^T N^-1 d`` with d simulated chunk by chunk and dropped;
7. PCG on ``P^T N^-1 P m = b``;
8. map, hits, rcond gathered on root;
9. (``realize_to_folder``) root computes the analysis mask and the pseudo-spectra
   (:mod:`mapmaker.model.spectra`) and writes them beside the maps.

MPI glue: everything that touches ``comm`` is here or in
:mod:`mapmaker.parallel.distributed` / :mod:`mapmaker.parallel.reduction`; the numerics are
the kernels.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import healpy as hp
import numpy as np
from mpi4py import MPI

from mapmaker.model import rng
from mapmaker.kernels import threads as threading
from mapmaker.model.decomposition import chunk_layout, decompose, decomposition_fingerprint
from mapmaker.parallel.distributed import DistributedPixels
from mapmaker.kernels import implementation
from mapmaker.kernels import preconditioner as blocks
from mapmaker.solve.local_data import build_local_data
from mapmaker.model.noise import NoiseModel
from mapmaker.parallel.overlap import build_overlap_plan
from mapmaker.parallel.planfile import PlanRefused
from mapmaker.parallel.reduction import make_reduction, needs_plan, resolve_strategy
from mapmaker.model.sky import SkyError, build_sky, sky_stream_key
from mapmaker.solve.solver import PCGResult, pcg
from mapmaker.solve.timing import Timers
from schemas.spec import CampaignSpec, MapSky

Progress = Callable[[str], None]

SINGULAR_RCOND = 1e-12  # blocks below this are cut even when solver.rcond_min is 0


@dataclass
class RankStats:
    """Per-rank figures the result summarises over ranks."""

    samples: int = 0
    local_pixels: int = 0
    reduce_bytes: int = 0  # one PCG-iteration reduction ([n_local, 3])
    reduce_messages: int = 0
    reduce_seconds_in_solve: float = 0.0
    reductions: int = 0


class NothingToSolve(ValueError):
    """No observed pixel passes the rcond cut: the realisation would be an empty map (exit 2)."""


@dataclass
class SolveOutcome:
    """What one realisation produced. Maps are on root only (None elsewhere)."""

    pcg: PCGResult
    strategy: str
    requested: str
    bytes_counted: str
    fingerprint: str
    samples: int
    observed_pixels: int
    cut_pixels: int
    excluded_samples: int
    stats: RankStats
    timers: Timers
    selection: Any = None  # commodel.Selection behind auto / hybrid's threshold
    details: dict | None = None
    plan_source: str | None = None  # "file", "memory" or None
    plan_build_s: float | None = None
    iqu: np.ndarray | None = None  # [3, npix], UNSEEN outside the solved pixels
    hits: np.ndarray | None = None  # [npix] int64
    rcond: np.ndarray | None = None  # [npix], UNSEEN where unobserved
    local_map: np.ndarray | None = field(default=None, repr=False)  # [n_local, 3] this rank's rows


def run_realization(
    spec: CampaignSpec,
    realization: int,
    comm: MPI.Comm,
    *,
    sky_root: str | Path | None = None,
    threads: int = 1,
    progress: Progress | None = None,
    timers: Timers | None = None,
    plan: Any = None,
    machine: Any = None,
    kernels: str = implementation.DEFAULT,
) -> SolveOutcome:
    """Simulate and solve realisation ``realization`` of ``spec`` on ``comm``.

    ``plan`` is this rank's :class:`mapmaker.parallel.overlap.OverlapPlan` (from
    ``realize --plan``): it gives the owners of shared pixels and drives the
    plan-based reductions; without one they (and ``auto``) build it in
    memory, with the same code as ``preprocess``. ``machine``
    (:class:`mapmaker.parallel.commodel.Machine`) is what ``auto`` models with.
    ``threads`` per rank (numba, FFT pool, BLAS: :mod:`mapmaker.kernels.threads`);
    ``kernels`` ``"fast"`` or ``"numpy"`` (:mod:`mapmaker.kernels.implementation`).
    Raises :class:`mapmaker.model.sky.SkyError` (on every rank) when the sky cannot
    be built, and :class:`mapmaker.parallel.reduction.ReductionUnavailable` for a
    reduction this version lacks -- both before any heavy work -- and
    :class:`mapmaker.parallel.planfile.PlanRefused` (on every rank) when the plan's
    pixels are not the ones this run observes.
    """
    timers = timers or Timers()
    rank, size = comm.Get_rank(), comm.Get_size()
    say = progress if (progress is not None and rank == 0) else (lambda message: None)
    requested = resolve_strategy(spec.solver.reduction)
    npix = spec.pixelization.npix
    kernel_set = implementation.get(kernels)
    threading.configure(threads, numba_threads=kernel_set.fast)
    with timers("calc"):
        compile_seconds = implementation.warm_up(kernels)
    if kernel_set.fast:
        say(f"kernels: fast (numba, {threads} thread(s) per rank), ready in {compile_seconds:.1f} s"
            + (" -- compiled now; later runs load them from the cache" if compile_seconds > 10 else ""))

    # 1. the sky, on root; every rank learns whether it exists before going on.
    sky_full, sky_problem = None, None
    if rank == 0:
        try:
            with timers("io" if isinstance(spec.sky, MapSky) else "calc"):
                sky_full = build_sky(spec, realization, sky_root)
        except SkyError as error:
            sky_problem = str(error)
    with timers("comm"):
        sky_problem, has_sky = comm.bcast((sky_problem, sky_full is not None), root=0)
    if sky_problem is not None:
        raise SkyError(sky_problem)

    # 2. pointing of this rank's chunks.
    layout = chunk_layout(spec)
    decomposition = decompose(layout, size)
    noise = NoiseModel(spec, layout)
    with timers("calc"):
        local = build_local_data(spec, layout, decomposition.chunks_of(rank), noise, kernels)
    say(
        f"pointing: {spec.total_samples} samples in {layout.n_chunks} chunks on {size} ranks "
        f"({local.n_samples} samples, {local.n_local} pixels on rank 0)"
    )

    # 3. pixel distribution and reduction (the overlap plan built here when needed and not given).
    from mapmaker.parallel.commodel import Workload

    buffer_pixels = spec.solver.allreduce_buffer_pixels
    plan_source, plan_build_s = ("file" if plan is not None else None), None
    if plan is not None:
        check_plan_pixels(comm, plan, local.local_pixels)
    elif needs_plan(requested, size):
        with timers("comm"):
            started = MPI.Wtime()
            plan = build_overlap_plan(comm, local.local_pixels, npix, buffer_pixels)
            plan_source, plan_build_s = "memory", MPI.Wtime() - started
    with timers("comm"):
        pixels = DistributedPixels(
            comm, local.local_pixels, npix, buffer_pixels, owner=None if plan is None else plan.owner
        )
        reduction = make_reduction(
            requested, comm, local.local_pixels, npix=npix, buffer_pixels=buffer_pixels, plan=plan,
            machine=machine, workload=Workload.of_spec(spec),
        )
    strategy = reduction.name

    # 4. hit matrices, rcond cut, preconditioner.
    with timers("calc"):
        both = np.empty((local.n_local, 12))
        both[:, :6] = local.accumulate_blocks(noise_weighted=False)
        both[:, 6:] = local.accumulate_blocks(noise_weighted=True)
    with timers("comm"):
        reduction.reduce(both)
    with timers("calc"):
        geometric, weighted = both[:, :6], both[:, 6:]
        hits = geometric[:, 0]
        pixel_rcond = blocks.rcond(geometric)
        # A singular block (rcond 0) cannot be solved whatever rcond_min says.
        cut = pixel_rcond < max(spec.solver.rcond_min, SINGULAR_RCOND)
        solved = ~cut
        excluded_local = local.exclude_pixels(cut)
        inverse_blocks = blocks.invert(weighted, solved)
        del both, geometric, weighted
    with timers("comm"):
        cut_pixels = int(round(pixels.sum_owned(cut.astype(np.float64))))
        excluded_samples = int(comm.allreduce(excluded_local, op=MPI.SUM))
    say(f"pixels: {pixels.n_observed} observed, {cut_pixels} cut by rcond < {spec.solver.rcond_min:g}")
    if cut_pixels >= pixels.n_observed:  # global figures: every rank raises alike
        raise NothingToSolve(
            f"all {pixels.n_observed} observed pixels are cut by rcond < {spec.solver.rcond_min:g}: the scan "
            "and the detectors' polarisation angles do not separate I, Q and U in any pixel (observe longer, "
            "add detectors at other angles, or lower solver.rcond_min)"
        )

    # 5. the sky at this rank's pixels.
    sky_local = None
    if has_sky:
        with timers("comm"):
            sky_local = pixels.broadcast_from_root(sky_full.T if rank == 0 else None, 3)
        del sky_full

    # 6. b = P^T N^-1 d, one chunk at a time.
    with timers("calc"):
        b = np.zeros((local.n_local, 3))  # compute order until the loop ends
        sky_compute = local.to_compute(sky_local) if sky_local is not None else None
        for i, chunk in enumerate(local.chunks):
            samples = slice(int(local.chunk_offsets[i]), int(local.chunk_offsets[i + 1]))
            tod = np.zeros(chunk.n_samples)
            if sky_compute is not None:
                local.project(sky_compute, samples, out=tod)
            if noise.simulated:
                tod += noise.simulate_chunk(chunk, spec.seed, realization)
            tod[local.excluded_in(samples)] = 0.0
            local.apply_inverse_noise_chunk(i, tod, workers=threads)
            local.accumulate(tod, samples, out=b)
            del tod
        b = local.to_sorted(b)
        del sky_compute
    with timers("comm"):
        reduction.reduce(b)

    # 7. PCG.
    stats = RankStats(samples=local.n_samples, local_pixels=local.n_local)
    # The solver is done with each result before the next call: one buffer each, no pages faulted per iteration.
    product_buffer, preconditioned_buffer = np.empty_like(b), np.empty_like(b)

    def apply_matrix(direction: np.ndarray) -> np.ndarray:
        with timers("calc"):
            product = local.apply_operator(direction, workers=threads, out=product_buffer)
        with timers("comm"):
            started = MPI.Wtime()
            reduction.reduce(product)
            stats.reduce_seconds_in_solve += MPI.Wtime() - started
        return product

    def apply_preconditioner(residual: np.ndarray) -> np.ndarray:
        with timers("calc"):
            return kernel_set.blocks.apply(inverse_blocks, residual, out=preconditioned_buffer)

    def dot(u: np.ndarray, v: np.ndarray) -> float:
        with timers("comm"):
            return pixels.dot(u, v)

    say(f"solve: PCG to ||r||/||b|| < {spec.solver.tol:g}, reduction {strategy} (requested {requested})")
    result = pcg(
        apply_matrix,
        apply_preconditioner,
        dot,
        b,
        tol=spec.solver.tol,
        max_iter=spec.solver.max_iter,
        on_iteration=lambda k, residual: say(f"iteration {k:4d}  residual {residual:.3e}"),
    )
    stats.reduce_bytes, stats.reduce_messages = reduction.bytes_sent, reduction.messages_sent
    stats.reductions = reduction.calls

    # 8. products gathered on root.
    with timers("comm"):
        maps = gather_maps(pixels, result.solution, hits, pixel_rcond, cut)
    outcome = SolveOutcome(
        pcg=result,
        strategy=strategy,
        requested=requested,
        bytes_counted=reduction.bytes_counted,
        fingerprint=decomposition_fingerprint(decomposition),
        samples=spec.total_samples,
        observed_pixels=pixels.n_observed,
        cut_pixels=cut_pixels,
        excluded_samples=excluded_samples,
        stats=stats,
        timers=timers,
        selection=reduction.selection,
        details=reduction.details,
        plan_source=plan_source,
        plan_build_s=plan_build_s,
        local_map=result.solution,
    )
    if maps is not None:
        outcome.iqu, outcome.hits, outcome.rcond = maps
    return outcome


def gather_maps(
    pixels: DistributedPixels, solution: np.ndarray, hits: np.ndarray, rcond: np.ndarray, cut: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Collective: the full-sky product maps on rank 0, None elsewhere.

    solution [n_local, 3] (K), hits [n_local], rcond [n_local], cut
    [n_local] bool: this rank's rows, consistent across ranks. Returns IQU
    [3, npix] float64 (UNSEEN where unobserved or cut), hits [npix] int64 (0
    where unobserved) and rcond [npix] float64 (UNSEEN where unobserved).
    Rank 0 fills these typed arrays (40 bytes per sky pixel) piece by piece
    as the owners' rows arrive, and holds no other full-sky array.
    """
    rows = np.column_stack([solution, hits, rcond, cut.astype(np.float64)])
    if pixels.rank != 0:
        pixels.gather_owned_rows(rows, None)
        return None
    iqu = np.full((3, pixels.npix), hp.UNSEEN)
    hit_map = np.zeros(pixels.npix, dtype=np.int64)
    rcond_map = np.full(pixels.npix, hp.UNSEEN)

    def place(ids: np.ndarray, piece: np.ndarray) -> None:
        solved = piece[:, 5] == 0.0
        iqu[:, ids[solved]] = piece[solved, :3].T
        hit_map[ids] = np.rint(piece[:, 3])
        rcond_map[ids] = piece[:, 4]

    pixels.gather_owned_rows(rows, place)
    return iqu, hit_map, rcond_map


def check_plan_pixels(comm: MPI.Comm, plan: Any, local_pixels: np.ndarray) -> None:
    """Collective: refuse (PlanRefused on every rank) a plan whose pixels are not the ones each rank observes."""
    wrong = int(not np.array_equal(plan.local_pixels, local_pixels))
    wrong_ranks = comm.allgather(wrong)
    if any(wrong_ranks):
        first = wrong_ranks.index(1)
        raise PlanRefused(
            f"the plan's pixels of rank {first} are not the pixels this run observes there "
            "(built from other pointing code or data); rebuild it with 'preprocess'"
        )


def noise_stream_count(spec: CampaignSpec) -> int:
    """Number of distinct noise streams (detector x interval) a realisation draws."""
    if not spec.simulates_noise:
        return 0
    layout = chunk_layout(spec)
    noise = NoiseModel(spec, layout)
    _, last = layout.time_chunk_bounds(layout.n_time_chunks - 1)
    per_detector = (layout.n_time_chunks - 1) * noise.intervals_per_chunk + math.ceil(last / noise.samples_per_interval)
    return per_detector * layout.n_detectors


def rng_stream_records(spec: CampaignSpec, realization: int, cap: int = 64) -> tuple[list[dict], int]:
    """Keys of the run's streams (the sky first, then noise in time-major order), at most ``cap``, and the total."""
    records: list[dict] = []
    sky = sky_stream_key(spec, realization)
    if sky is not None:
        records.append({"stream": "sky", "key": list(sky)})
    total = len(records) + noise_stream_count(spec)
    if spec.simulates_noise:
        layout = chunk_layout(spec)
        noise = NoiseModel(spec, layout)
        names = [d.name for d in spec.focal_plane.detectors]
        for chunk_id in range(layout.n_chunks):
            if len(records) >= cap:
                break
            chunk = layout.chunk(chunk_id)
            for _, _, interval in noise.chunk_intervals(chunk):
                if len(records) >= cap:
                    break
                key = rng.noise_key(spec.seed, realization, chunk.detector, interval)
                records.append({"stream": "noise", "key": list(key), "detector": names[chunk.detector], "interval": interval})
    return records, total


def package_versions() -> dict[str, str]:
    import platform
    from importlib import metadata

    import mpi4py
    import scipy

    versions = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "healpy": hp.__version__,
        "mpi4py": mpi4py.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
    }
    try:
        versions["mapcampaign"] = metadata.version("mapcampaign")
    except metadata.PackageNotFoundError:
        versions["mapcampaign"] = "unknown"
    return versions


def selection_record(selection) -> dict:
    """The result's ``communication.selection`` from a :class:`mapmaker.parallel.commodel.Selection`."""
    return {
        "requested": selection.requested,
        "chosen": selection.chosen,
        "reason": selection.reason,
        "machine": selection.machine,
        "iterations": selection.iterations,
        "realizations": selection.realizations,
        "modeled": selection.modeled,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"max": float(max(values)), "mean": float(sum(values) / len(values))}


def realize_to_folder(
    spec: CampaignSpec,
    realization: int,
    out: str | Path,
    comm: MPI.Comm,
    *,
    sky_root: str | Path | None = None,
    threads: int = 1,
    progress: Progress | None = None,
    plan: Any = None,
    plan_document: dict | None = None,
    machine: Any = None,
    kernels: str = implementation.DEFAULT,
):
    """Run one realisation and write its products atomically into ``out`` (root writes).

    Returns the validated :class:`schemas.result.RealizationResult` on root,
    None on the other ranks. ``out`` must not exist (checked by the caller
    before the run, and again at the rename).
    """
    from mapmaker.model import spectra
    from mapmaker.programs import products
    from mapmaker.solve.timing import peak_memory_mib
    from schemas.result import RealizationResult
    from schemas.spec import scan_key, spec_hash

    timers = Timers()
    rank = comm.Get_rank()
    outcome = run_realization(
        spec, realization, comm, sky_root=sky_root, threads=threads, progress=progress, timers=timers, plan=plan,
        machine=machine, kernels=kernels,
    )

    folder = None
    product_records = []
    if rank == 0:
        with timers("io"):
            folder = products.ProductFolder(out)
            header = [("REALIZ", realization), ("SCANKEY", scan_key(spec))]
            coord = "C" if spec.scan.kind == "ground" else "E"  # equatorial / ecliptic
            product_records = products.write_maps(folder, outcome.iqu, outcome.hits, outcome.rcond, header, coord)
        with timers("calc"):
            measured = spectra.for_campaign(spec, outcome.iqu, outcome.hits)
        with timers("io"):
            product_records += products.write_spectra(folder, measured, header, coord)

    per_rank = comm.gather(
        {
            **timers.seconds,
            "bytes": outcome.stats.reduce_bytes,
            "messages": outcome.stats.reduce_messages,
            "reduce_seconds": outcome.stats.reduce_seconds_in_solve / max(outcome.pcg.iterations, 1),
            "memory": peak_memory_mib(),
        },
        root=0,
    )
    if rank != 0:
        return None

    streams, streams_total = rng_stream_records(spec, realization)
    result = RealizationResult(
        realization=realization,
        spec_hash=spec_hash(spec),
        scan_key=scan_key(spec),
        ranks=comm.Get_size(),
        threads_per_rank=threads,
        samples=outcome.samples,
        observed_pixels=outcome.observed_pixels,
        cut_pixels=outcome.cut_pixels,
        excluded_samples=outcome.excluded_samples,
        iterations=outcome.pcg.iterations,
        converged=outcome.pcg.converged,
        residual_history=outcome.pcg.residual_history,
        timing={
            "calc": _spread([r["calc"] for r in per_rank]),
            "comm": _spread([r["comm"] for r in per_rank]),
            "io": _spread([r["io"] for r in per_rank]),
            "total": timers.elapsed(),
        },
        communication={
            "strategy": outcome.strategy,
            "requested": outcome.requested,
            "bytes_per_iteration": _spread([r["bytes"] for r in per_rank]),
            "messages_per_iteration": _spread([r["messages"] for r in per_rank]),
            "reductions": outcome.stats.reductions,
            "bytes_counted": outcome.bytes_counted,
            "seconds_per_iteration": _spread([r["reduce_seconds"] for r in per_rank]),
            "plan": outcome.plan_source,
            "plan_build_s": outcome.plan_build_s,
            "details": outcome.details,
            "selection": None if outcome.selection is None else selection_record(outcome.selection),
        },
        peak_memory_mb=_spread([r["memory"] for r in per_rank]),
        kernels=kernels,
        rng_streams=streams,
        rng_scheme=rng.RNG_SCHEME,
        rng_streams_total=streams_total,
        decomposition=outcome.fingerprint,
        plan_checksum=None if plan_document is None else plan_document["header_sha256"],
        versions=package_versions(),
        products=product_records,
        spectra=spectra.result_record(spec, measured),
    )
    try:
        products.write_result(folder, result)
        folder.commit()
    except BaseException:
        folder.discard()
        raise
    return result
