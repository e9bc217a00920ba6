"""One realisation's solve on a communicator, in three stages: set-up, solve, gather.

Every rank runs every stage; collectives come in the same order on all.

:func:`set_up_realization`
    1. root builds the input sky (synfast or the user map) with the cores of
       its node (:mod:`mapmaker.parallel.rootwork`) and tells everyone
       whether that worked;
    2. each rank computes the pointing of its own chunks (time-major,
       contiguous, balanced) and caches local pixel indices and weights;
    3. the pixel distribution (owners) and the reduction;
    4. 3x3 blocks per pixel, summed over ranks: the geometric (unit-weight)
       hit matrix gives the hits and the rcond cut, which depends on the
       pointing only; the N^-1-diagonal-weighted matrix gives the preconditioner;
    5. the sky is broadcast piecewise and each rank keeps its pixels.
:func:`solve_realization`
    6. ``b = P^T N^-1 d`` with d simulated chunk by chunk and dropped;
    7. PCG on ``P^T N^-1 P m = b``.
:func:`gather_realization`
    8. map, hits, rcond gathered on root.

Nothing here writes a file: the products (maps, spectra, ``result.json``)
are the ``realize`` program's (:mod:`mapmaker.programs.realize`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import healpy as hp
import numpy as np
from mpi4py import MPI

from mapmaker.kernels import implementation
from mapmaker.kernels import threads as threading
from mapmaker.kernels.implementation import Kernels
from mapmaker.model.decomposition import chunk_layout, decompose, decomposition_fingerprint
from mapmaker.model.noise import NoiseModel
from mapmaker.model.sky import SkyError, build_sky
from mapmaker.parallel.commodel import Machine, Selection, Workload
from mapmaker.parallel.distributed import DistributedPixels
from mapmaker.parallel.overlap import OverlapPlan, build_overlap_plan
from mapmaker.parallel.planfile import PlanRefused
from mapmaker.parallel.reduction import OverlapReduction, PixelReduction, make_reduction, needs_plan, resolve_strategy
from mapmaker.parallel.rootwork import on_root_with_node_cores
from mapmaker.solve.coarse import (
    Choice,
    CoarseOperator,
    SolveTiming,
    TwoLevelPreconditioner,
    choose_preconditioner,
    coarse_parents,
)
from mapmaker.solve.coarsefile import (
    CoarseRefused,
    read_coarse_operator,
    read_solve_timings,
    record_solve_timing,
    write_coarse_operator,
)
from mapmaker.solve.local_data import LocalData, build_local_data
from mapmaker.solve.solver import PCGResult, pcg
from mapmaker.solve.timing import Timers
from schemas.spec import CampaignSpec, MapSky, coarse_key

Progress = Callable[[str], None]

TWO_LEVEL = ("two-level", "two-level-additive")  # the preconditioners with a coarse space
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
    preconditioner: str = "block-diagonal"  # the one solved with (solver.preconditioner, "auto" resolved)
    coarse_columns: int = 0  # of the two-level preconditioner (0: block-diagonal)
    coarse_bytes: int = 0  # its memory on this rank
    coarse_setup_seconds: float = 0.0  # its set-up (A Z, E and the start), before the first iteration
    coarse_source: str | None = None  # "built" or "file" (read from the coarse cache); None: block-diagonal
    coarse_refused: str | None = None  # why a coarse cache file was refused (and the operator rebuilt)
    coarse_written: bool = False  # this run wrote the coarse cache file
    preconditioner_why: str = ""  # why auto chose it ("as the spec says" otherwise)
    solve_timed: bool = False  # this run's time was recorded beside the coarse cache for auto's comparison


class NothingToSolve(ValueError):
    """No observed pixel passes the rcond cut: the realisation would be an empty map (exit 2)."""


@dataclass
class RealizationSetUp:
    """What the set-up leaves for the solve: one rank's share of the system, and the global figures.

    Pixel arrays are this rank's rows in sorted order: hits, pixel_rcond [n_local],
    cut [n_local] bool, inverse_blocks [n_local, 3, 3] (K^2; zero where cut),
    sky_local [n_local, 3] (K) or None for a sky-less run.
    """

    spec: CampaignSpec
    realization: int
    kernels: Kernels
    threads: int
    local: LocalData
    noise: NoiseModel
    pixels: DistributedPixels
    reduction: PixelReduction
    requested: str
    fingerprint: str
    hits: np.ndarray
    pixel_rcond: np.ndarray
    cut: np.ndarray
    inverse_blocks: np.ndarray
    cut_pixels: int
    excluded_samples: int
    sky_local: np.ndarray | None
    plan_source: str | None  # "file", "memory" or None
    plan_build_s: float | None


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
    selection: Selection | None = None  # behind auto / hybrid's threshold
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
    plan: OverlapPlan | None = None,
    machine: Machine | None = None,
    kernels: str = implementation.DEFAULT,
    coarse_cache: str | Path | None = None,
) -> SolveOutcome:
    """Simulate and solve realisation ``realization`` of ``spec`` on ``comm``: the three stages.

    ``plan`` is this rank's overlap plan (from ``realize --plan``): it gives
    the owners of shared pixels and drives the plan-based reductions; without
    one they (and ``auto``) build it in memory, with the same code as
    ``preprocess``. ``machine`` is what ``auto`` models with. ``threads`` per
    rank (numba, FFT pool, BLAS: :mod:`mapmaker.kernels.threads`); ``kernels``
    an implementation name of :mod:`mapmaker.kernels.implementation`.
    ``coarse_cache``: the two-level preconditioner's coarse operator file
    (:mod:`mapmaker.solve.coarsefile`), read when it exists and fits, else
    built and written.
    Raises :class:`mapmaker.model.sky.SkyError` (on every rank) when the sky
    cannot be built, and :class:`mapmaker.parallel.reduction.ReductionUnavailable`
    for a reduction this version lacks -- both before any heavy work --,
    :class:`mapmaker.parallel.planfile.PlanRefused` (on every rank) when the
    plan's pixels are not the ones this run observes, and :class:`NothingToSolve`
    (on every rank) when the rcond cut leaves no pixel.
    """
    timers = timers or Timers()
    say = progress if (progress is not None and comm.Get_rank() == 0) else (lambda message: None)
    setup = set_up_realization(
        spec, realization, comm, sky_root=sky_root, threads=threads, kernels=implementation.get(kernels),
        plan=plan, machine=machine, timers=timers, say=say,
    )
    result, stats = solve_realization(setup, timers=timers, say=say, coarse_cache=coarse_cache)
    return gather_realization(setup, result, stats, timers=timers)


def set_up_realization(
    spec: CampaignSpec,
    realization: int,
    comm: MPI.Comm,
    *,
    sky_root: str | Path | None,
    threads: int,
    kernels: Kernels,
    plan: OverlapPlan | None,
    machine: Machine | None,
    timers: Timers,
    say: Progress,
) -> RealizationSetUp:
    """Collective: steps 1-5 (sky, pointing, distribution and reduction, blocks and cut, local sky)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    requested = resolve_strategy(spec.solver.reduction)
    npix = spec.pixelization.npix
    threading.configure(threads, numba_threads=kernels.compiled)
    with timers("calc"):
        compile_seconds = implementation.warm_up(kernels.name)
    if kernels.compiled:
        say(f"kernels: {kernels.name} (numba, {threads} thread(s) per rank), ready in {compile_seconds:.1f} s"
            + (" -- compiled now; later runs load them from the cache" if compile_seconds > 10 else ""))

    # 1. the sky, on root with its node's cores (the others wait idle); every rank learns whether it exists.
    sky_full, sky_problem = None, None
    with timers.stage("sky"):

        def synthesize() -> None:
            nonlocal sky_full, sky_problem
            try:
                with timers("io" if isinstance(spec.sky, MapSky) else "calc"):
                    sky_full = build_sky(spec, realization, sky_root)
            except SkyError as error:
                sky_problem = str(error)

        with timers("comm") if rank != 0 else nullcontext():  # the others' wait for root
            on_root_with_node_cores(comm, synthesize, threads=threads)
        with timers("comm"):
            sky_problem, has_sky = comm.bcast((sky_problem, sky_full is not None), root=0)
    if sky_problem is not None:
        raise SkyError(sky_problem)

    # 2. pointing of this rank's chunks.
    layout = chunk_layout(spec)
    decomposition = decompose(layout, size)
    noise = NoiseModel(spec, layout)
    with timers.stage("pointing"), timers("calc"):
        local = build_local_data(spec, layout, decomposition.chunks_of(rank), noise, kernels.name,
                                 pointing=spec.solver.pointing)
    if local.half_widths is not None:
        widths = sorted({w for w in local.half_widths if w})
        say(f"N^-1: finite correlation length, kernel half-width(s) {widths} samples, spectral error "
            f"delta {local.filter_error:.1e} (map noise within a factor {math.sqrt((1 + local.filter_error) / (1 - local.filter_error)):.4f})")
    elif spec.solver.noise_filter == "finite" and not noise.white_weighting:
        say("N^-1: no finite correlation length meets solver.noise_filter_tolerance here; exact filter used")
    say(
        f"pointing: {spec.total_samples} samples in {layout.n_chunks} chunks on {size} ranks "
        f"({local.n_samples} samples, {local.n_local} pixels on rank 0)"
    )

    with timers.stage("distribution"):
        # 3. pixel distribution and reduction (the overlap plan built here when needed and not given).
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
                comm, local.local_pixels, npix, buffer_pixels, owner=None if plan is None else plan.owner,
                vectors=kernels.vectors,
            )
            reduction = make_reduction(
                requested, comm, local.local_pixels, npix=npix, buffer_pixels=buffer_pixels, plan=plan,
                machine=machine, workload=Workload.of_spec(spec), exchange=kernels.exchange,
            )

        # 4. hit matrices, rcond cut, preconditioner.
        with timers("calc"):
            both = local.accumulate_both_blocks()
        with timers("comm"):
            reduction.reduce(both)
        with timers("calc"):
            geometric, weighted = both[:, :6], both[:, 6:]
            hits = geometric[:, 0]
            pixel_rcond = kernels.blocks.rcond(geometric)
            # A singular block (rcond 0) cannot be solved whatever rcond_min says.
            cut = pixel_rcond < max(spec.solver.rcond_min, SINGULAR_RCOND)
            excluded_local = local.exclude_pixels(cut)
            inverse_blocks = kernels.blocks.invert(weighted, ~cut)
            del both, geometric, weighted
        with timers("comm"):
            cut_pixels = round(pixels.sum_owned(cut.astype(np.float64)))
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
                sky_local = pixels.broadcast_from_root(sky_full.T if sky_full is not None else None, 3)  # on root
            del sky_full

    return RealizationSetUp(
        spec=spec, realization=realization, kernels=kernels, threads=threads, local=local, noise=noise,
        pixels=pixels, reduction=reduction, requested=requested,
        fingerprint=decomposition_fingerprint(decomposition), hits=hits, pixel_rcond=pixel_rcond, cut=cut,
        inverse_blocks=inverse_blocks, cut_pixels=cut_pixels, excluded_samples=excluded_samples,
        sky_local=sky_local, plan_source=plan_source, plan_build_s=plan_build_s,
    )


