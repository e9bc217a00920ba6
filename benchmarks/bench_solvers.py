"""Preconditioners and N^-1 filters side by side on one problem: iterations, time to 1e-6, map noise, time to quality.

    .venv/bin/python benchmarks/bench_solvers.py --json FILE            # the satellite example at 1 and 2 ranks
    .venv/bin/python benchmarks/bench_solvers.py --hours 6 --ranks 1     # a shorter observation
    .venv/bin/python benchmarks/bench_solvers.py --f-min 0.02 --filter-tolerance 1e-2 --preconditioners block-diagonal
                                                                         # a shallow 1/f notch: the finite filter applies

The problem is the bundled satellite example (``schemas/examples/satellite.toml``: nside 64, 4
detectors, 24 h at 20 Hz, 6.9 M samples, 1/f noise with f_knee 0.1 Hz, a CMB sky), realisation 0.
For every rank count (``--ranks``, each run under ``mpiexec -n R``) one set-up and one right-hand side
per N^-1 filter are made, then:

1. the *exact* map: block-diagonal PCG with the exact filter to ||r|| / ||b|| < 1e-10;
2. each configuration (preconditioner x filter) to ||r|| / ||b|| < ``--tol`` (1e-6), reporting its
   iterations, the solve's seconds (the two-level set-up counted apart), seconds per iteration, the
   map's Q/U noise rms (map - input sky, uK; each pixel once) and the rms of (map - exact map) over
   the exact map's noise rms;
3. *time to quality*, what a user pays: the first iteration whose map differs from the exact map by
   at most ``--quality`` (1%) of the exact map's noise rms in each of I, Q and U, and the seconds to
   get there (the check's own time left out; the two-level set-up included in ``with set-up``).

Each two-level preconditioner (A-DEF2, ``two-level``, and the additive form, ``two-level-additive``) is solved twice, as a campaign runs it: the first solve builds the coarse
operator and writes it to a coarse cache file (``realize --coarse-cache``), the second reads it. Its
figures are the second solve's; ``set_up_seconds`` is the first one's set-up (the build, and the start),
``set_up_cached_seconds`` the second's (the read, and the start), and ``seconds_to_quality_in_campaign``
what one realisation of a ``--campaign`` (100) realisation campaign pays: the time to quality, the cached
set-up and its share of the one build. After the builds, ``--rounds`` (3) rounds solve every
configuration once each, interleaved, and each configuration's fastest solve is reported: other processes
sharing the cores slow some solves down, never speed one up, and interleaving spreads their load alike.

The finite filter is used only where a kernel of finite correlation length meets
``solver.noise_filter_tolerance`` (see ``mapmaker.kernels.noise.finite_kernel``): its half-width and
error delta are reported per rank count; when none does (the satellite example's 1/f notch at
f_min = 1e-4 Hz is 1000x deep) the row says so and is not solved again.

This is a benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, print_json_on_root, run_ranks_json, write_json
from schemas.io import example_spec_path, load_spec

PRECONDITIONERS = ("block-diagonal", "two-level", "two-level-additive")
CONFIGS = [(preconditioner, noise_filter) for noise_filter in ("exact", "finite") for preconditioner in PRECONDITIONERS]


def _configured(spec, **solver):
    return spec.model_copy(update={"solver": spec.solver.model_copy(update=solver)})


class QualityWatch:
    """PCG's ``on_estimate``: the first iteration whose map passes ``good(map)``, and the seconds to it.

    The checks' own time (a global rms per iteration) is left out of the seconds and kept in check_seconds.
    """

    def __init__(self, good):
        self.good = good
        self.started = 0.0
        self.check_seconds = 0.0
        self.reached: list[tuple[int, float]] = []

    def __call__(self, k: int, estimate: np.ndarray) -> None:
        begun = time.perf_counter()
        if not self.reached and self.good(estimate):  # collective: every rank checks until one passes
            self.reached.append((k, begun - self.started - self.check_seconds))
        self.check_seconds += time.perf_counter() - begun


def run_ranks_here(args: argparse.Namespace) -> dict:
    """Under mpiexec: every configuration on COMM_WORLD; rank 0 returns the figures."""
    from mpi4py import MPI

    from mapmaker.kernels import implementation
    from mapmaker.solve.realization import right_hand_side, set_up_realization, solve_realization
    from mapmaker.solve.timing import Timers

    comm = MPI.COMM_WORLD
    spec = load_spec(args.spec or example_spec_path("satellite"))
    if args.hours is not None:
        spec = spec.model_copy(update={"scan": spec.scan.model_copy(update={"duration_s": args.hours * 3600.0})})
    if args.f_min is not None:
        spec = spec.model_copy(update={"noise": spec.noise.model_copy(update={"f_min_hz": args.f_min})})
    spec = _configured(spec, noise_filter_tolerance=args.filter_tolerance)
    if args.coarse_nside is not None:
        spec = _configured(spec, coarse_nside=args.coarse_nside)

    def quiet(message: str) -> None:
        pass

    figures: dict = {"ranks": comm.Get_size(), "samples": spec.total_samples, "nside": spec.pixelization.nside, "coarse_nside": spec.solver.coarse_nside,
                     "tol": args.tol, "quality": args.quality, "rounds": args.rounds, "configurations": []}
    prepared: dict[str, tuple] = {}
    for noise_filter in ("exact", "finite"):
        filtered = _configured(spec, noise_filter=noise_filter)
        setup = set_up_realization(
            filtered, 0, comm, sky_root=None, threads=1, kernels=implementation.get("fast"), plan=None,
            machine=None, timers=Timers(), say=quiet,
        )
        if noise_filter == "finite":
            widths = comm.allgather(setup.local.half_widths)
            figures["finite_filter"] = {
                "tolerance": args.filter_tolerance,
                "half_widths": sorted({w for rank in widths if rank for w in rank if w}),
                "delta": comm.allreduce(setup.local.filter_error, op=MPI.MAX),
                "applies": all(rank is not None for rank in widths),
            }
            if not figures["finite_filter"]["applies"]:
                break
        prepared[noise_filter] = (setup, right_hand_side(setup, Timers()))

    setup, b = prepared["exact"]
    owned = setup.pixels.owned & ~setup.cut
    sky = setup.sky_local

    def global_rms(rows: np.ndarray) -> np.ndarray:
        """rms per Stokes [3] over the solved pixels, each once."""
        sums = np.array([np.sum(rows[owned] ** 2, axis=0), [float(owned.sum())] * 3]).ravel()
        comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        return np.sqrt(sums[:3] / sums[3:])

    exact_spec = _configured(setup.spec, tol=1e-10, preconditioner="block-diagonal", max_iter=1000)
    setup.spec = exact_spec
    exact_result, _ = solve_realization(setup, timers=Timers(), say=quiet, b=b)
    exact = exact_result.solution.copy()
    exact_noise = global_rms(exact - sky) if sky is not None else global_rms(exact)
    figures["exact"] = {"iterations": exact_result.iterations, "noise_rms_uK": (exact_noise * 1e6).tolist()}

    def solve(entry: dict, cache) -> tuple:
        """One timed solve of a configuration; its two-level set-up read from ``cache`` when that file exists,
        else built into it (None: no file)."""
        setup, b = entry["setup"], entry["b"]
        setup.spec = entry["spec"]
        watch = QualityWatch(lambda estimate: bool(np.all(global_rms(estimate - exact) / exact_noise <= args.quality)))
        comm.Barrier()
        watch.started = time.perf_counter()
        result, stats = solve_realization(setup, timers=Timers(), say=quiet, b=b, on_estimate=watch, coarse_cache=cache)
        elapsed = comm.allreduce(time.perf_counter() - watch.started - watch.check_seconds, op=MPI.MAX)
        reached = comm.bcast(watch.reached[0] if watch.reached else None, root=0)
        return result, stats, elapsed, comm.allreduce(stats.coarse_setup_seconds, op=MPI.MAX), reached

    entries = []
    for preconditioner, noise_filter in CONFIGS:
        if preconditioner not in args.preconditioners.split(","):
            continue
        row = {"preconditioner": preconditioner, "noise_filter": noise_filter}
        figures["configurations"].append(row)
        if noise_filter not in prepared:
            row["skipped"] = "no finite correlation length meets the tolerance: the exact filter is used"
            continue
        setup, b = prepared[noise_filter]
        entry = {"row": row, "setup": setup, "b": b, "cache": None, "built_set_up": None, "best": None,
                 "spec": _configured(spec, noise_filter=noise_filter, preconditioner=preconditioner, tol=args.tol)}
        if preconditioner != "block-diagonal":
            # A campaign's first realisation builds the coarse operator and writes it; the others read it.
            folder = comm.bcast(tempfile.mkdtemp(prefix="bench-coarse-") if comm.Get_rank() == 0 else None)
            entry["cache"] = Path(folder) / "coarse.npz"
            entry["built_set_up"] = solve(entry, entry["cache"])[3]
        entries.append(entry)
    # --rounds rounds, the configurations interleaved in each, so that all see the same load from other
    # processes sharing the cores; each configuration's fastest solve is reported (load slows, never speeds).
    for _ in range(args.rounds):
        for entry in entries:
            run = solve(entry, entry["cache"])
            if entry["best"] is None or run[2] < entry["best"][2]:
                entry["best"] = run
    for entry in entries:
        if entry["cache"] is not None and comm.Get_rank() == 0:
            shutil.rmtree(entry["cache"].parent, ignore_errors=True)
        result, stats, elapsed, set_up_seconds, quality = entry["best"]
        built_set_up = entry["built_set_up"]
        first_set_up = built_set_up if built_set_up is not None else set_up_seconds
        solve_seconds = elapsed - set_up_seconds
        noise = global_rms(result.solution - sky) if sky is not None else global_rms(result.solution)
        to_quality = (quality[1] - set_up_seconds) if quality else None
        entry["row"].update({
            "iterations": result.iterations,
            "converged": result.converged,
            "seconds_to_tol": solve_seconds,
            "set_up_seconds": first_set_up,
            "set_up_cached_seconds": set_up_seconds if built_set_up is not None else 0.0,
            "seconds_per_iteration": solve_seconds / max(result.iterations, 1),
            "noise_rms_uK": (noise * 1e6).tolist(),
            "difference_over_exact_noise": (global_rms(result.solution - exact) / exact_noise).tolist(),
            "iterations_to_quality": quality[0] if quality else None,
            "seconds_to_quality": to_quality,
            "seconds_to_quality_with_set_up": (to_quality + first_set_up) if quality else None,
            # Per realisation of a campaign of --campaign realisations: one build, the rest read the file.
            "seconds_to_quality_in_campaign": (
                to_quality + set_up_seconds + (first_set_up - set_up_seconds) / args.campaign if quality else None
            ) if built_set_up is not None else to_quality,
            "campaign_realizations": args.campaign,
            "coarse_columns": stats.coarse_columns,
            "coarse_mib_rank0": stats.coarse_bytes / 2**20,
        })
    return figures


def print_table(runs: list[dict]) -> None:
    for figures in runs:
        exact = figures["exact"]
        print(f"{figures['ranks']} rank(s), {figures['samples']:,} samples, nside {figures['nside']}: exact map "
              f"({exact['iterations']} block-diagonal iterations to 1e-10) noise rms I/Q/U "
              + "/".join(f"{v:.2f}" for v in exact["noise_rms_uK"]) + " uK")
        finite = figures.get("finite_filter", {})
        print(f"  finite filter at tolerance {finite.get('tolerance')}: half-widths {finite.get('half_widths')}, "
              f"delta {finite.get('delta', 0):.1e}" + ("" if finite.get("applies") else " -- does not apply here"))
        print(f"  {'preconditioner':<19}{'filter':<8}{'iter':>5}{'s to tol':>10}{'s/iter':>8}{'set-up s':>10}"
              f"{'cached s':>9}{'Q/U noise uK':>15}{'|m-exact|/noise':>17}{'it to q':>8}{'s to q':>8}{'+set-up':>9}"
              f"{'campaign':>9}")
        for row in figures["configurations"]:
            if "skipped" in row:
                print(f"  {row['preconditioner']:<19}{row['noise_filter']:<8}  {row['skipped']}")
                continue
            quality = row["iterations_to_quality"]
            print(f"  {row['preconditioner']:<19}{row['noise_filter']:<8}{row['iterations']:>5}{row['seconds_to_tol']:>10.2f}"
                  f"{row['seconds_per_iteration']:>8.3f}{row['set_up_seconds']:>10.1f}{row['set_up_cached_seconds']:>9.2f}"
                  f"{row['noise_rms_uK'][1]:>8.2f}/{row['noise_rms_uK'][2]:<6.2f}{max(row['difference_over_exact_noise']):>17.1e}"
                  f"{quality if quality is not None else '-':>8}"
                  f"{row['seconds_to_quality'] if quality is not None else math.nan:>8.2f}"
                  f"{row['seconds_to_quality_with_set_up'] if quality is not None else math.nan:>9.1f}"
                  f"{row['seconds_to_quality_in_campaign'] if quality is not None else math.nan:>9.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2", help="rank counts, each under mpiexec (default 1,2)")
    parser.add_argument("--spec", default=None, help="a campaign spec file (default: the satellite example)")
    parser.add_argument("--hours", type=float, default=None, help="observe this long instead")
    parser.add_argument("--f-min", type=float, default=None, help="noise f_min_hz instead of the spec's (a shallower 1/f notch)")
    parser.add_argument("--preconditioners", default=",".join(PRECONDITIONERS), help="which to run (default all)")
    parser.add_argument("--tol", type=float, default=1e-6)
    parser.add_argument("--quality", type=float, default=0.01, help="map quality: |m - exact| / exact noise rms")
    parser.add_argument("--coarse-nside", type=int, default=None, help="solver.coarse_nside (default: the spec's)")
    parser.add_argument("--filter-tolerance", type=float, default=1e-3)
    parser.add_argument("--rounds", type=int, default=3, help="solves per configuration; the fastest is reported")
    parser.add_argument("--campaign", type=int, default=100,
                        help="realisations sharing one coarse-operator build (the amortised time to quality)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.worker:
        print_json_on_root(run_ranks_here(args))
        return 0
    runs = []
    for ranks in [int(r) for r in args.ranks.split(",")]:
        command = [__file__, "--worker",
                   "--tol", str(args.tol), "--quality", str(args.quality),
                   "--filter-tolerance", str(args.filter_tolerance), "--campaign", str(args.campaign), "--rounds", str(args.rounds)]
        command += ["--spec", args.spec] if args.spec else []
        command += ["--hours", str(args.hours)] if args.hours is not None else []
        command += ["--f-min", str(args.f_min)] if args.f_min is not None else []
        command += ["--preconditioners", args.preconditioners]
        command += ["--coarse-nside", str(args.coarse_nside)] if args.coarse_nside is not None else []
        runs.append(run_ranks_json(ranks, *command))
    if args.json != "-":
        print_table(runs)
    write_json(args.json, {"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
