"""One rank's share of the observation, held for the length of one solve.

A rank computes the pointing of *its own* chunks on the fly (never the
whole campaign's) and caches, for the duration of the solve, the local
pixel index and the IQU weights of each of its samples: every PCG
iteration applies P and P^T, and recomputing the pointing each time would
cost more than the ~32 bytes per sample the cache takes. The TOD itself
is not cached: it is simulated chunk by chunk to form ``b = P^T N^-1 d``
and dropped.

The samples of the rank's chunks are concatenated in chunk-id order into
flat arrays; stationary intervals tile them without overlap.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mapmaker.decomposition import Chunk, ChunkLayout
from mapmaker.kernels import noise as noise_kernels
from mapmaker.noise import NoiseModel
from mapmaker.scan import ChunkPointing
from schemas.spec import CampaignSpec


@dataclass
class LocalData:
    """Cached pointing and interval layout of one rank.

    chunks: the rank's chunks in chunk-id order; chunk_offsets [n_chunks + 1]
    int64 into the flat sample arrays; local_pixels [n_local] int64 sorted
    unique global pixel ids; local_index [n_samp] int64; weights [n_samp, 3]
    float64 (rows of cut samples are zero); intervals: starts / lengths /
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
    excluded: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def n_samples(self) -> int:
        return len(self.local_index)

    @property
    def n_local(self) -> int:
        return len(self.local_pixels)

    def sample_noise_diagonal(self) -> np.ndarray:
        """Diagonal of N^-1 per sample, [n_samp] (K^-2)."""
        return np.repeat(self.noise_diagonal, self.interval_lengths)

    def exclude_pixels(self, cut: np.ndarray) -> int:
        """Leave the samples of cut local pixels (``cut`` [n_local] bool) out of the solve; returns their count.

        Their weights become zero (P gives 0, P^T ignores them) and
        ``excluded`` marks them so that their data are zeroed before N^-1.
        """
        self.excluded = cut[self.local_index]
        self.weights[self.excluded] = 0.0
        return int(self.excluded.sum())

    def apply_inverse_noise(self, tod: np.ndarray, workers: int = 1) -> np.ndarray:
        """N^-1 in place on the rank's whole flat TOD [n_samp]."""
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
        return noise_kernels.apply_inverse_noise(
            tod, starts, lengths, self.filter_index[intervals], self.inverse_psds, workers=workers
        )


def observed_pixels(pixels: np.ndarray, npix: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique pixel ids [n_local] int64 and each sample's position among them [n_samp] int64.

    A lookup table over the whole map (9 bytes per pixel) when the map is not
    much larger than the samples -- ten times faster than sorting them --
    and ``np.unique`` otherwise.
    """
    if npix <= 4 * len(pixels):
        seen = np.zeros(npix, dtype=bool)
        seen[pixels] = True
        local_pixels = np.flatnonzero(seen).astype(np.int64)
        lookup = np.empty(npix, dtype=np.int64)
        lookup[local_pixels] = np.arange(len(local_pixels), dtype=np.int64)
        return local_pixels, lookup[pixels]
    local_pixels, local_index = np.unique(pixels, return_inverse=True)
    return local_pixels.astype(np.int64, copy=False), local_index.astype(np.int64, copy=False).reshape(-1)


def build_local_data(spec: CampaignSpec, layout: ChunkLayout, chunks: list[Chunk], noise: NoiseModel) -> LocalData:
    """Pointing of ``chunks`` (computed here, chunk by chunk) and their stationary intervals."""
    sizes = np.array([c.n_samples for c in chunks], dtype=np.int64)
    chunk_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n_samples = int(chunk_offsets[-1])
    pixels = np.empty(n_samples, dtype=np.int64)
    weights = np.empty((n_samples, 3), dtype=np.float64)
    pointer = ChunkPointing(spec, layout)
    for chunk, start in zip(chunks, chunk_offsets[:-1].tolist(), strict=True):
        pixels[start : start + chunk.n_samples], weights[start : start + chunk.n_samples] = pointer(
            chunk.time_chunk, chunk.detector
        )
    local_pixels, local_index = observed_pixels(pixels, spec.pixelization.npix)
    del pixels

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
        excluded=np.zeros(n_samples, dtype=bool),
    )