def right_hand_side(setup: RealizationSetUp, timers: Timers) -> np.ndarray:
    """Collective: step 6, ``b = P^T N^-1 d`` [n_local, 3] (K^-1), sorted order, summed over ranks.

    d (K) is simulated one chunk at a time (sky through P, plus noise) and dropped.
    """
    spec, local, noise = setup.spec, setup.local, setup.noise
    with timers("calc"):
        b = np.zeros((local.n_local, 3))  # compute order until the loop ends
        sky_compute = local.to_compute(setup.sky_local) if setup.sky_local is not None else None
        for i, chunk in enumerate(local.chunks):
            samples = local.chunk_samples(i)
            weights = local.chunk_weights(i)
            tod = np.zeros(chunk.n_samples)
            if sky_compute is not None:
                local.project(sky_compute, i, out=tod, weights=weights)
            if noise.simulated:
                tod += noise.simulate_chunk(chunk, spec.seed, setup.realization)
            tod[local.excluded_in(samples)] = 0.0
            local.apply_inverse_noise_chunk(i, tod, workers=setup.threads)
            local.accumulate(tod, i, out=b, weights=weights)
            del tod, weights
        b = local.to_sorted(b)
        del sky_compute
    with timers("comm"):
        setup.reduction.reduce(b)
    return b


