"""Peak memory per rank scales with the samples *per rank*, not with the total (fast kernels).

The bound stated in README ("Memory") and mapmaker/solve/local_data.py, issue 35's figure for the
default configuration:

    peak RSS per rank <= baseline + 24 bytes x samples per rank + 32 MiB

where the baseline is the same program on a tiny observation (interpreter,
imports, numba and the compiled kernels, MPI), 24 bytes covers the pointing
cache (16: an int32 pixel and float32 weights), the operator's batch buffer
(bounded: 2 MiB at nside 16) and headroom, and the 32 MiB covers per-chunk
buffers and map-sized arrays at nside 16. ``peak_memory_mb`` is the RSS
high-water mark (getrusage ru_maxrss) of each rank.
"""
import pytest
from mpi_support import realize

from schemas.result import RealizationResult

pytestmark = pytest.mark.mpi

SPEC = """
name = "memory"
kind = "noise-only"
realizations = 1
seed = 5

[scan]
kind = "satellite"
duration_s = DURATION
chunk_s = 1500.0
drift_deg_per_day = 360.0

[focal_plane]
sample_rate_hz = 50.0
detectors = [
  { name = "A0", offset_x_deg = 1.0, pol_angle_deg = 0.0 },
  { name = "B0", offset_x_deg = 1.0, pol_angle_deg = 90.0 },
  { name = "A1", offset_x_deg = -1.0, pol_angle_deg = 45.0 },
  { name = "B1", offset_x_deg = -1.0, pol_angle_deg = 135.0 },
]

[pixelization]
nside = 16

[sky]
kind = "none"

[noise]
net_k_sqrt_s = 100e-6
f_knee_hz = 0.1
alpha = 1.0
f_min_hz = 1e-3

[solver]
tol = 1e-12
max_iter = 4
"""

SAMPLES_PER_SECOND = 4 * 50.0
BYTES_PER_SAMPLE = 24
SLACK_MIB = 32


def peak(tmp_path, name: str, ranks: int, duration_s: float) -> tuple[float, int]:
    spec = tmp_path / f"{name}.toml"
    spec.write_text(SPEC.replace("DURATION", repr(duration_s)))
    out = tmp_path / name
    completed = realize(ranks, spec, 0, out, "--quiet", "--kernels", "fast")
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = RealizationResult.model_validate_json((out / "result.json").read_text())
    assert result.kernels == "fast"
    return result.peak_memory_mb.max, result.samples // ranks


def test_peak_memory_per_rank_is_bounded_by_the_samples_per_rank(tmp_path):
    baseline, _ = peak(tmp_path, "tiny", 1, 1500.0)  # 300,000 samples: the program's own footprint
    one_rank, per_rank = peak(tmp_path, "one", 1, 15_000.0)  # 3,000,000 samples on one rank
    two_ranks, per_rank_2 = peak(tmp_path, "two", 2, 30_000.0)  # twice the samples, the same per rank
    assert per_rank == per_rank_2 == 3_000_000
    bound = baseline + (BYTES_PER_SAMPLE * per_rank) / 2**20 + SLACK_MIB
    assert one_rank <= bound, (one_rank, baseline, bound)
    assert two_ranks <= bound, (two_ranks, baseline, bound)
    # Twice the total samples on twice the ranks: the peak per rank stays (within 10% of the per-sample part).
    assert abs(two_ranks - one_rank) <= 0.1 * (BYTES_PER_SAMPLE * per_rank) / 2**20 + 16, (one_rank, two_ranks)
