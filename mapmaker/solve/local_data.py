"""One rank's share of the observation, held for the length of one solve.

A rank computes the pointing of *its own* chunks on the fly (never the
whole campaign's) and caches, for the duration of the solve, the local
pixel index and the IQU weights of each of its samples: 28 bytes per
sample (``local_index`` int32, 4 bytes; ``weights`` 3 x float64, 24
bytes). Every PCG iteration applies P and P^T, and the cache pays: reading
28 bytes costs ~2 ns per sample at this machine's ~15 GB/s, recomputing
the pointing (quaternions, atan2, vec2pix) ~40 ns with the fast kernels
and ~110 ns with numpy (``python -m mapmaker bench`` prints both rates).
Weights stay float64 so that P is exact to round-off; float32 weights or
a float32 psi would save 12-20 bytes per sample but change the model at
1e-7. The cut pixels' samples are marked by zero weights, and whether a
sample is cut is looked up from the per-pixel ``cut`` mask, not stored per
sample.

The TOD is never cached: it is simulated chunk by chunk to form
``b = P^T N^-1 d`` and dropped, and the fast PCG operator
(:mod:`mapmaker.kernels.operator_fast`) applies ``P^T N^-1 P`` in batches
of intervals through a per-thread buffer, so no TOD-sized scratch exists
during the solve either (the numpy reference keeps one, 8 bytes per
sample). Peak memory per rank is therefore about 28 bytes per local
sample plus a few full-map arrays, whatever the total number of samples
(per-sample weights for the preconditioner are made per slab of intervals).

Map rows. Pixel vectors leave and enter this class in the order of
``local_pixels`` (sorted global ids: what the reductions, dot products
and products use). Inside, with the fast kernels and many samples per
pixel, ``local_index`` counts the pixels in the order the samples first
visit them (``order``, made by
:func:`mapmaker.kernels.projection_fast.first_visit_order`): the gathers and
scatters of P and P^T then stay within few cache lines (P 1.7x faster at
nside 256). :meth:`to_compute` / :meth:`to_sorted` convert, twice per PCG
iteration; each is a random-access pass over the local map (~100 ns per
pixel once the map outgrows the caches), so the renumbering pays only
above ~100 samples per local pixel (``pixel_order="auto"``). Otherwise,
and always with the numpy reference, rows stay sorted (``order`` None).

The samples of the rank's chunks are concatenated in chunk-id order into
flat arrays; stationary intervals tile them without overlap.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mapmaker.model.decomposition import Chunk, ChunkLayout
from mapmaker.kernels import noise as noise_kernels
from mapmaker.kernels.implementation import DEFAULT as DEFAULT_KERNELS
from mapmaker.model.noise import NoiseModel
from mapmaker.model.scan import ChunkPointing
from schemas.spec import CampaignSpec

SLAB_SAMPLES = 1 << 22  # samples whose per-sample N^-1 diagonal exists at once (32 MiB)


@dataclass
class LocalData:
    """Cached pointing and interval layout of one rank.

    chunks: the rank's chunks in chunk-id order; chunk_offsets [n_chunks + 1]
    int64 into the flat sample arrays; local_pixels [n_local] int64 sorted
    unique global pixel ids; local_index [n_samp] int32 (int64 beyond 2^31
    local pixels): each sample's row in *compute order*, the sorted order
    permuted by ``order`` [n_local] int64 (compute row -> sorted row; None:
    the identity) whose inverse is ``position``; weights [n_samp, 3] float64
    (rows of cut samples are zero); cut [n_local] bool, compute order
    (pixels left out of the solve); kernels:
    ``"fast"`` or ``"numpy"`` (:mod:`mapmaker.kernels.implementation`) for
    N^-1 and the PCG operator; intervals: starts / lengths /
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
    weights: np.ndarray
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
    kernels: str = DEFAULT_KERNELS
    _circulant: list | None = field(default=None, repr=False)
    _scratch_tod: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_samples(self) -> int:
        return len(self.local_index)

    @property
    def n_local(self) -> int:
        return len(self.local_pixels)

    def sample_noise_diagonal(self) -> np.ndarray:
        """Diagonal of N^-1 per sample, [n_samp] (K^-2)."""
        return np.repeat(self.noise_diagonal, self.interval_lengths)

    def to_compute(self, rows: np.ndarray) -> np.ndarray:
        """Pixel rows [n_local, ...] from sorted order to compute order (``rows`` itself when they agree)."""
        return rows if self.order is None else rows[self.order]

    def to_sorted(self, rows: np.ndarray) -> np.ndarray:
        """Pixel rows [n_local, ...] from compute order back to sorted order."""
        return rows if self.position is None else rows[self.position]

    @property
    def _kernels(self):
        from mapmaker.kernels.implementation import get

        return get(self.kernels)

    def accumulate_blocks(self, noise_weighted: bool) -> np.ndarray:
        """Packed 3x3 blocks [n_local, 6], sorted order: geometric, or weighted by the diagonal of N^-1.

        The weighted sum runs over slabs of whole intervals of at most
        ``SLAB_SAMPLES`` samples, so that the per-sample weights exist for
        one slab at a time (8 bytes per slab sample, not per rank sample).
        """
        accumulate = self._kernels.blocks.accumulate_blocks
        if not noise_weighted:
            return self.to_sorted(accumulate(self.local_index, self.weights, self.n_local))
        blocks = np.zeros((self.n_local, 6))
        for first, stop in self._interval_slabs():
            samples = slice(int(self.interval_starts[first]), int(self.interval_starts[stop - 1] + self.interval_lengths[stop - 1]))
            sample_weight = np.repeat(self.noise_diagonal[first:stop], self.interval_lengths[first:stop])
            blocks += accumulate(self.local_index[samples], self.weights[samples], self.n_local, sample_weight)
        return self.to_sorted(blocks)

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

    def project(self, local_map: np.ndarray, samples: slice, out: np.ndarray) -> np.ndarray:
        """P on the samples ``samples``: local_map [n_local, 3] in *compute* order -> out [n]."""
        return self._kernels.projection.project_map_to_tod(
            local_map, self.local_index[samples], self.weights[samples], out=out
        )

    def accumulate(self, tod: np.ndarray, samples: slice, out: np.ndarray) -> np.ndarray:
        """P^T of the samples ``samples`` added into out [n_local, 3], *compute* order."""
        return self._kernels.projection.accumulate_tod_to_map(
            tod, self.local_index[samples], self.weights[samples], self.n_local, out=out
        )

    def exclude_pixels(self, cut: np.ndarray) -> int:
        """Leave the samples of cut local pixels (``cut`` [n_local] bool, sorted order) out of the solve.

        Returns their count. Their weights become zero (P gives 0, P^T
        ignores them) and :meth:`excluded_in` marks them so that their data
        are zeroed before N^-1.
        """
        self.cut = self.to_compute(np.asarray(cut, dtype=bool))
        excluded = self.cut[self.local_index]
        self.weights[excluded] = 0.0
        return int(excluded.sum())

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
    def circulant_filters(self) -> list:
        """The fast kernels' N^-1 filters (:class:`~mapmaker.kernels.noise_fast.CirculantFilter`), made once.

        One per filter in use (each filter serves one interval length); ``None`` for filters no interval uses.
        """
        if self._circulant is None:
            from mapmaker.kernels.noise_fast import CirculantFilter

            lengths = {int(f): int(n) for f, n in zip(self.filter_index.tolist(), self.interval_lengths.tolist(), strict=True)}
            self._circulant = [
                CirculantFilter(inverse, lengths[f]) if f in lengths else None
                for f, inverse in enumerate(self.inverse_psds)
            ]
        return self._circulant

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
            return noise_kernels.apply_inverse_white(tod, starts, lengths, self.inverse_variance[intervals])
        if self.kernels == "fast":
            from mapmaker.kernels import noise_fast

            return noise_fast.apply_inverse_noise(
                tod, starts, lengths, self.filter_index[intervals], self.circulant_filters, threads=workers
            )
        return noise_kernels.apply_inverse_noise(
            tod, starts, lengths, self.filter_index[intervals], self.inverse_psds, workers=workers
        )

    def apply_operator(self, local_map: np.ndarray, workers: int = 1, out: np.ndarray | None = None) -> np.ndarray:
        """The PCG operator ``P^T N^-1 P`` on a local map [n_local, 3] -> [n_local, 3], sorted order.

        Fast kernels: fused per interval (:mod:`mapmaker.kernels.operator_fast`),
        no TOD-sized scratch, in compute order between two row permutations.
        Numpy: P, N^-1 and P^T one after the other through a TOD scratch
        array [n_samp] kept between calls. ``out`` (sorted order) is overwritten.
        """
        if self.kernels == "fast":
            from mapmaker.kernels import operator_fast

            compute_map = self.to_compute(local_map)
            straight_into_out = out if self.position is None else None  # no permutation after: write out directly
            if self.white:
                product = operator_fast.apply_white_operator(
                    compute_map, self.local_index, self.weights, self.interval_starts, self.interval_lengths,
                    self.inverse_variance, out=straight_into_out,
                )
            else:
                product = operator_fast.apply_inverse_noise_operator(
                    compute_map, self.local_index, self.weights, self.interval_starts, self.interval_lengths,
                    self.filter_index, self.circulant_filters, threads=workers, out=straight_into_out,
                )
            if out is None:
                return self.to_sorted(product)
            if product is not out:
                out[:] = self.to_sorted(product)
            return out
        from mapmaker.kernels import projection

        if self._scratch_tod is None:
            self._scratch_tod = np.empty(self.n_samples)
        tod = projection.project_map_to_tod(local_map, self.local_index, self.weights, out=self._scratch_tod)
        self.apply_inverse_noise(tod, workers)
        if out is None:
            return projection.accumulate_tod_to_map(tod, self.local_index, self.weights, self.n_local)
        out[:] = 0.0
        return projection.accumulate_tod_to_map(tod, self.local_index, self.weights, self.n_local, out=out)