def solve_realization(
    setup: RealizationSetUp,
    *,
    timers: Timers,
    say: Progress,
    b: np.ndarray | None = None,
    on_estimate: Callable[[int, np.ndarray], None] | None = None,
    coarse_cache: str | Path | None = None,
) -> tuple[PCGResult, RankStats]:
    """Collective: steps 6-7, the right-hand side and PCG; the solution is this rank's rows [n_local, 3] (K).

    ``b`` [n_local, 3]: a right-hand side made already (by :func:`right_hand_side`; benchmarks solve one
    several times); ``on_estimate(k, x_k)`` is handed to :func:`~mapmaker.solve.solver.pcg`;
    ``coarse_cache`` as in :func:`run_realization`.
    """
    spec, local, reduction, threads = setup.spec, setup.local, setup.reduction, setup.threads
    if b is None:
        with timers.stage("simulate"):
            b = right_hand_side(setup, timers)
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

    # Overlap variants: the exchange of the shared rows starts half-way through the operator, the rest of
    # P^T (the rows only this rank observes) runs while it travels; the time counted is start + finish.
    # Recomputed pointing has no flat weights to stream: it runs the blocking operator a chunk at a time.
    overlaps = getattr(reduction, "overlaps", False) and local.weights is not None
    split = local.operator_split(cast(OverlapReduction, reduction).shared_rows) if overlaps else None

    def start(partial: np.ndarray) -> None:
        started = MPI.Wtime()
        reduction.start(partial)  # type: ignore[attr-defined]
        stats.reduce_seconds_in_solve += MPI.Wtime() - started

    def apply_matrix_overlapped(direction: np.ndarray) -> np.ndarray:
        with timers("calc"):
            assert split is not None  # the overlapped operator is chosen only where the split was made
            product = local.apply_operator_overlapped(direction, split, start, workers=threads, out=product_buffer)
        with timers("comm"):
            started = MPI.Wtime()
            reduction.finish()  # type: ignore[attr-defined]
            stats.reduce_seconds_in_solve += MPI.Wtime() - started
        return product

    def apply_preconditioner(residual: np.ndarray) -> np.ndarray:
        with timers("calc"):
            return setup.kernels.blocks.apply(setup.inverse_blocks, residual, out=preconditioned_buffer)

    def dot(u: np.ndarray, v: np.ndarray) -> float:
        with timers("comm"):
            return setup.pixels.dot(u, v)

    def dot_and_norm(r: np.ndarray, z: np.ndarray) -> tuple[float, float]:
        with timers("comm"):
            return setup.pixels.dot_and_norm(r, z)

    x0 = initial_residual = None
    started = MPI.Wtime()
    choice = resolve_preconditioner(setup, coarse_cache)
    stats.preconditioner, stats.preconditioner_why = choice.preconditioner, choice.why
    if spec.solver.preconditioner == "auto":
        say(f"preconditioner auto: {stats.preconditioner} ({choice.why})")
    if stats.preconditioner in TWO_LEVEL:
        with timers.stage("coarse"), timers("calc"):
            two_level = build_two_level(setup, coarse_cache, stats, say, preconditioner=stats.preconditioner)
            x0, initial_residual = two_level.start(b)
        stats.coarse_columns = two_level.n_columns
        stats.coarse_bytes = two_level.bytes_held
        stats.coarse_setup_seconds = MPI.Wtime() - started
        say(f"two-level preconditioner: {two_level.n_columns} coarse columns (coarse nside {two_level.coarse_nside}), "
            f"{two_level.bytes_held / 2**20:.0f} MiB on rank 0, {stats.coarse_source}, set up in "
            f"{stats.coarse_setup_seconds:.1f} s")

        def apply_preconditioner(residual: np.ndarray) -> np.ndarray:
            with timers("calc"):
                return two_level.apply(residual, preconditioned_buffer)

    say(f"solve: PCG to ||r||/||b|| < {spec.solver.tol:g}, reduction {reduction.name} (requested {setup.requested}), "
        f"{stats.preconditioner} preconditioner")
    with timers.stage("solve"):
        result = pcg(
            apply_matrix if split is None else apply_matrix_overlapped,
            apply_preconditioner,
            dot,
            b,
            tol=spec.solver.tol,
            max_iter=spec.solver.max_iter,
            x0=x0,
            initial_residual=initial_residual,
            on_iteration=lambda k, residual: say(f"iteration {k:4d}  residual {residual:.3e}"),
            on_estimate=on_estimate,
            dot_and_norm=dot_and_norm,
            vectors=setup.kernels.vectors,
        )
    if choice.timed and result.converged and stats.coarse_source != "built":  # a build is not what later runs pay
        assert coarse_cache is not None  # timed choices are made only when the coarse cache exists
        timing = SolveTiming(choice.preconditioner, setup.pixels.comm.allreduce(MPI.Wtime() - started, op=MPI.MAX),
                             result.iterations)
        if setup.pixels.comm.Get_rank() == 0:
            problem = record_solve_timing(coarse_cache, timing, key=coarse_key(spec), tol=spec.solver.tol)
            say(problem or f"solve timed for auto: {timing.preconditioner}, {timing.seconds:.2f} s, "
                           f"{timing.iterations} iterations")
        stats.solve_timed = True
    spectrum = result.spectrum()
    if spectrum is not None:
        say(f"M^-1 A as PCG saw it: Ritz values {spectrum['smallest']:.3g} to {spectrum['largest']:.3g}, "
            f"condition estimate {spectrum['condition']:.3g}")
    stats.reduce_bytes, stats.reduce_messages = reduction.bytes_sent, reduction.messages_sent
    stats.reductions = reduction.calls
    return result, stats


