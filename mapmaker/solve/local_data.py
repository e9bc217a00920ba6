"""One rank's share of the observation, held for the length of one solve.

A rank computes the pointing of *its own* chunks on the fly (never the
whole campaign's). What it keeps for the solve depends on
``solver.pointing``:

``"cached"`` (the default)
    the local pixel index and the IQU weights of each sample: 16 bytes per
    sample (``local_index`` int32, 4 bytes; ``weights`` 3 x float32, 12
    bytes). Every PCG iteration applies P and P^T, and the cache pays:
    reading 16 bytes costs ~1 ns per sample at this machine's ~15 GB/s,
    recomputing the pointing (quaternions, atan2, vec2pix) ~40 ns with the
    fast kernels and ~110 ns with numpy (``python -m mapmaker bench`` prints
    both rates). The weights ``(1, cos 2psi, sin 2psi)`` are rounded to
    float32 (relative error <= 2^-24 = 6e-8 each); every product with them
    is formed in float64, and P and P^T read the same rounded weights, so
    the system stays symmetric positive definite and its solution moves by
    ~1e-7 relative, under any solver tolerance the spec allows to matter
    (docs/explanation/numerics.md states the budget).
``"recomputed"``
    the local pixel index only (4 bytes per sample); the weights are
    computed again from the boresight, one chunk at a time, at every
    application of P, P^T and the operator, as MADmap computed its pointing
    on the fly. The pixel index stays cached: turning a recomputed RING
    pixel into the rank's local row would need a full-sky lookup table
    (4 bytes per sky pixel) or a binary search per sample. Each iteration
    costs the pointing's ~40 ns per sample on top of the operator.

The cut pixels' samples are marked by zero weights (cached) or by the
per-pixel ``cut`` mask (recomputed; looked up when the weights are made),
and whether a sample is cut is looked up from ``cut``, not stored per
sample.

The TOD is never cached: it is simulated chunk by chunk to form
``b = P^T N^-1 d`` and dropped, and the fast PCG operator
(:mod:`mapmaker.kernels.operator_fast`) applies ``P^T N^-1 P`` in batches
of intervals through a per-thread buffer, so no TOD-sized scratch exists
during the solve either (the numpy reference makes one per application,
8 bytes per sample; the overlapped operator, used with the overlap
reductions and cached pointing only, makes two and a mask, 17 bytes per
sample). Peak memory per rank is therefore about 16 (cached) or 4
(recomputed) bytes per local sample plus a few full-map arrays and one
chunk's pointing, whatever the total number of samples (per-sample
weights for the preconditioner are made per slab of intervals).

Map rows. Pixel vectors leave and enter this class in the order of
``local_pixels`` (sorted global ids: what the reductions, dot products
and products use). Inside, with the fast kernels and a local map larger
than the caches hold, ``local_index`` counts the pixels in the order the
samples first visit them (``order``, made by
:func:`mapmaker.kernels.projection_fast.first_visit_order`): the gathers and
scatters of P and P^T then stay within few cache lines. :meth:`to_compute` /
:meth:`to_sorted` convert, twice per PCG iteration (three times with an
overlapped reduction); each is a random-access pass over the local map (the
kernels' ``permute_rows``: ~3 ns a pixel with the compiled gather on a map
in L3, 21 ns beyond the caches at nside 512 with two ranks on the memory,
25-60 ns with numpy's ``rows[order]``), which the samples' locality repays
even at a few samples per pixel once the map is beyond VISIT_ORDER_MIN_LOCAL_PIXELS
(``pixel_order="auto"``).
Otherwise, and always with the numpy reference, rows stay sorted (``order`` None).

The samples of the rank's chunks are concatenated in chunk-id order into
flat arrays; stationary intervals tile them without overlap.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mapmaker.kernels import implementation
from mapmaker.kernels import noise as noise_kernels
from mapmaker.kernels.implementation import Kernels
from mapmaker.kernels.pixels import index_dtype, observed_pixels
from mapmaker.model.decomposition import Chunk, ChunkLayout
from mapmaker.model.noise import NoiseModel
from mapmaker.model.scan import ChunkPointing
from schemas.spec import CampaignSpec, PointingMode

SLAB_SAMPLES = 1 << 22  # samples whose per-sample N^-1 diagonal exists at once (32 MiB)
RECOMPUTE_SAMPLES = 1 << 20  # recomputed pointing: samples whose float64 weights exist at once (24 MiB)


@dataclass
class LocalData:
    """Cached pointing and interval layout of one rank.

    chunks: the rank's chunks in chunk-id order; chunk_offsets [n_chunks + 1]
    int64 into the flat sample arrays; local_pixels [n_local] int64 sorted
    unique global pixel ids; local_index [n_samp] int32 (int64 beyond 2^31
    local pixels): each sample's row in *compute order*, the sorted order
    permuted by ``order`` [n_local] (local_index's type; compute row -> sorted row; None:
    the identity) whose inverse is ``position``; weights [n_samp, 3] float32
    (rows of cut samples are zero), or None when ``pointer`` recomputes them
    chunk by chunk (``solver.pointing = "recomputed"``); cut [n_local] bool, compute order
    (pixels left out of the solve); kernels: the implementation
    (:mod:`mapmaker.kernels.implementation`) of P, P^T, the blocks, N^-1
    and the PCG operator; intervals: starts / lengths /
    detector / global index [n_int] int64, filter_index [n_int] into
    ``inverse_psds`` (K^-2, one per (white level, length); empty for white
    weighting), inverse_variance [n_int] (1 / sigma^2, K^-2) and
    noise_diagonal [n_int] (diagonal of N^-1, K^-2); interval_offsets
    [n_chunks + 1] give each chunk's intervals.
    """

    chunks: list[Chunk]
    chunk_offsets: np.ndarray
    local_pixels: np.ndarray
    local_index: np.ndarray
    weights: np.ndarray | None
    interval_starts: np.ndarray
    interval_lengths: np.ndarray
    interval_detector: np.ndarray
    interval_index: np.ndarray
    interval_offsets: np.ndarray
    filter_index: np.ndarray
    inverse_psds: list[np.ndarray]
    inverse_variance: np.ndarray
    noise_diagonal: np.ndarray
    white: bool
    order: np.ndarray | None = None
    position: np.ndarray | None = None
    cut: np.ndarray | None = None
    kernels: Kernels = field(default_factory=implementation.get)
    half_widths: list[int | None] | None = None  # finite N^-1: kernel half-width per filter (None: exact)
    filter_error: float = 0.0  # finite N^-1: largest relative spectral error delta of any filter (0: exact)
    pointer: ChunkPointing | None = field(default=None, repr=False)  # recomputes the weights (weights None)
    _filters: list | None = field(default=None, repr=False)
    _compute_map: np.ndarray | None = field(default=None, repr=False)  # apply_operator's map in compute order
    _partial_map: np.ndarray | None = field(default=None, repr=False)  # apply_operator_overlapped's P^T halves

    @property
    def n_samples(self) -> int:
        return len(self.local_index)

    @property
    def n_local(self) -> int:
        return len(self.local_pixels)

    def sample_noise_diagonal(self) -> np.ndarray:
        """Diagonal of N^-1 per sample, [n_samp] (K^-2)."""
        return np.repeat(self.noise_diagonal, self.interval_lengths)

    def to_compute(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Pixel rows [n_local, ...] from sorted order to compute order (``rows`` itself when they agree).

        ``out``: where to write them when they are permuted (a new array if None).
        """
        return rows if self.order is None else self.kernels.projection.permute_rows(rows, self.order, out)

    def to_sorted(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Pixel rows [n_local, ...] from compute order back to sorted order (``out`` as in :meth:`to_compute`)."""
        return rows if self.position is None else self.kernels.projection.permute_rows(rows, self.position, out)

    def accumulate_blocks(self, noise_weighted: bool) -> np.ndarray:
        """Packed 3x3 blocks [n_local, 6], sorted order: geometric, or weighted by the diagonal of N^-1."""
        if self.weights is None:
            return self.accumulate_both_blocks()[:, 6:] if noise_weighted else self.accumulate_both_blocks()[:, :6]
        return self.to_sorted(self._cached_blocks(noise_weighted))

    def _cached_blocks(self, noise_weighted: bool) -> np.ndarray:
        """:meth:`accumulate_blocks` from the cached weights, in compute order.

        The weighted sum runs over slabs of whole intervals of at most
        ``SLAB_SAMPLES`` samples, so that the per-sample weights exist for
        one slab at a time (8 bytes per slab sample, not per rank sample).
        """
        accumulate, weights = self.kernels.blocks.accumulate_blocks, self.weights
        assert weights is not None, "cached pointing only"
        if not noise_weighted:
            return accumulate(self.local_index, weights, self.n_local)
        blocks = np.zeros((self.n_local, 6))
        for first, stop in self._interval_slabs():  # each slab added into the same blocks: no map-sized array a slab
            samples = slice(int(self.interval_starts[first]), int(self.interval_starts[stop - 1] + self.interval_lengths[stop - 1]))
            sample_weight = np.repeat(self.noise_diagonal[first:stop], self.interval_lengths[first:stop])
            accumulate(self.local_index[samples], weights[samples], self.n_local, sample_weight, out=blocks)
        return blocks

    def accumulate_both_blocks(self) -> np.ndarray:
        """The geometric and the N^-1-weighted blocks side by side, [n_local, 12] (sorted order).

        Each kind is summed in compute order into one [n_local, 6] array (the kernels add into it: no
        map-sized array per slab or run of chunks), then permuted straight into its columns. Recomputed
        pointing makes each run's weights once for both (the pointing is most of their cost).
        """
        both = np.empty((self.n_local, 12))
        if self.weights is not None:  # one kind at a time: one [n_local, 6] array besides both
            for columns, noise_weighted in ((slice(0, 6), False), (slice(6, 12), True)):
                self._place_blocks(self._cached_blocks(noise_weighted), both[:, columns])
            return both
        accumulate = self.kernels.blocks.accumulate_blocks
        geometric, weighted = np.zeros((self.n_local, 6)), np.zeros((self.n_local, 6))
        for first, stop in self.chunk_runs():
            samples, weights = self.run_samples(first, stop), self.run_weights(first, stop)
            intervals = slice(int(self.interval_offsets[first]), int(self.interval_offsets[stop]))
            sample_weight = np.repeat(self.noise_diagonal[intervals], self.interval_lengths[intervals])
            accumulate(self.local_index[samples], weights, self.n_local, out=geometric)
            accumulate(self.local_index[samples], weights, self.n_local, sample_weight, out=weighted)
        self._place_blocks(geometric, both[:, :6])
        self._place_blocks(weighted, both[:, 6:])
        return both

    def _place_blocks(self, blocks: np.ndarray, out: np.ndarray) -> None:
        """Compute-order rows ``blocks`` [n_local, k] into ``out`` [n_local, k] (a view) in sorted order."""
        if self.position is None:
            out[...] = blocks
        else:
            self.kernels.projection.permute_rows(blocks, self.position, out=out)

    def _interval_slabs(self) -> list[tuple[int, int]]:
        """Runs ``[first, stop)`` of back-to-back intervals of at most SLAB_SAMPLES samples (or one interval)."""
        slabs, first = [], 0
        starts, lengths = self.interval_starts.tolist(), self.interval_lengths.tolist()
        for i in range(1, len(starts) + 1):
            if i == len(starts) or starts[i] != starts[i - 1] + lengths[i - 1] or (
                starts[i] + lengths[i] - starts[first] > SLAB_SAMPLES
            ):
                slabs.append((first, i))
                first = i
        return slabs

    def chunk_samples(self, i: int) -> slice:
        """The flat samples of the rank's i-th chunk."""
        return self.run_samples(i, i + 1)

    def run_samples(self, first: int, stop: int) -> slice:
        """The flat samples of the rank's chunks ``first`` to ``stop - 1`` (back to back)."""
        return slice(int(self.chunk_offsets[first]), int(self.chunk_offsets[stop]))

    def chunk_weights(self, i: int) -> np.ndarray:
        """IQU weights [n, 3] of the rank's i-th chunk (zero for cut samples): the cache's float32 rows, or
        float64 weights recomputed from the boresight (``pointer``)."""
        return self.run_weights(i, i + 1)

    def run_weights(self, first: int, stop: int) -> np.ndarray:
        """IQU weights [n, 3] of the chunks ``first`` to ``stop - 1``, as :meth:`chunk_weights`."""
        samples = self.run_samples(first, stop)
        if self.weights is not None:
            return self.weights[samples]
        weights = np.empty((samples.stop - samples.start, 3))
        for i in range(first, stop):
            chunk = self.chunks[i]
            begin = int(self.chunk_offsets[i]) - samples.start
            assert self.pointer is not None  # recomputed pointing (weights None) is built with its pointer
            weights[begin : begin + chunk.n_samples] = self.pointer(chunk.time_chunk, chunk.detector)[1]
        if self.cut is not None:
            weights[self.cut[self.local_index[samples]]] = 0.0
        return weights

    def chunk_runs(self) -> list[tuple[int, int]]:
        """Runs ``[first, stop)`` of the rank's chunks of at most RECOMPUTE_SAMPLES samples (or one chunk).

        Recomputed pointing makes the weights of a run at a time: every kernel call costs a pass over the
        local map (zeroing, adding private maps), so chunks of a few thousand samples each would pay that
        hundreds of times per iteration; a run's float64 weights are 24 bytes per run sample.
        """
        runs, first = [], 0
        offsets = self.chunk_offsets.tolist()
        for i in range(1, len(self.chunks) + 1):
            if i == len(self.chunks) or offsets[i + 1] - offsets[first] > RECOMPUTE_SAMPLES:
                runs.append((first, i))
                first = i
        return runs

    def project(self, local_map: np.ndarray, i: int, out: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """P on the rank's i-th chunk: local_map [n_local, 3] in *compute* order -> out [n].

        ``weights``: the chunk's :meth:`chunk_weights`, when the caller has them already.
        """
        weights = self.chunk_weights(i) if weights is None else weights
        return self.kernels.projection.project_map_to_tod(local_map, self.local_index[self.chunk_samples(i)], weights, out=out)

    def accumulate(self, tod: np.ndarray, i: int, out: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """P^T of the rank's i-th chunk's TOD [n] added into out [n_local, 3], *compute* order (``weights`` as in
        :meth:`project`)."""
        weights = self.chunk_weights(i) if weights is None else weights
        return self.kernels.projection.accumulate_tod_to_map(
            tod, self.local_index[self.chunk_samples(i)], weights, self.n_local, out=out
        )

    def exclude_pixels(self, cut: np.ndarray) -> int:
        """Leave the samples of cut local pixels (``cut`` [n_local] bool, sorted order) out of the solve.

        Returns their count. Their weights become zero (P gives 0, P^T
        ignores them) and :meth:`excluded_in` marks them so that their data
        are zeroed before N^-1.
        """
        self.cut = self.to_compute(np.asarray(cut, dtype=bool))
        if not self.cut.any():
            return 0
        if self.weights is None:  # chunk_weights zeroes them as it makes them
            return sum(int(np.count_nonzero(self.cut[self.local_index[self.chunk_samples(i)]]))
                       for i in range(len(self.chunks)))
        count = 0
        for first in range(0, self.n_samples, SLAB_SAMPLES):  # a slab's mask at a time, not 1 byte per rank sample
            samples = slice(first, first + SLAB_SAMPLES)
            excluded = self.cut[self.local_index[samples]]
            self.weights[samples][excluded] = 0.0
            count += int(np.count_nonzero(excluded))
        return count

    def excluded_in(self, samples: slice) -> np.ndarray:
        """Which of the samples ``samples`` are out of the solve, [n] bool."""
        if self.cut is None:
            return np.zeros(len(self.local_index[samples]), dtype=bool)
        return self.cut[self.local_index[samples]]

    @property
    def excluded(self) -> np.ndarray:
        """Samples out of the solve, [n_samp] bool (made on demand: 1 byte per sample)."""
        return self.excluded_in(slice(None))

    @property
    def noise_filters(self) -> list:
        """The N^-1 filters of the kernels in use (:func:`inverse_noise_filters` of their noise family), made once.

        One per filter in use (each filter serves one interval length); ``None`` for filters no interval uses.
        """
        if self._filters is None:
            lengths = {int(f): int(n) for f, n in zip(self.filter_index.tolist(), self.interval_lengths.tolist(), strict=True)}
            self._filters = self.kernels.noise.inverse_noise_filters(self.inverse_psds, lengths, self.half_widths)
        return self._filters

    def apply_inverse_noise(self, tod: np.ndarray, workers: int = 1) -> np.ndarray:
        """N^-1 in place on the rank's whole flat TOD [n_samp]; ``workers`` threads."""
        return self._apply(tod, slice(None), 0, workers)

    def apply_inverse_noise_chunk(self, i: int, tod: np.ndarray, workers: int = 1) -> np.ndarray:
        """N^-1 in place on the TOD [n] of the rank's i-th chunk alone."""
        intervals = slice(int(self.interval_offsets[i]), int(self.interval_offsets[i + 1]))
        return self._apply(tod, intervals, int(self.chunk_offsets[i]), workers)

    def _apply(self, tod: np.ndarray, intervals: slice, offset: int, workers: int) -> np.ndarray:
        starts = self.interval_starts[intervals] - offset
        lengths = self.interval_lengths[intervals]
        if self.white:
            return self.kernels.noise.apply_inverse_white(tod, starts, lengths, self.inverse_variance[intervals])
        return self.kernels.noise.apply_inverse_noise(
            tod, starts, lengths, self.filter_index[intervals], self.noise_filters, threads=workers
        )

    def apply_operator(
        self, local_map: np.ndarray, workers: int = 1, out: np.ndarray | None = None, intervals: np.ndarray | None = None
    ) -> np.ndarray:
        """The PCG operator ``P^T N^-1 P`` on a local map [n_local, 3] -> [n_local, 3], sorted order.

        The kernels' operator family: fused per interval with the fast
        kernels (:mod:`mapmaker.kernels.operator_fast`, no TOD-sized scratch),
        P, N^-1 and P^T one after the other with numpy; in compute order
        between two row permutations. ``out`` (sorted order) is overwritten.
        ``intervals`` [m] int64: indices of the stationary intervals to run
        over (None: all), exact for a map whose ``P x`` is zero on the others
        (the two-level preconditioner's coarse columns).
        """
        compute_map = self.to_compute(local_map, out=self._kept_compute_map())
        straight_into_out = out if self.position is None else None  # no permutation after: write out directly
        if self.weights is None:
            product = self._apply_operator_recomputed(compute_map, workers, straight_into_out, intervals)
        else:
            chosen = slice(None) if intervals is None else intervals
            product = self._operator_kernel(
                compute_map, self.local_index, self.weights, chosen, 0, workers, straight_into_out, False
            )
        if out is None:
            return self.to_sorted(product)
        if product is not out:
            if self.position is None:
                out[:] = product
            else:
                self.to_sorted(product, out=out)
        return out

    def _kept_compute_map(self) -> np.ndarray | None:
        """The map [n_local, 3] the operators permute into (None for sorted rows), made once and kept: fresh
        pages every iteration cost ~1 ms at nside 256 and hold one more map at the peak."""
        if self.order is not None and self._compute_map is None:
            self._compute_map = np.empty((self.n_local, 3))
        return self._compute_map

    def _operator_kernel(self, compute_map: np.ndarray, local_index: np.ndarray, weights: np.ndarray,
                         chosen: slice | np.ndarray, offset: int, workers: int, out: np.ndarray | None,
                         accumulate: bool) -> np.ndarray:
        """The kernels' operator on the intervals ``chosen`` of samples held from flat sample ``offset`` on."""
        starts, lengths = self.interval_starts[chosen] - offset, self.interval_lengths[chosen]
        if self.white:
            return self.kernels.operator.apply_white_operator(
                compute_map, local_index, weights, starts, lengths, self.inverse_variance[chosen], out=out,
                accumulate=accumulate,
            )
        return self.kernels.operator.apply_inverse_noise_operator(
            compute_map, local_index, weights, starts, lengths, self.filter_index[chosen], self.noise_filters,
            threads=workers, out=out, accumulate=accumulate,
        )

    def _apply_operator_recomputed(self, compute_map: np.ndarray, workers: int, out: np.ndarray | None,
                                   intervals: np.ndarray | None) -> np.ndarray:
        """The operator a run of chunks at a time (:meth:`chunk_runs`), each run's weights recomputed (compute order in and out)."""
        if out is None:
            out = np.zeros((self.n_local, 3))
        else:
            out.fill(0.0)
        owner = None if intervals is None else np.searchsorted(self.interval_offsets, intervals, side="right") - 1
        for first, stop in self.chunk_runs():
            if owner is None or intervals is None:  # both None or neither
                chosen = np.arange(self.interval_offsets[first], self.interval_offsets[stop])
            else:
                chosen = intervals[(owner >= first) & (owner < stop)]
            if len(chosen) == 0:
                continue
            samples = self.run_samples(first, stop)
            self._operator_kernel(compute_map, self.local_index[samples], self.run_weights(first, stop), chosen,
                                  samples.start, workers, out, True)
        return out

    def intervals_visiting(self, parent: np.ndarray, n_parents: int) -> list[np.ndarray]:
        """For each of ``n_parents`` groups of pixels, the stationary intervals [m] int64 with a sample in it.

        parent [n_local] int64, sorted order: each local pixel's group (the
        two-level preconditioner's coarse pixel). One pass over the samples, an interval at a time (no
        per-sample array of the rank's samples).
        """
        compute_parent = self.to_compute(np.asarray(parent, dtype=np.int64))
        visits: list[list[int]] = [[] for _ in range(n_parents)]
        for i, (start, length) in enumerate(zip(self.interval_starts.tolist(), self.interval_lengths.tolist(), strict=True)):
            seen = np.zeros(n_parents, dtype=bool)
            seen[compute_parent[self.local_index[start : start + length]]] = True
            for group in np.flatnonzero(seen).tolist():
                visits[group].append(i)
        return [np.array(v, dtype=np.int64) for v in visits]

    def operator_split(self, shared_rows: np.ndarray) -> OperatorSplit:
        """Which pixel rows a reduction exchanges, for :meth:`apply_operator_overlapped`.

        shared_rows [n_local] bool, sorted order. A per-pixel mask in compute order: no per-sample array.
        """
        return OperatorSplit(self.to_compute(np.asarray(shared_rows, dtype=bool)), self.local_index)

    def apply_operator_overlapped(self, local_map: np.ndarray, split: OperatorSplit, start: Callable[[np.ndarray], None],
                                  workers: int = 1, out: np.ndarray | None = None) -> np.ndarray:
        """``P^T N^-1 P`` [n_local, 3] -> [n_local, 3] (sorted order), with ``start(out)`` called in the middle.

        P and N^-1 on the whole TOD (8 bytes per sample of scratch: the fused
        fast operator cannot stop half-way), then P^T of the samples in shared
        rows: the shared rows are final and ``start(out)`` may send them; then
        P^T of the other samples, added into the rows only this rank observes
        while the shared rows' messages travel. Both P^T passes stream every
        sample and skip those of the other part by a per-pixel lookup (no
        masked copy of the TOD, no per-sample mask). Equal to
        :meth:`apply_operator` to round-off (the sums run in another order).
        Cached pointing only (``weights`` held).
        """
        if out is None:
            out = np.empty((self.n_local, 3))
        if self._partial_map is None:
            self._partial_map = np.empty((self.n_local, 3))  # kept, as the compute-order map
        projection = self.kernels.projection
        compute_map = self.to_compute(local_map, out=self._kept_compute_map())
        tod = projection.project_map_to_tod(compute_map, self.local_index, self.weights)
        self.apply_inverse_noise(tod, workers=workers)
        partial = self._partial_map
        partial.fill(0.0)
        projection.accumulate_tod_to_rows(tod, self.local_index, self.weights, split.shared_rows, True, partial)
        if self.position is None:
            out[:] = partial
        else:
            self.to_sorted(partial, out=out)
        start(out)
        partial.fill(0.0)
        projection.accumulate_tod_to_rows(tod, self.local_index, self.weights, split.shared_rows, False, partial)
        # Zero on the shared rows: adding it leaves them as sent. The compute-order map is free again by now.
        out += partial if self.position is None else self.to_sorted(partial, out=compute_map)
        return out


@dataclass
class OperatorSplit:
    """shared_rows [n_local] bool, compute order: the pixel rows a reduction exchanges; local_index as LocalData's."""

    shared_rows: np.ndarray
    local_index: np.ndarray = field(repr=False)

    @property
    def private_fraction(self) -> float:
        """The fraction of the rank's samples in rows no other rank observes (counted on demand)."""
        n = len(self.local_index)
        if n == 0:
            return 0.0
        shared = sum(int(np.count_nonzero(self.shared_rows[self.local_index[first : first + (1 << 22)]]))
                     for first in range(0, n, 1 << 22))
        return float(n - shared) / n


# Local pixels above which the fast path numbers the rows in visit order (see the module docstring): a map
# of 24 bytes a pixel that no longer stays in L2/L3 (as operator_fast.SMALL_MAP_PIXELS). The map's size decides,
# not the samples per pixel: `benchmarks/bench_pixel_order.py` (medians of 11 alternating rounds, CPU clock,
# AMD EPYC, 1 and 2 ranks; docs/results/pixel-order.md), visit over sorted for the operator (permutations
# included) and a whole PCG iteration: 0.97-1.02 and 0.97-1.01 at nside 256 (58,000 to 550,000 local pixels,
# 9 to 22 samples a pixel), 0.82-0.88 and 0.91-0.97 at nside 512 (0.55 to 2.5 M pixels, 5 to 10 a pixel),
# 0.78-0.79 and 0.89-0.91 at nside 1024 (3.8 to 6.6 M pixels, 3.1 to 3.6 a pixel). Below this size the order
# changes nothing but costs its two permutations and 32 bytes a pixel (order, position, the operator's
# compute-order map).
VISIT_ORDER_MIN_LOCAL_PIXELS = 1 << 17


def build_local_data(
    spec: CampaignSpec,
    layout: ChunkLayout,
    chunks: list[Chunk],
    noise: NoiseModel,
    kernels: str = implementation.DEFAULT,
    pixel_order: str = "auto",
    pointing: PointingMode = "cached",
) -> LocalData:
    """Pointing of ``chunks`` (computed here, chunk by chunk, with ``kernels``) and their stationary intervals.

    ``kernels``: an implementation name of :mod:`mapmaker.kernels.implementation`.
    ``pixel_order``: ``"sorted"``, ``"visit"`` or ``"auto"`` (visit order
    above VISIT_ORDER_MIN_LOCAL_PIXELS local pixels with compiled kernels;
    the numpy reference's gathers gain nothing from it).
    ``pointing``: ``"cached"`` keeps float32 weights, ``"recomputed"`` none
    (``solver.pointing``; see the module docstring).

    Memory: the global pixel of each sample is written as int32 (nside <= 8192)
    and turned into the local index in place, so the build peaks at the
    cache's 16 (cached) or 4 (recomputed) bytes per sample plus one chunk's pointing.
    """
    sizes = np.array([c.n_samples for c in chunks], dtype=np.int64)
    chunk_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n_samples = int(chunk_offsets[-1])
    if pointing not in ("cached", "recomputed"):
        raise ValueError(f"unknown pointing mode {pointing!r}")
    pixels = np.empty(n_samples, dtype=index_dtype(spec.pixelization.npix))
    weights = np.empty((n_samples, 3), dtype=np.float32) if pointing == "cached" else None
    kernel_set = implementation.get(kernels)
    pointer = ChunkPointing(spec, layout, kernel_set)
    for chunk, start in zip(chunks, chunk_offsets[:-1].tolist(), strict=True):
        chunk_pixels, chunk_weights = pointer(chunk.time_chunk, chunk.detector)
        pixels[start : start + chunk.n_samples] = chunk_pixels
        if weights is not None:
            weights[start : start + chunk.n_samples] = chunk_weights
        del chunk_pixels, chunk_weights
    local_pixels, local_index = observed_pixels(pixels, spec.pixelization.npix)
    del pixels
    order = position = None
    if pixel_order == "auto":
        large = len(local_pixels) > VISIT_ORDER_MIN_LOCAL_PIXELS
        pixel_order = "visit" if kernel_set.compiled and large else "sorted"
    if pixel_order == "visit":
        order, position = kernel_set.projection.first_visit_order(local_index, len(local_pixels))

    starts, lengths, detectors, indices, interval_offsets = [], [], [], [], [0]
    for chunk, offset in zip(chunks, chunk_offsets[:-1].tolist(), strict=True):
        for start, length, index in noise.chunk_intervals(chunk):
            starts.append(offset + start)
            lengths.append(length)
            detectors.append(chunk.detector)
            indices.append(index)
        interval_offsets.append(len(starts))
    lengths_array = np.array(lengths, dtype=np.int64)
    detectors_array = np.array(detectors, dtype=np.int64)

    # One N^-1 filter per (noise parameters, length): detectors with the same NET, knee, slope and
    # f_min share theirs, so their intervals are filtered together. White weighting needs none.
    filters: dict[tuple[tuple[float, float, float, float], int], int] = {}
    inverse_psds: list[np.ndarray] = []
    half_widths: list[int | None] = []
    filter_error = 0.0
    filter_index = np.zeros(len(lengths), dtype=np.int64)
    noise_diagonal = np.empty(len(lengths), dtype=np.float64)
    inverse_variance = 1.0 / noise.white_variance[detectors_array] if len(lengths) else np.zeros(0)
    for i, (detector, length) in enumerate(zip(detectors, lengths, strict=True)):
        if noise.white_weighting:
            noise_diagonal[i] = inverse_variance[i]
            continue
        key = (noise.parameters(detector), length)
        if key not in filters:
            filters[key] = len(inverse_psds)
            inverse_psd = 1.0 / noise.weighting_psd(detector, length)
            half_width = None
            if spec.solver.noise_filter == "finite":  # see mapmaker.kernels.noise.finite_kernel for the bound
                half_width, inverse_psd, delta = noise_kernels.finite_kernel(
                    inverse_psd, length, spec.solver.noise_filter_tolerance
                )
                filter_error = max(filter_error, delta)
            inverse_psds.append(inverse_psd)
            half_widths.append(half_width)
        filter_index[i] = filters[key]
        noise_diagonal[i] = noise_kernels.inverse_noise_diagonal(inverse_psds[filters[key]], length)

    return LocalData(
        chunks=list(chunks),
        chunk_offsets=chunk_offsets,
        local_pixels=local_pixels,
        local_index=local_index,
        weights=weights,
        interval_starts=np.array(starts, dtype=np.int64),
        interval_lengths=lengths_array,
        interval_detector=detectors_array,
        interval_index=np.array(indices, dtype=np.int64),
        interval_offsets=np.array(interval_offsets, dtype=np.int64),
        filter_index=filter_index,
        inverse_psds=inverse_psds,
        inverse_variance=np.asarray(inverse_variance, dtype=np.float64),
        noise_diagonal=noise_diagonal,
        white=noise.white_weighting,
        order=order,
        position=position,
        kernels=kernel_set,
        half_widths=half_widths if any(half_widths) else None,
        filter_error=filter_error,
        pointer=pointer if weights is None else None,
    )