def index_dtype(n: int) -> type:
    """int32 while ``n`` values fit, int64 beyond."""
    return np.int32 if n < 2**31 - 1 else np.int64


OBSERVED_PIXELS_BLOCK = 1 << 20  # samples per block of observed_pixels' sparse path


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by one sort: numpy 2.4's ``np.unique`` without ``return_inverse``
    hashes, then sorts the distinct values: 28x slower on 1M int32 pixel ids of 12M (measured)."""
    ordered = np.sort(values)
    if len(ordered) == 0:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def observed_pixels(pixels: np.ndarray, npix: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique pixel ids [n_local] int64 and each sample's position among them [n_samp].

    The positions are int32 (int64 beyond 2^31 local pixels), written over
    ``pixels`` when that is an int32 array (no sample-sized temporary). A
    lookup table over the whole map (5 bytes per pixel) when the map is not
    much larger than the samples -- ten times faster than sorting them.
    Otherwise (high nside, few samples per rank) block by block: the unique
    pixels of each block of samples, then of their union, then each block's
    positions by binary search (the block sorted first). That holds the
    blocks' unique ids (at most one per sample, in ``pixels``' dtype) instead
    of ``np.unique(..., return_inverse=True)``'s ~36 bytes per sample (a sort
    permutation, a sorted copy and an int64 inverse).
    """
    if npix <= 4 * len(pixels):
        seen = np.zeros(npix, dtype=bool)
        seen[pixels] = True
        local_pixels = np.flatnonzero(seen).astype(np.int64)
        del seen
        dtype = index_dtype(len(local_pixels))
        lookup = np.empty(npix, dtype=dtype)
        lookup[local_pixels] = np.arange(len(local_pixels), dtype=dtype)
        out = pixels if pixels.dtype == dtype else np.empty(len(pixels), dtype=dtype)
        step = 1 << 20
        for first in range(0, len(pixels), step):
            out[first : first + step] = lookup[pixels[first : first + step]]
        return local_pixels, out
    step = OBSERVED_PIXELS_BLOCK
    blocks = [sorted_unique(pixels[first : first + step]) for first in range(0, len(pixels), step)]
    local_pixels = sorted_unique(np.concatenate(blocks)) if blocks else np.zeros(0, dtype=pixels.dtype)
    del blocks
    dtype = index_dtype(len(local_pixels))
    out = pixels if pixels.dtype == dtype else np.empty(len(pixels), dtype=dtype)
    for first in range(0, len(pixels), step):
        block = pixels[first : first + step]
        order = np.argsort(block, kind="stable")
        # Needles in increasing order let the binary search start from the previous answer.
        out[first : first + step][order] = np.searchsorted(local_pixels, block[order])
    return local_pixels.astype(np.int64, copy=False), out


