"""A realisation at a collaboration's resolution: memory per sample, seconds per iteration, seconds per stage.

    .venv/bin/python benchmarks/bench_resolution.py --json FILE          # nside 512, two sample rates, 1 and 2 ranks
    .venv/bin/python benchmarks/bench_resolution.py --nsides 512,1024     # nside 1024 as well (minutes more)
    .venv/bin/python benchmarks/bench_resolution.py --pointing cached,recomputed
    .venv/bin/python benchmarks/bench_resolution.py --products --ranks 2 --baseline DIR   # the products' share

The problem is the bundled satellite example (``schemas/examples/satellite.toml``) with ``--detectors``
(16) detectors (the example's four, repeated at other focal-plane offsets), ``--hours`` (12) of
observation and a 600 s spin period, at each of ``--nsides`` and at two sample rates (``--rates``; by
default 10 and 30 Hz at nside 512, 6.9 M and 20.7 M samples, scaled with the nside above it: 20 and
60 Hz at 1024): one scan, whose samples along the scan are closer than a pixel at both rates, so the
pixels observed stay (nearly) the same -- the fixed sky coverage of the slope -- and the samples per
pixel change (the local pixel counts are reported). Each run is one realisation (the default reduction,
``auto``) under ``mpiexec -n R`` (``--ranks``) with the block-diagonal preconditioner and exactly ``--iterations`` PCG iterations
(tolerance 1e-30), for each pointing mode (``solver.pointing``), and reports per rank:

* the peak resident memory (VmHWM of ``/proc/self/status``) after the set-up, after the right-hand
  side and after the solve, and the samples on the rank;
* seconds per stage (``mapmaker.solve.timing.STAGES``: sky, pointing, distribution, simulate, coarse,
  solve, gather), the largest over ranks, and seconds per PCG iteration.

``bytes_per_sample`` is the slope of the peak memory per rank between the two sample rates: (peak at
the high rate - peak at the low rate) / (samples per rank at the high rate - at the low rate), each
rank's own, the largest over ranks reported. It leaves out what does not grow with the samples (the
interpreter, the kernels, the maps: rank 0's peak is often its full-sky maps', which on one rank at
nside 1024 hide the samples' share altogether). The samples along the scan are 0.046 deg apart at
10 Hz: closer than a pixel at nside 512 (0.11 deg), not much closer at 1024 (0.057 deg), where 10 and
30 Hz would observe 10% more local pixels at the higher rate and the slope would include those pixels'
map rows (hence 20 and 60 Hz there); compare ``local_pixels_per_rank``. The products
(bandpowers) are not run in these runs (``--products`` runs them); ``--coupling`` times the mode-coupling build of each nside's mask
(``mapmaker.model.bandpowers.build_coupling``, on one process: it is the campaign's once-only cost).

``--products`` runs whole realisations instead (``python -m mapmaker realize`` under ``mpiexec -n R``, at
the first of ``--nsides`` and ``--rates``, with the example's solver: the two-level-additive preconditioner to
1e-6) and reports the products' share of each: the seconds of the ``products`` stage (mask, coupling read,
spectra and bandpowers; the largest over ranks) over the realisation's (``timing.total`` of ``result.json``),
with the ``write`` stage beside it. The first run of each tree builds the mode coupling and the coarse
operator into its own ``--coupling`` and ``--coarse-cache`` files (its ``coupling_build_s`` is the build's
seconds inside a realisation); the next ``--repeat`` runs read both. ``--baseline DIR``: a checkout of
another commit (``git archive COMMIT | tar -x -C DIR``) run the same way, alternately with this tree
(A, B, A, B), so that a shared machine's load falls on both alike.

This is a benchmark, not a test: nothing here asserts on time. On a shared machine the seconds say
as much about the other processes as about the map-maker; the modes run back to back in one
invocation, so compare them as ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, run_ranks_json, write_json
from schemas.io import example_spec_path, load_spec
from schemas.spec import CampaignSpec


def vm_hwm_mib() -> float:
    """This process's peak resident memory so far (VmHWM, MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


SPIN_PERIOD_S = 600.0
STAGE_ORDER = ("sky", "pointing", "distribution", "simulate", "coarse", "solve", "gather")
DEFAULT_RATES_HZ = (10.0, 30.0)  # at nside 512 and below; scaled with the nside above (see rates_for)


