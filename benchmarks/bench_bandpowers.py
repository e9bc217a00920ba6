"""What a campaign pays once (the mode coupling) and what each realisation pays (its bandpowers), per nside.

    .venv/bin/python benchmarks/bench_bandpowers.py                          # nside 64, 128, 256
    .venv/bin/python benchmarks/bench_bandpowers.py --nsides 64 --json bandpowers.json

For each nside: an observed cap of radius 80 deg (fsky 0.41) apodised over ``--apodisation-deg``,
bins of ``--bin-width`` up to lmax = 3 nside - 1 (:mod:`mapmaker.model.bandpowers`). Timed once
per nside: the analysis mask, and the coupling with and without B purification (with the size of
its npz). Timed over ``--realisations`` white-noise IQU maps (the cost does not depend on the
content): the monopole/dipole fit and the decoupled bandpowers with either coupling; printed and
stored as the median and range. ``--harmonic-iterations 3,1,0`` also times the pure bandpowers with each
other count of Jacobi iterations than the products' :data:`~mapmaker.model.bandpowers.HARMONIC_ITERATIONS`
(a design alternative, not a setting) and gives the largest change of their
TT, EE and BB over the reliable bins (ending at or below 2 nside) against the default's, in units of the
default's median over those bins (the noise level of these white-noise maps: a single bin's own value
can be near zero, a pure-B bandpower of one map below ell 20 say, and is no scale for a change). Wall clock, ``--threads`` OpenMP and ducc0 threads (pspy's and
healpy's OpenMP threads spin-wait, so on a busy machine more threads than free cores is slower).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import version

import ducc0
import healpy as hp
import numpy as np
from threadpoolctl import threadpool_limits

from mapmaker.model import bandpowers as bp
from schemas.files import atomic_write_json

DEFAULT_NSIDES = (64, 128, 256)
CAP_RADIUS_DEG = 80.0


def seconds_of(operation: Callable[[], object]) -> tuple[float, object]:
    """Wall-clock seconds of one call of ``operation`` and its result."""
    start = time.perf_counter()
    result = operation()
    return time.perf_counter() - start, result


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_nside(
    nside: int, bin_width: int, apodisation_deg: float, realisations: int, iteration_counts: tuple[int, ...] = ()
) -> dict:
    """One nside's timings (seconds) and sizes (bytes); ``iteration_counts`` as ``--harmonic-iterations``."""
    npix = hp.nside2npix(nside)
    hits = np.zeros(npix)
    hits[hp.query_disc(nside, hp.ang2vec(0.0, 30.0, lonlat=True), math.radians(CAP_RADIUS_DEG))] = 1
    mask_seconds, mask = seconds_of(lambda: bp.analysis_mask(hits, apodisation_deg=apodisation_deg))
    binning = bp.Binning.for_nside(nside, bin_width)
    couplings, coupling_seconds, npz_bytes = {}, {}, {}
    for name, purify_b in (("pure", True), ("naive", False)):
        coupling_seconds[name], couplings[name] = seconds_of(
            lambda purify_b=purify_b: bp.build_coupling(mask, binning, purify_b=purify_b)
        )
        buffer = io.BytesIO()
        couplings[name].write_npz(buffer)
        npz_bytes[name] = buffer.tell()

    generator = np.random.default_rng(nside)
    maps = [generator.standard_normal((3, npix)) for _ in range(realisations)]
    bp.decoupled_bandpowers(maps[0], couplings["pure"])  # first call: pixell's and ducc's set-up
    per_realisation: dict[str, list[float]] = {"monopole_dipole": [], "pure": [], "naive": []}
    for iqu in maps:
        per_realisation["monopole_dipole"].append(
            seconds_of(lambda iqu=iqu: bp.remove_monopole_dipole(iqu[0], mask))[0]
        )
        for name in ("pure", "naive"):
            per_realisation[name].append(
                seconds_of(lambda iqu=iqu, c=couplings[name]: bp.decoupled_bandpowers(iqu, c))[0]
            )
    iterations = []
    for count in (n for n in iteration_counts if n != bp.HARMONIC_ITERATIONS):
        seconds, change = [], dict.fromkeys(("TT", "EE", "BB"), 0.0)
        for iqu in maps:
            elapsed, fewer = seconds_of(
                lambda iqu=iqu, count=count: bp.decoupled_bandpowers(iqu, couplings["pure"], count)
            )
            seconds.append(elapsed)
            default = bp.decoupled_bandpowers(iqu, couplings["pure"]).cb[:, binning.reliable_bins]
            for name, largest in change.items():
                row = bp.SPECTRA.index(name)
                level = float(np.median(np.abs(default[row])))
                change[name] = max(largest, float(np.abs(fewer.cb[row, binning.reliable_bins] - default[row]).max()) / level)
        iterations.append({"iterations": count, "pure_seconds": summary(seconds), "largest_change": change})
    return {
        "nside": nside,
        "lmax": binning.lmax,
        "n_bins": binning.n_bins,
        "fsky": float(np.mean(mask > 0)),
        "mask_seconds": mask_seconds,
        "coupling_seconds": coupling_seconds,
        "coupling_npz_bytes": npz_bytes,
        "realisation_seconds": {name: summary(values) for name, values in per_realisation.items()},
        "fewer_iterations": iterations,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsides", default=",".join(map(str, DEFAULT_NSIDES)), help="comma-separated HEALPix nsides")
    parser.add_argument("--bin-width", type=int, default=16, help="multipoles per bin")
    parser.add_argument("--apodisation-deg", type=float, default=10.0, help="apodisation scale of the mask (degrees)")
    parser.add_argument("--realisations", type=int, default=5, help="maps timed per nside")
    parser.add_argument("--threads", type=int, default=1, help="OpenMP and ducc0 threads")
    parser.add_argument("--harmonic-iterations", default=str(bp.HARMONIC_ITERATIONS),
                        help="comma-separated Jacobi iteration counts to time the pure bandpowers with (module doc)")
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE as JSON")
    args = parser.parse_args(argv)
    try:
        nsides = [int(text) for text in args.nsides.split(",") if text.strip()]
    except ValueError:
        parser.error(f"--nsides: comma-separated integers, got {args.nsides!r}")
    bad = [nside for nside in nsides if nside < 4 or nside & (nside - 1)]
    if bad:
        parser.error(f"--nsides: powers of 2 of at least 4, got {bad}")
    if args.realisations < 1 or args.threads < 1 or args.bin_width < 1:
        parser.error("--realisations, --threads and --bin-width must be at least 1")
    try:
        args.iteration_counts = tuple(int(text) for text in args.harmonic_iterations.split(",") if text.strip())
    except ValueError:
        parser.error(f"--harmonic-iterations: comma-separated integers, got {args.harmonic_iterations!r}")
    if any(count < 0 for count in args.iteration_counts):
        parser.error(f"--harmonic-iterations: counts of at least 0, got {args.harmonic_iterations!r}")

    ducc_threads = ducc0.misc.thread_pool_size()
    ducc0.misc.resize_thread_pool(args.threads)
    try:
        with threadpool_limits(limits=args.threads, user_api="openmp"):
            results = run_and_print(nsides, args)
    finally:
        ducc0.misc.resize_thread_pool(ducc_threads)
    if args.json:
        atomic_write_json(
            args.json,
            {
                "pspy": version("pspy"),
                "healpy": version("healpy"),
                "threads": args.threads,
                "bin_width": args.bin_width,
                "apodisation_deg": args.apodisation_deg,
                "realisations": args.realisations,
                "load_average": os.getloadavg()[0],
                "nsides": results,
            },
        )
    return 0


def run_and_print(nsides: list[int], args: argparse.Namespace) -> list[dict]:
    """Each nside's :func:`bench_nside`, printed as a table row as it finishes."""
    print(
        f"bench_bandpowers: pspy {version('pspy')}, healpy {version('healpy')}, {args.threads} thread(s), "
        f"bins of {args.bin_width}, apodisation {args.apodisation_deg} deg, {args.realisations} realisations, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'nside':>6} {'lmax':>5} {'bins':>5} {'mask s':>8} {'coupling s (pure/naive)':>24} {'npz MB':>7}"
        f" {'per map s (pure/naive)':>23} {'mono+dipole s':>14}"
    )
    results = []
    for nside in nsides:
        result = bench_nside(nside, args.bin_width, args.apodisation_deg, args.realisations, args.iteration_counts)
        results.append(result)
        coupling, per_map = result["coupling_seconds"], result["realisation_seconds"]
        print(
            f"{nside:>6} {result['lmax']:>5} {result['n_bins']:>5} {result['mask_seconds']:>8.3f}"
            f" {coupling['pure']:>11.3f} / {coupling['naive']:<10.3f}"
            f" {result['coupling_npz_bytes']['pure'] / 1e6:>7.2f}"
            f" {per_map['pure']['median']:>10.3f} / {per_map['naive']['median']:<10.3f}"
            f" {per_map['monopole_dipole']['median']:>14.4f}",
            flush=True,
        )
        for fewer in result["fewer_iterations"]:
            change = ", ".join(f"{name} {value:.1e}" for name, value in fewer["largest_change"].items())
            print(f"{'':>6} {fewer['iterations']} Jacobi iteration(s): {fewer['pure_seconds']['median']:.3f} s a map "
                  f"(pure); largest change of the reliable bins against {bp.HARMONIC_ITERATIONS}, over their median: {change}",
                  flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