# Samples per local pixel above which the fast path renumbers pixels in visit order (see the module docstring).
VISIT_ORDER_SAMPLES_PER_PIXEL = 100


def build_local_data(
    spec: CampaignSpec,
    layout: ChunkLayout,
    chunks: list[Chunk],
    noise: NoiseModel,
    kernels: str = DEFAULT_KERNELS,
    pixel_order: str = "auto",
) -> LocalData:
    """Pointing of ``chunks`` (computed here, chunk by chunk, with ``kernels``) and their stationary intervals.

    ``pixel_order``: ``"sorted"``, ``"visit"`` (fast kernels only) or
    ``"auto"`` (visit order above VISIT_ORDER_SAMPLES_PER_PIXEL samples per
    local pixel with the fast kernels).

    Memory: the global pixel of each sample is written as int32 (nside <= 8192)
    and turned into the local index in place, so the build peaks at the
    cache's 28 bytes per sample plus one chunk's pointing.
    """
    sizes = np.array([c.n_samples for c in chunks], dtype=np.int64)
    chunk_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n_samples = int(chunk_offsets[-1])
    pixels = np.empty(n_samples, dtype=index_dtype(spec.pixelization.npix))
    weights = np.empty((n_samples, 3), dtype=np.float64)
    pointer = ChunkPointing(spec, layout, kernels)
    for chunk, start in zip(chunks, chunk_offsets[:-1].tolist(), strict=True):
        pixels[start : start + chunk.n_samples], weights[start : start + chunk.n_samples] = pointer(
            chunk.time_chunk, chunk.detector
        )
    local_pixels, local_index = observed_pixels(pixels, spec.pixelization.npix)
    del pixels
    order = position = None
    if pixel_order == "auto":
        many = len(local_index) >= VISIT_ORDER_SAMPLES_PER_PIXEL * len(local_pixels)
        pixel_order = "visit" if kernels == "fast" and many else "sorted"
    if pixel_order == "visit":
        from mapmaker.kernels.projection_fast import first_visit_order

        order, position = first_visit_order(local_index, len(local_pixels))

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

    # One N^-1 filter per (white level, length): detectors without a NET override share
    # theirs, so their intervals are filtered together. White weighting needs none.
    filters: dict[tuple[float, int], int] = {}
    inverse_psds: list[np.ndarray] = []
    filter_index = np.zeros(len(lengths), dtype=np.int64)
    noise_diagonal = np.empty(len(lengths), dtype=np.float64)
    inverse_variance = 1.0 / noise.white_variance[detectors_array] if len(lengths) else np.zeros(0)
    for i, (detector, length) in enumerate(zip(detectors, lengths, strict=True)):
        if noise.white_weighting:
            noise_diagonal[i] = inverse_variance[i]
            continue
        key = (float(noise.white_variance[detector]), length)
        if key not in filters:
            filters[key] = len(inverse_psds)
            inverse_psds.append(1.0 / noise.weighting_psd(detector, length))
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
        kernels=kernels,
    )
