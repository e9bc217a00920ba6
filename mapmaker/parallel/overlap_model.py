"""The overlap structure of a scan pattern at rank counts we do not run: a serial simulation.

``python -m mapmaker model`` projects the cost of every reduction strategy to
256 ... 16384 ranks the way the paper does, without that many ranks:

1. the pixels of every chunk, from the real pointing code
   (:class:`mapmaker.model.scan.ChunkPointing`), once: detectors at the same
   focal-plane offset see the same pixels (the polarisation angle only turns
   psi), so one detector per offset is pointed -- exact; ``time_step`` > 1
   keeps every n-th sample only -- an approximation whose error is measured
   by :func:`subsampling_error` and stated in the README;
2. for each rank count p, the real decomposition (:func:`decompose`) gives
   each rank its chunks, hence its sorted pixel set (the union of its
   chunks' sets) -- exactly the ``local_pixels`` a run on p ranks has;
3. the exact per-rank figures of every strategy (:class:`OverlapFigures`,
   the same numbers :func:`mapmaker.parallel.commodel.figures_from_plan` gathers at
   run time), computed globally rather than rank by rank:
   multiplicities by ``bincount``; neighbour counts from the observer pairs
   of each pixel (exact within ``pair_budget`` pairs, else sampled ranks for
   the many-rank pixels, flagged); the butterfly's rows per step from
   sparse products of "which groups observe a pixel" x "which subtrees do".
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from mapmaker.kernels.pixels import sorted_unique
from mapmaker.model.decomposition import ChunkLayout, chunk_layout, decompose
from mapmaker.model.scan import ChunkPointing
from mapmaker.parallel.commodel import (
    OverlapFigures,
    Workload,
    hybrid_thresholds,
    per_node,
    preprocessing_cost,
    select_strategy,
    strategy_costs,
)
from mapmaker.parallel.overlap import butterfly_shape
from schemas.spec import CampaignSpec, scan_key

Progress = Callable[[str], None]
DEFAULT_PAIR_BUDGET = 40_000_000  # observer pairs enumerated for exact neighbour counts (8 bytes each)
SAMPLED_RANKS = 64
DENSE_MULTIPLICITY = 256  # butterfly counting: pixels seen by this many ranks use dense BLAS blocks


@dataclass
class ChunkSets:
    """Sorted unique pixels (int32) of every (time chunk, focal-plane position); detector -> position."""

    layout: ChunkLayout
    npix: int
    sets: list[list[np.ndarray]]
    position_of: np.ndarray
    time_step: int
    seconds: float

    def of_chunk(self, chunk_id: int) -> np.ndarray:
        time_chunk, detector = divmod(chunk_id, self.layout.n_detectors)
        return self.sets[time_chunk][self.position_of[detector]]


def chunk_sets(spec: CampaignSpec, time_step: int = 1, progress: Progress | None = None) -> ChunkSets:
    """Step 1: the pixels of every chunk, one pointing per focal-plane position."""
    started = time.perf_counter()
    layout = chunk_layout(spec)
    offsets = [(d.offset_x_deg, d.offset_y_deg) for d in spec.focal_plane.detector_rows]
    positions = sorted(set(offsets), key=offsets.index)
    position_of = np.array([positions.index(o) for o in offsets], dtype=np.int64)
    representative = [offsets.index(p) for p in positions]
    pointer = ChunkPointing(spec, layout)
    sets = []
    for t in range(layout.n_time_chunks):
        row = []
        for detector in representative:
            pixels, _ = pointer(t, detector)
            row.append(sorted_unique(pixels[::time_step]).astype(np.int32))
        sets.append(row)
        if progress and (t + 1) % max(1, layout.n_time_chunks // 10) == 0:
            progress(f"pointing: {t + 1}/{layout.n_time_chunks} time chunks")
    return ChunkSets(layout, spec.pixelization.npix, sets, position_of, time_step, time.perf_counter() - started)


def rank_pixel_sets(sets: ChunkSets, size: int) -> list[np.ndarray]:
    """Step 2: every rank's sorted pixel set (int64) for the decomposition into ``size`` ranks."""
    decomposition = decompose(sets.layout, size)
    n_det = sets.layout.n_detectors
    out = []
    for first, end in decomposition.ranges:
        pieces = {(c // n_det, int(sets.position_of[c % n_det])) for c in range(first, end)}
        parts = [sets.sets[t][p] for t, p in sorted(pieces)]
        out.append(sorted_unique(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64))
    return out


def _pairs(rank_sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    ranks = np.repeat(np.arange(len(rank_sets), dtype=np.int64), [len(s) for s in rank_sets])
    pixels = np.concatenate(rank_sets) if rank_sets else np.zeros(0, np.int64)
    return ranks, pixels


def overlap_figures(rank_sets: list[np.ndarray], npix: int, *, pair_budget: int = DEFAULT_PAIR_BUDGET,
                    seed: int = 0) -> OverlapFigures:
    """Step 3: the exact per-rank figures of every strategy for these pixel sets.

    Equal to :func:`mapmaker.parallel.commodel.figures_from_plans` of the plans of the
    same sets (a unit test checks it), but without building p plans.
    """
    size = len(rank_sets)
    ranks, pixels = _pairs(rank_sets)
    multiplicity = np.bincount(pixels, minlength=npix).astype(np.int64)
    m_of = multiplicity[pixels]
    thresholds = hybrid_thresholds(size)
    n_local = np.bincount(ranks, minlength=size).astype(np.int64)
    shared = np.bincount(ranks, weights=m_of - 1, minlength=size).astype(np.int64)
    light_shared = np.stack(
        [np.bincount(ranks, weights=(m_of - 1) * (m_of < tau), minlength=size) for tau in thresholds], axis=1
    ).astype(np.int64)
    heavy_pixels = np.array([int((multiplicity >= tau).sum()) for tau in thresholds], dtype=np.int64)
    neighbours, light_neighbours, exact = _neighbour_counts(ranks, pixels, multiplicity, size, thresholds, pair_budget, seed)
    butterfly = _butterfly_rows(ranks, pixels, multiplicity, size)
    return OverlapFigures(
        size=size,
        npix=npix,
        n_local=n_local,
        shared=shared,
        neighbours=neighbours,
        butterfly=butterfly,
        thresholds=thresholds,
        light_shared=light_shared,
        light_neighbours=light_neighbours,
        heavy_pixels=heavy_pixels,
        neighbours_exact=exact,
        histogram=np.bincount(multiplicity, minlength=size + 1),
    )


def _observers(ranks: np.ndarray, pixels: np.ndarray, multiplicity: np.ndarray):
    """Observer lists per pixel: (order of pairs sorted by pixel, CSR starts per pixel)."""
    order = np.argsort(pixels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(multiplicity)])
    return ranks[order], starts


def _observer_entries(observers, starts, multiplicity, chosen):
    """The observers of the pixels ``chosen``, concatenated, and each entry's pixel multiplicity."""
    lengths = multiplicity[chosen]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat = np.repeat(starts[chosen] - offsets, lengths) + np.arange(int(lengths.sum()))
    return observers[flat], np.repeat(lengths, lengths)


def _neighbour_counts(ranks, pixels, multiplicity, size, thresholds, pair_budget, seed):
    """Neighbours per rank and, per tau, neighbours through pixels seen by fewer than tau ranks.

    The minimum multiplicity over the pixels shared by each ordered pair
    (i, j) decides both; pairs come from each pixel's observers, pixels in
    order of increasing multiplicity so that the first time a pair appears
    carries its minimum. Past ``pair_budget`` pairs, the remaining (many-rank)
    pixels are handled for a sample of ranks only: the others get -1.
    """
    observers, starts = _observers(ranks, pixels, multiplicity)
    part_keys, part_least = [], []
    used = 0
    cut = None  # the first multiplicity not enumerated
    for m in np.unique(multiplicity[multiplicity >= 2]).tolist():
        chosen = np.flatnonzero(multiplicity == m)
        if used + len(chosen) * m * (m - 1) > pair_budget:
            cut = m
            break
        used += len(chosen) * m * (m - 1)
        off_diagonal = ~np.eye(m, dtype=bool)
        batch = max(1, 4_000_000 // (m * m))
        found = []
        for first in range(0, len(chosen), batch):
            part = chosen[first : first + batch]
            block = observers[starts[part][:, None] + np.arange(m)[None, :]]  # [n, m] observers
            found.append(sorted_unique((block[:, :, None] * size + block[:, None, :])[:, off_diagonal].ravel()))
        keys = sorted_unique(np.concatenate(found))
        part_keys.append(keys)
        part_least.append(np.full(len(keys), m, dtype=np.int64))
    if part_keys:
        # Stable sort: among equal keys the first comes from the smallest multiplicity.
        keys = np.concatenate(part_keys)
        order = np.argsort(keys, kind="stable")
        keys, least = keys[order], np.concatenate(part_least)[order]
        first_of_run = np.concatenate([[True], keys[1:] != keys[:-1]])
        keys, least = keys[first_of_run], least[first_of_run]
    else:
        keys, least = np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = keys // size
    neighbours = np.bincount(first, minlength=size).astype(np.int64)
    light = np.zeros((size, len(thresholds)), dtype=np.int64)
    for j, tau in enumerate(thresholds):
        light[:, j] = np.bincount(first, weights=(least < tau), minlength=size)
    if cut is None:
        return neighbours, light, True

    # Too many pairs: pixels seen by >= cut ranks, for a sample of ranks (the most concerned + random ones).
    heavy = multiplicity[pixels] >= cut
    incidence = np.bincount(ranks[heavy], minlength=size)
    rng = np.random.default_rng(seed)
    sample = np.unique(np.concatenate([np.argsort(incidence)[-SAMPLED_RANKS // 4 :], rng.choice(size, min(size, SAMPLED_RANKS), replace=False)]))
    neighbours_out = np.full(size, -1, dtype=np.int64)
    light_out = np.where(thresholds[None, :] <= cut, light, -1).astype(np.int64)
    for i in sample.tolist():
        mine = pixels[(ranks == i) & heavy]
        known = keys[first == i] % size
        union = known
        seen_by = [np.zeros(0, np.int64)]
        for begin in range(0, len(mine), 256):  # until every rank is a neighbour
            entries, entry_multiplicity = _observer_entries(observers, starts, multiplicity, mine[begin : begin + 256])
            union = np.union1d(union, entries)
            seen_by.append(np.stack([entries, entry_multiplicity]))
            if len(union) >= size:
                break
        neighbours_out[i] = int(np.count_nonzero(union != i))
        for j, tau in enumerate(thresholds):
            if tau > cut:
                below = [e[0][e[1] < tau] for e in seen_by[1:]]
                combined = np.union1d(keys[(first == i) & (least < tau)] % size, np.concatenate([np.zeros(0, np.int64), *below]))
                light_out[i, j] = int(np.count_nonzero(combined != i))
    return neighbours_out, light_out, False


def _butterfly_rows(ranks, pixels, multiplicity, size) -> np.ndarray:
    """Rows each rank sends per butterfly step (and in the fold/unfold, last column), exactly.

    Virtual observers: ranks >= p' count as rank - p' for the pixels they
    share. Rank u sends at step m the pixels x with an observer s agreeing
    with u on bits >= m (its group so far) and an observer s' with
    s' mod 2^(m+1) = (u mod 2^m) + (1 - bit m of u) 2^m (the partner's
    subtree). Per step, C[h, b] = #pixels observed by some s with s >> m = h
    and some s' with s' mod 2^(m+1) = b is one sparse product.
    """
    base, steps = butterfly_shape(size)
    rows = np.zeros((size, steps + 1), dtype=np.int64)
    shared = multiplicity[pixels] >= 2
    extra = ranks >= base
    # Fold and unfold: an extra rank's shared pixels, both ways.
    folded = np.bincount(ranks[extra & shared] - base, minlength=base)[: size - base] if size > base else np.zeros(0)
    rows[base:, steps] = folded
    rows[: size - base, steps] = folded
    keep = ~extra | shared
    virtual = np.where(extra, ranks - base, ranks)[keep]
    vpixels = pixels[keep]
    if steps == 0 or len(vpixels) == 0:
        return rows
    key = sorted_unique(vpixels * base + virtual)  # pixel-major, then virtual rank
    vpixels, virtual = key // base, key % base
    new_pixel = np.concatenate([[True], vpixels[1:] != vpixels[:-1]])
    pixel_index = np.cumsum(new_pixel) - 1
    n_x = int(pixel_index[-1]) + 1
    starts = np.append(np.flatnonzero(new_pixel), len(vpixels))
    counts_per_pixel = np.diff(starts)
    # Pixels seen by many (virtual) ranks go through dense 0/1 blocks and BLAS: their sparse
    # products would cost up to 2 p' per pixel and step.
    dense = (counts_per_pixel >= DENSE_MULTIPLICITY)[pixel_index]
    u = np.arange(base)
    light_index, light_virtual = pixel_index[~dense], virtual[~dense]
    heavy_index = np.cumsum(np.concatenate([[True], np.diff(pixel_index[dense]) != 0]))[: int(dense.sum())] - 1
    heavy_virtual = virtual[dense]
    for m in range(steps):
        groups, subtrees = base >> m, 2 << m
        # "Some observer of the pixel is in group h" and "... in subtree b", as 0/1 matrices.
        a_matrix = _indicator(light_index, light_virtual >> m, n_x, groups)
        b_matrix = _indicator(light_index, light_virtual & (subtrees - 1), n_x, subtrees)
        counts = (a_matrix.T @ b_matrix).toarray()
        if len(heavy_index):
            n_heavy = int(heavy_index[-1]) + 1
            block = max(1, min(1 << 20, (1 << 25) // (groups + subtrees)))  # counts stay exact in float32
            bounds = np.searchsorted(heavy_index, np.arange(0, n_heavy + block, block))
            for first, (lo, hi) in enumerate(itertools.pairwise(bounds)):
                if lo == hi:
                    continue
                rows_here = heavy_index[lo:hi] - first * block
                n_here = int(rows_here[-1]) + 1
                a_dense = np.zeros((n_here, groups), dtype=np.float32)
                b_dense = np.zeros((n_here, subtrees), dtype=np.float32)
                a_dense[rows_here, heavy_virtual[lo:hi] >> m] = 1.0
                b_dense[rows_here, heavy_virtual[lo:hi] & (subtrees - 1)] = 1.0
                counts += (a_dense.T @ b_dense).astype(np.float64)
        partner_low = (u & ((1 << m) - 1)) | ((1 - ((u >> m) & 1)) << m)
        rows[:base, m] = np.rint(counts[u >> m, partner_low]).astype(np.int64)
    return rows


def _indicator(rows: np.ndarray, columns: np.ndarray, n_rows: int, n_columns: int):
    """Sparse 0/1 matrix with a 1 at every (row, column) given, duplicates allowed."""
    matrix = sparse.csr_matrix((np.ones(len(rows), dtype=np.float64), (rows, columns)), shape=(n_rows, n_columns))
    matrix.sum_duplicates()
    matrix.data[:] = 1.0
    return matrix


def relative_error(exact: OverlapFigures, approximate: OverlapFigures) -> dict[str, float]:
    """max over ranks of |approx - exact| / max(exact) for the figures the costs use."""

    def worst(a: np.ndarray, b: np.ndarray) -> float:
        known = (a >= 0) & (b >= 0)  # sampled neighbour counts are -1 where unknown
        if not known.any():
            return float("nan")
        scale = max(float(np.abs(a[known]).max()), 1.0)
        return float(np.abs(b[known].astype(np.float64) - a[known]).max() / scale)

    return {
        "n_local": worst(exact.n_local, approximate.n_local),
        "shared": worst(exact.shared, approximate.shared),
        "neighbours": worst(exact.neighbours, approximate.neighbours),
        "butterfly": worst(exact.butterfly.sum(axis=1), approximate.butterfly.sum(axis=1)),
    }


def project(spec: CampaignSpec, rank_counts: list[int], machine, *, time_step: int = 1,
            progress: Progress | None = None, pair_budget: int = DEFAULT_PAIR_BUDGET, threads_per_rank: int = 1,
            cores_per_node: int | None = None) -> dict:
    """The model command's figures: for each rank count, the overlap and every strategy's modeled cost.

    Ranks x threads: ``rank_counts`` are cores; each is modeled as
    ``cores // threads_per_rank`` ranks (the same samples on fewer, fatter
    ranks), and with ``cores_per_node`` the ranks of a node share its
    network interface (:func:`mapmaker.parallel.commodel.per_node`).
    """
    say = progress or (lambda message: None)
    threads_per_rank = max(1, int(threads_per_rank))
    if cores_per_node:
        machine = per_node(machine, max(1, cores_per_node // threads_per_rank))
    sets = chunk_sets(spec, time_step, progress)
    say(f"pointing: {sets.layout.n_chunks} chunks in {sets.seconds:.1f} s (time step {time_step})")
    workload = Workload.of_spec(spec)
    npix = spec.pixelization.npix
    projections = []
    for cores in rank_counts:
        size = max(1, cores // threads_per_rank)
        started = time.perf_counter()
        rank_sets = rank_pixel_sets(sets, size)
        figures = overlap_figures(rank_sets, npix, pair_budget=pair_budget)
        per_call = strategy_costs(figures, machine, k=3, buffer_pixels=workload.buffer_pixels)
        selection = select_strategy(figures, machine, workload)
        assert figures.histogram is not None  # overlap_figures counts it
        observed = int((figures.histogram[1:]).sum())
        fraction = np.divide(figures.shared, figures.n_local, out=np.zeros(size), where=figures.n_local > 0)
        known = figures.neighbours[figures.neighbours >= 0]
        baseline = per_call["allreduce"].seconds
        strategies = {}
        for name, cost in per_call.items():
            strategies[name] = {
                "bytes_per_iteration_max": cost.bytes_max,
                "bytes_per_iteration_mean": cost.bytes_mean,
                "messages_per_iteration_max": cost.messages_max,
                "messages_per_iteration_mean": cost.messages_mean,
                "seconds_per_iteration": cost.seconds,
                "speedup_vs_allreduce": baseline / cost.seconds if cost.seconds > 0 else None,
                "preprocessing_s": selection.modeled[name]["preprocessing_s"],
                "campaign_s": selection.modeled[name]["campaign_s"],
                **cost.details,
            }
        projections.append({
            "ranks": size,
            "cores": size * threads_per_rank,
            "overlap": {
                "observed_pixels": observed,
                "total_local_pixels": figures.total_local,
                "ranks_without_pixels": int((figures.n_local == 0).sum()),
                "local_pixels_max": int(figures.n_local.max()),
                "local_pixels_mean": float(figures.n_local.mean()),
                "shared_pixels_max": int(figures.shared.max()),
                "shared_pixels_mean": float(figures.shared.mean()),
                "shared_fraction_max": float(fraction.max()),
                "neighbours_max": int(known.max()) if len(known) else 0,
                "neighbours_mean": float(known.mean()) if len(known) else 0.0,
                "neighbours_exact": figures.neighbours_exact,
                "mean_multiplicity": figures.total_local / max(observed, 1),
            },
            "preprocessing": preprocessing_cost(figures, machine, workload.buffer_pixels),
            "strategies": strategies,
            "chosen": selection.chosen,
            "model_seconds": time.perf_counter() - started,
        })
        say(f"{size} ranks modeled in {time.perf_counter() - started:.1f} s")
    return {
        "scan_key": scan_key(spec),
        "npix": npix,
        "machine": machine.name,
        "threads_per_rank": threads_per_rank,
        "time_step": time_step,
        "pointing_s": sets.seconds,
        "iterations": workload.iterations,
        "realizations": workload.realizations,
        "buffer_pixels": workload.buffer_pixels,
        "projections": projections,
    }