def coarse_columns(setup: RealizationSetUp, coarse_nside: int) -> int:
    """Collective: the coarse space's column count K, 3 (or 1: ``solver.coarse_stokes = "I"``) x the coarse
    pixels (NESTED at ``coarse_nside``) holding a solved pixel on some rank; known before any operator work."""
    parents = coarse_parents(setup.pixels.local_pixels, setup.spec.pixelization.nside, coarse_nside)
    seen = np.zeros(12 * coarse_nside**2, dtype=np.int64)
    seen[np.unique(parents[~setup.cut])] = 1
    setup.pixels.comm.Allreduce(MPI.IN_PLACE, seen, op=MPI.MAX)
    return coarse_stokes(setup.spec) * int(seen.sum())


def coarse_stokes(spec: CampaignSpec) -> int:
    """Columns per coarse pixel: 3 (I, Q, U) or 1 (I alone), as ``solver.coarse_stokes`` says."""
    return len(spec.solver.coarse_stokes)


def resolve_preconditioner(setup: RealizationSetUp, coarse_cache: str | Path | None) -> Choice:
    """Collective: the preconditioner this run solves with and why (:func:`~mapmaker.solve.coarse.choose_preconditioner`).

    For ``"auto"``: whether ``coarse_cache`` exists (rank 0 looks), the campaign's realisation count, when
    the coarse operator would be shared the bytes of A-DEF2's ``A Z`` (float32, ``4 K x 3 n_held``) on the rank
    that would hold most, and when it is cached the solve timings recorded beside it.
    """
    spec, comm = setup.spec, setup.pixels.comm
    if spec.solver.preconditioner != "auto":
        return choose_preconditioner(spec.solver.preconditioner, cached=False, realizations=0, coarse_bytes=0)
    cached, timings = False, []
    if coarse_cache is not None:
        cached, timings = comm.bcast(
            (Path(coarse_cache).exists(), read_solve_timings(coarse_cache, key=coarse_key(spec), tol=spec.solver.tol))
            if comm.Get_rank() == 0 else None
        )
    realizations = spec.realizations if coarse_cache is not None else 1
    coarse_bytes = 0
    if cached or realizations > 1:  # else block-diagonal whatever A Z would take: no whole-map pass to size it
        n_columns = coarse_columns(setup, min(spec.solver.coarse_nside, spec.pixelization.nside))
        rows = 3 * int(setup.pixels.spread_owned.sum())
        coarse_bytes = comm.allreduce(4 * n_columns * rows, op=MPI.MAX)
    return choose_preconditioner("auto", cached=cached, realizations=realizations, coarse_bytes=coarse_bytes,
                                 timings=timings)