def rates_for(nside: int, rates: str | None) -> list[float]:
    """The two sample rates (Hz) of ``nside``'s runs: ``--rates`` when given, else DEFAULT_RATES_HZ times
    ``nside / 512`` from nside 512 up, so that consecutive samples stay closer than a pixel (fixed coverage)."""
    if rates:
        return [float(r) for r in rates.split(",")]
    return [r * max(1, nside // 512) for r in DEFAULT_RATES_HZ]


def bench_spec(nside: int, rate_hz: float, detectors: int, hours: float, pointing: str, iterations: int,
               spin_period_s: float = SPIN_PERIOD_S):
    """The satellite example at ``nside`` and ``rate_hz`` with ``detectors`` detectors, ``hours`` long, spinning
    once in ``spin_period_s`` (the example's own: 60 s)."""
    data = load_spec(example_spec_path("satellite")).model_dump(mode="json", exclude_none=True)
    rows = data["focal_plane"]["detectors"]
    made = []
    for i in range(detectors):
        row = dict(rows[i % len(rows)])
        row["name"] = f"{row['name']}-{i // len(rows)}"
        row["offset_y_deg"] = 0.5 * (i // len(rows))
        made.append(row)
    data["focal_plane"].update(sample_rate_hz=rate_hz, detectors=made)
    data["pixelization"]["nside"] = nside
    data["scan"]["duration_s"] = hours * 3600.0
    # A slow spin (0.46 deg/s on the sky): at 10 Hz the samples along the scan are 0.046 deg apart, closer than a
    # pixel at nside 512 (0.11 deg), so tripling the rate adds samples to the pixels already seen, not pixels
    # (the example's 60 s spin leaves 0.46 deg between samples at 10 Hz: more rate, more pixels).
    data["scan"]["spin_period_s"] = spin_period_s
    data["solver"].update(tol=1e-30, max_iter=iterations, preconditioner="block-diagonal")
    if pointing != "unset":  # "unset": a map-maker without solver.pointing (for a comparison with an older commit)
        data["solver"]["pointing"] = pointing
    return CampaignSpec.model_validate(data)


def run_ranks_here(args: argparse.Namespace) -> dict:
    """Under mpiexec: one realisation set up, its right-hand side and ``--iterations`` PCG iterations."""
    from mpi4py import MPI

    from mapmaker.kernels import implementation
    from mapmaker.solve.realization import right_hand_side, set_up_realization, solve_realization
    from mapmaker.solve.timing import Timers

    comm = MPI.COMM_WORLD
    spec = bench_spec(args.nside, args.rate, args.detectors, args.hours, args.pointing, args.iterations)
    timers = Timers()
    setup = set_up_realization(
        spec, 0, comm, sky_root=None, threads=1, kernels=implementation.get("fast"), plan=None, machine=None,
        timers=timers, say=lambda message: None,
    )
    peaks = {"set_up": vm_hwm_mib()}
    with timers.stage("simulate"):
        b = right_hand_side(setup, timers)
    peaks["right_hand_side"] = vm_hwm_mib()
    comm.Barrier()
    started = time.perf_counter()
    result, _ = solve_realization(setup, timers=timers, say=lambda message: None, b=b)
    solve_seconds = time.perf_counter() - started
    peaks["solve"] = vm_hwm_mib()
    per_rank = comm.gather({"samples": setup.local.n_samples, "local_pixels": setup.local.n_local, "peaks": peaks, "stages": dict(timers.stages),
                            "solve_seconds": solve_seconds}, root=0)
    if comm.Get_rank() != 0:
        return {}
    stages = [name for name in STAGE_ORDER if any(name in rank["stages"] for rank in per_rank)]
    return {
        "nside": args.nside, "rate_hz": args.rate, "ranks": comm.Get_size(), "pointing": args.pointing,
        "samples": spec.total_samples, "samples_per_rank": [r["samples"] for r in per_rank],
        "local_pixels_per_rank": [r["local_pixels"] for r in per_rank],
        "peak_mib": [r["peaks"] for r in per_rank],
        "stage_seconds_max": {name: max(r["stages"].get(name, 0.0) for r in per_rank) for name in stages},
        "reduction": setup.reduction.name,
        "iterations": result.iterations,
        "seconds_per_iteration": max(r["solve_seconds"] for r in per_rank) / max(result.iterations, 1),
    }


def coupling_seconds(nside: int, detectors: int, hours: float) -> float:
    """Seconds to build the mode coupling of the example's analysis mask at ``nside`` (one process)."""
    import numpy as np

    from mapmaker.model import spectra
    from mapmaker.model.bandpowers import build_coupling

    spec = bench_spec(nside, 1.0, detectors, hours, "cached", 1)
    hits = np.full(spec.pixelization.npix, 100, dtype=np.int64)
    iqu = np.zeros((3, spec.pixelization.npix))
    mask = spectra.campaign_mask(spec, iqu, hits)
    started = time.perf_counter()
    build_coupling(mask, spectra.campaign_binning(spec), purify_b=spec.products.purify_b)
    return time.perf_counter() - started


def products_spec_data(nside: int, rate_hz: float, detectors: int, hours: float) -> dict:
    """:func:`bench_spec` with the satellite example's own solver settings (two-level-additive to 1e-6), as JSON data."""
    data = bench_spec(nside, rate_hz, detectors, hours, "cached", 1).model_dump(mode="json", exclude_none=True)
    data["solver"] = load_spec(example_spec_path("satellite")).solver.model_dump(mode="json", exclude_none=True)
    return data


def realize_once(tree: Path, folder: Path, spec_file: Path, realization: int, ranks: int) -> dict:
    """One ``realize`` of ``spec_file`` with the code of ``tree``, its caches in ``folder``: its stage seconds and shares."""
    out = folder / f"r{realization}"
    command = [str(Path(sys.executable).with_name("mpiexec")), "-n", str(ranks), sys.executable, "-m", "mpi4py",
               "-m", "mapmaker", "realize", "--spec", str(spec_file), "--realization", str(realization),
               "--out", str(out), "--coupling", str(folder / "coupling.npz"),
               "--coarse-cache", str(folder / "coarse.npz")]
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    result = json.loads((out / "result.json").read_text())
    stages = {name: spread["max"] for name, spread in result["stages"].items()}
    total = result["timing"]["total"]
    bandpowers = result["spectra"]["bandpowers"]
    return {
        "realization": realization, "ranks": ranks, "iterations": result["iterations"], "total_s": total,
        "stage_seconds_max": stages, "products_share": stages.get("products", 0.0) / total,
        "products_and_write_share": (stages.get("products", 0.0) + stages.get("write", 0.0)) / total,
        "coupling_source": bandpowers["coupling_source"], "coupling_build_s": bandpowers["coupling_build_s"],
        "coarse_source": (result.get("coarse") or {}).get("source"),
    }


def products_share(args: argparse.Namespace) -> dict:
    """``--products``: realisations of this tree (and ``--baseline``), alternately; the first of each builds the caches."""
    nside, ranks = int(args.nsides.split(",")[0]), int(args.ranks.split(",")[0])
    rate = rates_for(nside, args.rates)[0]
    trees = {"this": REPO, **({"baseline": Path(args.baseline).resolve()} if args.baseline else {})}
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-products-") as scratch:
        spec_file = Path(scratch) / "spec.json"
        spec_file.write_text(json.dumps(products_spec_data(nside, rate, args.detectors, args.hours)))
        for realization in range(1 + args.repeat):  # realisation 0 builds the coupling and the coarse operator
            for label, tree in trees.items():
                folder = Path(scratch) / label
                folder.mkdir(exist_ok=True)
                runs.append({"tree": label, **realize_once(tree, folder, spec_file, realization, ranks)})
                print(f"{label} realisation {realization}: {runs[-1]['total_s']:.1f} s, products "
                      f"{runs[-1]['stage_seconds_max'].get('products', 0.0):.1f} s", file=sys.stderr)
    summary = []
    for label in trees:
        cached = [r for r in runs if r["tree"] == label and r["coupling_source"] == "file"]
        built = [r for r in runs if r["tree"] == label and r["coupling_source"] == "built"]
        summary.append({
            "tree": label, "nside": nside, "ranks": ranks, "samples": bench_spec(nside, rate, args.detectors, args.hours, "cached", 1).total_samples,
            "cached_runs": len(cached),
            "total_s_mean": sum(r["total_s"] for r in cached) / len(cached),
            "products_s_mean": sum(r["stage_seconds_max"].get("products", 0.0) for r in cached) / len(cached),
            "products_share_mean": sum(r["products_share"] for r in cached) / len(cached),
            "products_and_write_share_mean": sum(r["products_and_write_share"] for r in cached) / len(cached),
            "coupling_build_s": built[0]["coupling_build_s"] if built else None,
        })
    return {"detectors": args.detectors, "hours": args.hours, "rate_hz": rate, "summary": summary, "runs": runs}


def slopes(runs: list[dict]) -> list[dict]:
    """Bytes per sample per (nside, ranks, pointing): the peak's slope between the lowest and highest rate."""
    rows = []
    keys = sorted({(r["nside"], r["ranks"], r["pointing"]) for r in runs})
    for nside, ranks, pointing in keys:
        group = sorted((r for r in runs if (r["nside"], r["ranks"], r["pointing"]) == (nside, ranks, pointing)),
                       key=lambda r: r["rate_hz"])
        if len(group) < 2:
            continue
        low, high = group[0], group[-1]
        row = {"nside": nside, "ranks": ranks, "pointing": pointing}
        for phase in ("set_up", "right_hand_side", "solve"):
            # Each rank's own slope (rank 0's peak also holds the full-sky maps), the largest reported
            row[f"bytes_per_sample_{phase}"] = max(
                (h[phase] - l[phase]) * 2**20 / (hs - ls)
                for h, l, hs, ls in zip(high["peak_mib"], low["peak_mib"], high["samples_per_rank"],
                                        low["samples_per_rank"], strict=True)
            )
        row["bytes_per_sample"] = row["bytes_per_sample_solve"]
        row["seconds_per_iteration"] = high["seconds_per_iteration"]
        row["seconds_per_iteration_per_megasample"] = high["seconds_per_iteration"] / (max(high["samples_per_rank"]) / 1e6)
        rows.append(row)
    return rows


def print_table(figures: dict) -> None:
    print(f"{'nside':>6} {'ranks':>5} {'pointing':>10} {'B/sample set-up':>16} {'rhs':>6} {'solve':>6} {'s/iter':>8} {'s/iter/M':>9}")
    for row in figures["slopes"]:
        print(f"{row['nside']:>6} {row['ranks']:>5} {row['pointing']:>10} {row['bytes_per_sample_set_up']:>16.1f} "
              f"{row['bytes_per_sample_right_hand_side']:>6.1f} {row['bytes_per_sample_solve']:>6.1f} "
              f"{row['seconds_per_iteration']:>8.3f} {row['seconds_per_iteration_per_megasample']:>9.4f}")
    for run in figures["runs"]:
        stages = ", ".join(f"{name} {run['stage_seconds_max'][name]:.2f}" for name in STAGE_ORDER if name in run["stage_seconds_max"])
        print(f"nside {run['nside']} {run['rate_hz']:g} Hz {run['ranks']} rank(s) {run['pointing']}: "
              f"{run['samples']:,} samples, peak {max(p['solve'] for p in run['peak_mib']):.0f} MiB; stages (s, max over ranks): {stages}")
    for nside, seconds in figures.get("coupling_build_s", {}).items():
        print(f"coupling build at nside {nside}: {seconds:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsides", default="512", help="comma-separated nsides (default 512; 1024 takes minutes more)")
    parser.add_argument("--rates", help="the two sample rates, Hz (default 10,30 at nside 512, scaled with the nside)")
    parser.add_argument("--ranks", default="1,2", help="rank counts, each under mpiexec (default 1,2)")
    parser.add_argument("--detectors", type=int, default=16, help="detectors (default 16)")
    parser.add_argument("--hours", type=float, default=12.0, help="hours observed (default 12)")
    parser.add_argument("--iterations", type=int, default=5, help="PCG iterations per run (default 5)")
    parser.add_argument("--pointing", default="cached,recomputed", help="solver.pointing modes (default both)")
    parser.add_argument("--coupling", action="store_true", help="also time the mode-coupling build per nside")
    parser.add_argument("--products", action="store_true", help="whole realisations: the products' share (module doc)")
    parser.add_argument("--baseline", metavar="DIR", help="with --products: a checkout of another commit, run alternately")
    parser.add_argument("--repeat", type=int, default=2, help="with --products: runs reading the caches per tree (default 2)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nside", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.worker:
        figures = run_ranks_here(args)
        if figures:
            print(json.dumps(figures))
        return 0
    if args.products:
        figures = products_share(args)
        if args.json != "-":
            for row in figures["summary"]:
                print(f"{row['tree']}: nside {row['nside']}, {row['ranks']} ranks: products {row['products_s_mean']:.1f} s of "
                      f"{row['total_s_mean']:.1f} s ({100 * row['products_share_mean']:.0f}%; with the write "
                      f"{100 * row['products_and_write_share_mean']:.0f}%), coupling built in {row['coupling_build_s']:.1f} s")
        write_json(args.json, figures)
        return 0
    runs = []
    for nside in [int(n) for n in args.nsides.split(",")]:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            for rate in rates_for(nside, args.rates):
                for pointing in args.pointing.split(","):
                    runs.append(run_ranks_json(
                        ranks, __file__, "--worker", "--nside", str(nside), "--rate", str(rate),
                        "--detectors", str(args.detectors), "--hours", str(args.hours),
                        "--iterations", str(args.iterations), "--pointing", pointing,
                    ))  # fmt: skip
    figures = {"detectors": args.detectors, "hours": args.hours, "iterations": args.iterations, "runs": runs,
               "slopes": slopes(runs)}
    if args.coupling:
        figures["coupling_build_s"] = {
            str(nside): coupling_seconds(int(nside), args.detectors, args.hours) for nside in args.nsides.split(",")
        }
    if args.json != "-":
        print_table(figures)
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
