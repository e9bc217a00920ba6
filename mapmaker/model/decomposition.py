"""Chunks and their assignment to ranks.

The observation is cut, per detector, into chunks of ``scan.chunk_s`` (the
last one may be shorter). A *chunk* here is one (time chunk, detector) pair,
the unit of data distribution; chunks are numbered **time-major**: all
detectors of time chunk 0, then all of time chunk 1, and so on
(``chunk_id = time_chunk * n_detectors + detector``). Consecutive chunk ids
are assigned to consecutive ranks, balanced by sample count.

Why time-major: a rank then holds a contiguous stretch of the observation
for (nearly) all detectors, so it computes each boresight chunk once and
shares it among its detectors, and its pixels are the sky seen during one
time span -- the ranks overlap only where the scan revisits the sky
(cross-linking), the structure the paper's sparse reduction exploits.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from schemas.spec import CampaignSpec

DECOMPOSITION_VERSION = 1


@dataclass(frozen=True)
class Chunk:
    """One detector over one time chunk: samples ``first_sample .. first_sample + n_samples`` of that detector."""

    chunk_id: int
    time_chunk: int
    detector: int
    first_sample: int
    n_samples: int


@dataclass(frozen=True)
class ChunkLayout:
    """How the observation is cut: ``n_time_chunks`` chunks of ``samples_per_chunk`` (the last may be shorter)."""

    n_detectors: int
    samples_per_detector: int
    samples_per_chunk: int

    @property
    def n_time_chunks(self) -> int:
        return -(-self.samples_per_detector // self.samples_per_chunk)

    @property
    def n_chunks(self) -> int:
        return self.n_time_chunks * self.n_detectors

    def time_chunk_bounds(self, time_chunk: int) -> tuple[int, int]:
        """(first sample, number of samples) of a time chunk."""
        first = time_chunk * self.samples_per_chunk
        return first, min(self.samples_per_chunk, self.samples_per_detector - first)

    def chunk(self, chunk_id: int) -> Chunk:
        time_chunk, detector = divmod(chunk_id, self.n_detectors)
        first, n = self.time_chunk_bounds(time_chunk)
        return Chunk(chunk_id, time_chunk, detector, first, n)

    def chunk_samples(self) -> np.ndarray:
        """Samples of every chunk, [n_chunks] int64, in chunk-id order."""
        per_time = np.full(self.n_time_chunks, self.samples_per_chunk, dtype=np.int64)
        per_time[-1] = self.samples_per_detector - (self.n_time_chunks - 1) * self.samples_per_chunk
        return np.repeat(per_time, self.n_detectors)


def chunk_layout(spec: CampaignSpec) -> ChunkLayout:
    rate = spec.focal_plane.sample_rate_hz
    samples_per_chunk = max(1, round(spec.scan.chunk_s * rate))
    return ChunkLayout(
        n_detectors=len(spec.focal_plane.detector_rows),
        samples_per_detector=spec.samples_per_detector,
        samples_per_chunk=min(samples_per_chunk, spec.samples_per_detector),
    )


@dataclass(frozen=True)
class Decomposition:
    """Rank ``r`` owns chunk ids ``ranges[r][0] .. ranges[r][1] - 1`` (possibly none)."""

    layout: ChunkLayout
    ranges: tuple[tuple[int, int], ...]

    @property
    def n_ranks(self) -> int:
        return len(self.ranges)

    def chunks_of(self, rank: int) -> list[Chunk]:
        first, end = self.ranges[rank]
        return [self.layout.chunk(chunk_id) for chunk_id in range(first, end)]

    def samples_of(self, rank: int) -> int:
        first, end = self.ranges[rank]
        return int(self.layout.chunk_samples()[first:end].sum())


def decompose(layout: ChunkLayout, n_ranks: int) -> Decomposition:
    """Contiguous ranges of chunk ids, balanced by sample count.

    Chunk ``i`` goes to rank ``floor(n_ranks * m_i / total)`` where ``m_i`` is
    the sample count up to the middle of the chunk: ranges are contiguous and
    ordered, every chunk is assigned once, and each rank's load is within
    one chunk of ``total / n_ranks``. With fewer chunks than ranks some ranks
    own nothing (they still take part in every collective).
    """
    if n_ranks < 1:
        raise ValueError("n_ranks must be at least 1")
    samples = layout.chunk_samples()
    total = int(samples.sum())
    middles = np.cumsum(samples) - 0.5 * samples
    owner = np.minimum((n_ranks * middles // total).astype(np.int64), n_ranks - 1)
    bounds = np.searchsorted(owner, np.arange(n_ranks + 1), side="left")
    ranges = tuple((int(bounds[r]), int(bounds[r + 1])) for r in range(n_ranks))
    return Decomposition(layout=layout, ranges=ranges)


def decomposition_fingerprint(decomposition: Decomposition) -> str:
    """SHA-256 (hex) of which chunks each rank owns, with the chunk layout that names them.

    Two runs with the same fingerprint distribute the same samples to the
    same ranks; an overlap plan built for one is valid for the other.
    """
    layout = decomposition.layout
    record = {
        "version": DECOMPOSITION_VERSION,
        "order": "time-major",
        "n_detectors": layout.n_detectors,
        "samples_per_detector": layout.samples_per_detector,
        "samples_per_chunk": layout.samples_per_chunk,
        "ranges": [list(r) for r in decomposition.ranges],
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