def build_two_level(
    setup: RealizationSetUp, coarse_cache: str | Path | None = None, stats: RankStats | None = None,
    say: Progress = lambda message: None, *, preconditioner: str | None = None,
) -> TwoLevelPreconditioner:
    """Collective: the two-level preconditioner of ``setup``, its coarse operator read from ``coarse_cache``
    when that file exists and fits this run, else built (one operator application over the intervals that
    visit the column's coarse pixel, and one reduction, per coarse column) and written there.

    ``stats`` (when given) records where the operator came from, a refused file's reason and whether
    this run wrote the file. ``preconditioner``: ``"two-level"`` or ``"two-level-additive"`` (default
    ``solver.preconditioner``; what ``"auto"`` resolved to).
    """
    local, threads, spec, comm = setup.local, setup.threads, setup.spec, setup.pixels.comm
    additive = (preconditioner or spec.solver.preconditioner) == "two-level-additive"
    stats = stats if stats is not None else RankStats()
    nside = spec.pixelization.nside
    coarse_nside = min(spec.solver.coarse_nside, nside)
    visits: list[np.ndarray] = []  # the intervals visiting each coarse pixel, made for a build only

    def apply_operator(x: np.ndarray, out: np.ndarray, coarse_pixel: int | None) -> np.ndarray:
        if coarse_pixel is not None and not visits:
            visits.extend(local.intervals_visiting(coarse_parents(local.local_pixels, nside, coarse_nside),
                                                   12 * coarse_nside**2))
        intervals = None if coarse_pixel is None else visits[coarse_pixel]
        return local.apply_operator(x, workers=threads, out=out, intervals=intervals)

    def make(operator: CoarseOperator | None) -> TwoLevelPreconditioner:
        return TwoLevelPreconditioner(
            pixels=setup.pixels, reduction=setup.reduction, nside=nside, coarse_nside=coarse_nside, cut=setup.cut,
            inverse_blocks=setup.inverse_blocks, kernels=setup.kernels,
            apply_operator=apply_operator, operator=operator, additive=additive, stokes=coarse_stokes(spec),
        )

    if coarse_cache is None:
        stats.coarse_source = "built"
        return make(None)
    key = coarse_key(spec)
    # The column count is known before any operator work: a shell with no operator is not made, so count here.
    held_pixels = setup.pixels.local_pixels[setup.pixels.spread_owned]
    n_columns = coarse_columns(setup, coarse_nside)
    rows = 0 if additive else 3 * len(held_pixels)
    operator = None
    try:
        operator = read_coarse_operator(comm, coarse_cache, key=key, coarse_nside=coarse_nside,
                                        n_columns=n_columns, held_pixels=held_pixels, rows=rows)
    except CoarseRefused as refused:
        stats.coarse_refused = str(refused)
        say(f"{refused}: building the coarse operator again and replacing the file")
    two_level = make(operator)
    stats.coarse_source = "built" if two_level.built else "file"
    if two_level.built:
        problem = write_coarse_operator(comm, coarse_cache, two_level.operator, key=key, coarse_nside=coarse_nside,
                                        held_pixels=held_pixels)
        stats.coarse_written = problem is None
        say(f"coarse operator written to {coarse_cache}" if problem is None else f"coarse operator not cached: {problem}")
    else:
        say(f"coarse operator read from {coarse_cache}")
    return two_level


