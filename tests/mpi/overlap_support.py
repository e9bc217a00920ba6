"""What the overlap MPI tests share: a small spec and the ``preprocess`` command."""
from mpi_support import run_ranks

# nside 16 satellite, 4 detectors x 2 hours at 5 Hz, 32 chunks: seconds per run.
SPEC = """
name = "overlap plan test"
kind = "signal+noise"
realizations = 3
seed = 99

[scan]
kind = "satellite"
duration_s = 7200.0
chunk_s = 900.0
spin_period_s = 60.0
spin_angle_deg = 50.0
precession_period_s = 600.0
precession_angle_deg = 45.0
drift_deg_per_day = 2880.0

[focal_plane]
sample_rate_hz = 5.0
detectors = [
  { name = "A0", offset_x_deg = 1.0, pol_angle_deg = 0.0 },
  { name = "B0", offset_x_deg = 1.0, pol_angle_deg = 90.0 },
  { name = "A1", offset_x_deg = -1.0, pol_angle_deg = 45.0 },
  { name = "B1", offset_x_deg = -1.0, pol_angle_deg = 135.0 },
]

[pixelization]
nside = 16

[sky]
kind = "cmb"
seed = 4
fwhm_arcmin = 300.0

[noise]
net_k_sqrt_s = 100e-6
f_knee_hz = 0.5
alpha = 1.0
f_min_hz = 1e-3
interval_s = 300.0

[solver]
tol = 1e-10
max_iter = 500
allreduce_buffer_pixels = 1000
reduction = "allreduce"
"""


def write_spec(folder, name="spec.toml", **replace):
    text = SPEC
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = folder / name
    path.write_text(text)
    return path


def preprocess(ranks, spec, out, *extra):
    return run_ranks(ranks, "-m", "mapmaker", "preprocess", "--spec", str(spec), "--out", str(out), *extra, timeout=120)
