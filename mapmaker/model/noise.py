"""The noise model of a spec: stationary intervals, PSDs, N^-1 filters, simulation.

Each chunk is cut into stationary intervals of ``noise.interval_s`` (default:
the whole chunk; an interval never crosses a chunk boundary, and the last
one of a chunk may be shorter). Intervals are numbered globally per detector,
``interval_index = time_chunk * intervals_per_chunk + k``, so the number
does not depend on which rank holds the chunk.

The solve weights with the same PSD the noise was drawn from. When the
realisation simulates no noise (``noise.enabled = false`` or a signal-only
campaign) it weights with the white level ``sigma^2 = NET^2 f_s``.

Each detector has its own NET, knee, slope and f_min: a detector's own value (a TOAST focal-plane file
gives all four, an inline detector may override its NET) or else the campaign-wide ``noise``.
"""
from __future__ import annotations

import numpy as np

from mapmaker.kernels import noise as noise_kernels
from mapmaker.model import rng
from mapmaker.model.decomposition import Chunk, ChunkLayout
from schemas.spec import CampaignSpec


class NoiseModel:
    def __init__(self, spec: CampaignSpec, layout: ChunkLayout):
        noise = spec.noise
        self.sample_rate_hz = spec.focal_plane.sample_rate_hz
        self.simulated = spec.simulates_noise
        detectors = spec.focal_plane.detector_rows

        def each(field: str, default: float) -> np.ndarray:
            """[n_detectors] float64: the detector's own value of ``field``, else ``default``."""
            values = [getattr(d, field) for d in detectors]
            return np.array([default if v is None else v for v in values], dtype=np.float64)

        self.white_variance = each("net_k_sqrt_s", noise.net_k_sqrt_s) ** 2 * self.sample_rate_hz  # [n_det] K^2
        self.f_knee_hz = each("f_knee_hz", noise.f_knee_hz)  # [n_det] Hz
        self.alpha = each("alpha", noise.alpha)  # [n_det]
        self.f_min_hz = each("f_min_hz", noise.f_min_hz)  # [n_det] Hz
        per_interval = layout.samples_per_chunk
        if noise.interval_s is not None:
            per_interval = min(per_interval, max(1, round(noise.interval_s * self.sample_rate_hz)))
        self.samples_per_interval = per_interval
        self.intervals_per_chunk = -(-layout.samples_per_chunk // per_interval)

    @property
    def white_weighting(self) -> bool:
        """True when N^-1 is diagonal: no noise simulated, or no 1/f part."""
        return not self.simulated or not bool(np.any(self.f_knee_hz > 0))

    def parameters(self, detector: int) -> tuple[float, float, float, float]:
        """``(sigma^2, f_knee, alpha, f_min)`` of ``detector``: equal tuples, equal PSDs."""
        return (
            float(self.white_variance[detector]),
            float(self.f_knee_hz[detector]),
            float(self.alpha[detector]),
            float(self.f_min_hz[detector]),
        )

    def chunk_intervals(self, chunk: Chunk) -> list[tuple[int, int, int]]:
        """``(first sample within the chunk, length, global interval index)`` of each interval of a chunk."""
        intervals = []
        for k, start in enumerate(range(0, chunk.n_samples, self.samples_per_interval)):
            length = min(self.samples_per_interval, chunk.n_samples - start)
            intervals.append((start, length, chunk.time_chunk * self.intervals_per_chunk + k))
        return intervals

    def psd(self, detector: int, n: int) -> np.ndarray:
        """PSD [n // 2 + 1] (K^2) of an n-sample interval of ``detector`` (the simulated one)."""
        frequencies = noise_kernels.rfft_frequencies(n, self.sample_rate_hz)
        sigma2, f_knee, alpha, f_min = self.parameters(detector)
        return noise_kernels.psd(frequencies, sigma2, f_knee, alpha, f_min)

    def weighting_psd(self, detector: int, n: int) -> np.ndarray:
        """PSD the solve weights with: the simulated one, or white when no noise is simulated."""
        if self.simulated:
            return self.psd(detector, n)
        return np.full(n // 2 + 1, self.white_variance[detector])

    def simulate_chunk(self, chunk: Chunk, campaign_seed: int, realization: int) -> np.ndarray:
        """Noise TOD [n_samples] (K) of one chunk; each interval from its own Philox stream."""
        tod = np.empty(chunk.n_samples, dtype=np.float64)
        for start, length, interval in self.chunk_intervals(chunk):
            key = rng.noise_key(campaign_seed, realization, chunk.detector, interval)
            normals = rng.generator(key).standard_normal(length)
            tod[start : start + length] = noise_kernels.noise_from_normals(normals, self.psd(chunk.detector, length))
        return tod