def gather_realization(setup: RealizationSetUp, result: PCGResult, stats: RankStats, *, timers: Timers) -> SolveOutcome:
    """Collective: step 8, the full-sky maps on root, and the outcome of the run on every rank."""
    with timers.stage("gather"), timers("comm"):
        maps = gather_maps(setup.pixels, result.solution, setup.hits, setup.pixel_rcond, setup.cut)
    reduction = setup.reduction
    outcome = SolveOutcome(
        pcg=result,
        strategy=reduction.name,
        requested=setup.requested,
        bytes_counted=reduction.bytes_counted,
        fingerprint=setup.fingerprint,
        samples=setup.spec.total_samples,
        observed_pixels=setup.pixels.n_observed,
        cut_pixels=setup.cut_pixels,
        excluded_samples=setup.excluded_samples,
        stats=stats,
        timers=timers,
        selection=reduction.selection,
        details=reduction.details,
        plan_source=setup.plan_source,
        plan_build_s=setup.plan_build_s,
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


def check_plan_pixels(comm: MPI.Comm, plan: OverlapPlan, local_pixels: np.ndarray) -> None:
    """Collective: refuse (PlanRefused on every rank) a plan whose pixels are not the ones each rank observes."""
    wrong = int(not np.array_equal(plan.local_pixels, local_pixels))
    wrong_ranks = comm.allgather(wrong)
    if any(wrong_ranks):
        first = wrong_ranks.index(1)
        raise PlanRefused(
            f"the plan's pixels of rank {first} are not the pixels this run observes there "
            "(built from other pointing code or data); rebuild it with 'preprocess'"
        )
