"""A TOAST focal plane of 1,000 detectors mapped on 2 ranks: time and peak memory per rank.

    .venv/bin/python benchmarks/bench_focal_plane.py                    # the documented run
    .venv/bin/python benchmarks/bench_focal_plane.py --detectors 100,1000 --duration 600 --json fp.json

TOAST 3 (the test extras) writes its simulated hexagonal focal plane (547 pixels, 1,094 detectors, per-detector
NET 100 uK sqrt(s), knee 0.05 Hz) with ``Focalplane.save_hdf5``; each run takes the first N detectors of that
file (``focal_plane.select.first``) on a satellite scan at 5 Hz, nside 64, signal + 1/f noise, and runs
``mapmaker preprocess`` then ``mapmaker realize --plan`` under ``mpiexec -n RANKS``. Printed per detector
count, side by side: the preprocessing's and the realisation's wall time, the realisation's seconds per
million samples, its PCG iterations, and the peak resident memory per rank (max and mean over ranks, from
the result), with each figure's ratio to the smallest detector count's. One short untimed run goes first so
that compiling the kernels is not counted. Wall clock on whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, write_json
from schemas.files import sha256_file
from schemas.result import RealizationResult

SPEC = """
name = "bench focal plane"
kind = "signal+noise"
realizations = 1
seed = 11

[scan]
kind = "satellite"
duration_s = {duration}
chunk_s = {chunk}
spin_period_s = 60.0
precession_period_s = 3600.0
drift_deg_per_day = 360.0

[focal_plane]
sample_rate_hz = 5.0
file = "hexagon.h5"
sha256 = "{sha256}"
select = {{ first = {detectors} }}

[pixelization]
nside = 64

[sky]
kind = "cmb"
seed = 1

[noise]
interval_s = {chunk}

[solver]
tol = 1e-6
max_iter = 100
reduction = "alltoallv"
"""


def hexagon_focal_plane(path: Path) -> str:
    """TOAST's simulated hexagonal focal plane (547 pixels, 2 detectors each), saved with save_hdf5; its sha256.

    TOAST is imported here, not at the top: ``--help`` works where the test extras are not installed.
    """
    import astropy.units as u
    import toast.io
    from toast.instrument_sim import fake_hexagon_focalplane

    focal_plane = fake_hexagon_focalplane(
        n_pix=547, sample_rate=5.0 * u.Hz, width=10.0 * u.deg, fwhm=10 * u.arcmin,
        psd_net=100e-6 * u.K * u.s**0.5, psd_fknee=0.05 * u.Hz, psd_fmin=1e-4 * u.Hz, psd_alpha=1.0,
    )  # fmt: skip
    with toast.io.H5File(str(path), "w", comm=None) as handle:
        focal_plane.save_hdf5(handle.handle, comm=None)
    return sha256_file(path)


def mpi(ranks: int, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    command = [str(Path(sys.executable).with_name("mpiexec")), "-n", str(ranks), sys.executable, "-m", "mpi4py", *args]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, done


def run_one(folder: Path, sha256: str, detectors: int, ranks: int, duration: float, chunk: float, tag: str = "") -> dict:
    """Preprocess and realise the first ``detectors`` of the file; files named by ``tag`` and the count."""
    spec = folder / f"spec{tag}-{detectors}.toml"
    spec.write_text(SPEC.format(duration=duration, chunk=chunk, sha256=sha256, detectors=detectors))
    plan = folder / f"plan{tag}-{detectors}.bin"
    root = str(folder)
    preprocess_s, _ = mpi(ranks, "-m", "mapmaker", "preprocess", "--spec", str(spec), "--out", str(plan), "--instrument-root", root, "--quiet")
    out = folder / f"out{tag}-{detectors}"
    realize_s, _ = mpi(
        ranks, "-m", "mapmaker", "realize", "--spec", str(spec), "--realization", "0", "--out", str(out),
        "--plan", str(plan), "--instrument-root", root, "--quiet",
    )  # fmt: skip
    result = RealizationResult.model_validate_json((out / "result.json").read_text())
    return {
        "detectors": detectors,
        "ranks": ranks,
        "samples": result.samples,
        "preprocess_s": round(preprocess_s, 3),
        "realize_s": round(realize_s, 3),
        "realization_total_s": round(result.timing.total, 3),
        "s_per_msample": round(result.timing.total / (result.samples / 1e6), 3),
        "iterations": result.iterations,
        "converged": result.converged,
        "peak_memory_mb_max": round(result.peak_memory_mb.max, 1),
        "peak_memory_mb_mean": round(result.peak_memory_mb.mean, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--detectors", default="100,1000", help="detector counts, comma-separated (at most 1094)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--duration", type=float, default=600.0, help="observation length (s) at 5 Hz")
    parser.add_argument("--chunk", type=float, default=300.0, help="chunk length (s)")
    add_json_option(parser)
    args = parser.parse_args()
    counts = [int(part) for part in args.detectors.split(",") if part.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-fp-") as name:
        folder = Path(name)
        sha = hexagon_focal_plane(folder / "hexagon.h5")
        # One untimed run first: the compiled kernels are built and cached by the first process that needs them.
        run_one(folder, sha, min(counts), args.ranks, min(args.duration, 2 * args.chunk), args.chunk, tag="-warmup")
        rows = [run_one(folder, sha, n, args.ranks, args.duration, args.chunk) for n in counts]
    base = rows[0]
    quiet = args.json == "-"
    if not quiet:
        print(f"TOAST focal plane on {args.ranks} ranks, {args.duration:g} s at 5 Hz, nside 64 (ratios: to {base['detectors']} detectors)")
        print(f"{'detectors':>9} {'samples':>10} {'preproc s':>10} {'realize s':>10} {'s/Msample':>10} {'iter':>5} {'peak MiB max/mean':>18} {'x realize':>10} {'x memory':>9}")
        for row in rows:
            print(
                f"{row['detectors']:>9} {row['samples']:>10} {row['preprocess_s']:>10.2f} {row['realize_s']:>10.2f} "
                f"{row['s_per_msample']:>10.3f} {row['iterations']:>5} "
                f"{row['peak_memory_mb_max']:>9.0f}/{row['peak_memory_mb_mean']:<8.0f} "
                f"{row['realize_s'] / base['realize_s']:>10.2f} {row['peak_memory_mb_max'] / base['peak_memory_mb_max']:>9.2f}"
            )
    write_json(args.json, {"benchmark": "focal-plane", "duration_s": args.duration, "chunk_s": args.chunk, "runs": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
