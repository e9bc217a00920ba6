"""The default preconditioner (``auto``) against block-diagonal, with and without the coarse cache.

    .venv/bin/python benchmarks/bench_default_solver.py --json FILE          # the satellite example, 1 and 2 ranks
    .venv/bin/python benchmarks/bench_default_solver.py --nside 512 --ranks 1 # the scaled satellite at nside 512
    .venv/bin/python benchmarks/bench_default_solver.py --nside 512 --spin-period 60 --ranks 1   # with the example's spin
    .venv/bin/python benchmarks/bench_default_solver.py --nside 512 --spin-period 60 --rate 300 --ranks 2  # 207 M samples
    .venv/bin/python benchmarks/bench_default_solver.py --configs block-diagonal,default-cached,two-level-additive:2
    .venv/bin/python benchmarks/bench_default_solver.py --nside 512 --spin-period 60 --rate 300 --coarse-nside 1
    .venv/bin/python benchmarks/bench_default_solver.py --nside 512 --spin-period 60 --configs block-diagonal,two-level:2:I
    .venv/bin/python benchmarks/bench_default_solver.py --spec my-campaign.toml --ranks 4

The problem is the bundled satellite example (``schemas/examples/satellite.toml``: nside 64, 4 detectors,
24 h at 20 Hz, 6.9 M samples, 1/f noise with f_knee 0.1 Hz), realisation 0, to the spec's tolerance (1e-6);
with ``--nside 512``, that satellite scaled as ``benchmarks/bench_resolution.py`` does (8 detectors, 24 h
at 20 Hz, 13.8 M samples, a 600 s spin; ``--rate`` sets the sample rate, and so the samples per pixel).
For every rank count (``--ranks``, each under ``mpiexec -n R``) one set-up and one right-hand side are
made, then ``--rounds`` (3) rounds solve each configuration once,
interleaved (other processes on a shared machine slow some solves down; interleaving spreads that
alike), and each configuration's median over the rounds is reported:

``block-diagonal``   ``solver.preconditioner = "block-diagonal"``
``default-one-off``  the default (``auto``) in a one-realisation campaign, its coarse cache file absent
``default-first``    the default in a 16-realisation campaign, the file absent: this run builds and writes it
``default-cached``   the default in that campaign once the file exists and its trials are done: before the
                     rounds, auto's trials run (one realisation solves with A-DEF2 reading the file, one with
                     block-diagonal, each timed beside the file; their seconds are the row's ``trials``), and
                     each round then solves with the one they found faster
``P:N``              ``solver.preconditioner = P`` at coarse nside N, no coarse cache (the set-up built)
``P:N:I``            the same with ``solver.coarse_stokes = "I"``: the coarse space's I columns alone

Per configuration: the preconditioner solved with (``auto`` resolved), PCG iterations, the spectrum of
``M^-1 A`` as PCG saw it (its smallest Ritz value and the condition estimate kappa, which set the
iterations: ``PCGResult.spectrum``), ``set_up_s``
(the coarse operator's build or read, and the start x0; 0 for block-diagonal), ``solve_s`` (the
iterations) and ``total_s`` (the two: what the configuration adds to the common set-up and the
right-hand side), each the largest over ranks; ``coarse_mib_rank0``. This is a benchmark, not a test:
nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, print_json_on_root, run_ranks_json, write_json
from schemas.io import example_spec_path, load_spec

CONFIGS = "block-diagonal,default-one-off,default-first,default-cached"
CAMPAIGN = 16  # realisations of the campaign that shares the coarse cache


def problem(nside: int, spec_file: str | None = None, spin_period_s: float | None = None, rate_hz: float = 20.0,
            coarse_nside: int | None = None):
    """``spec_file`` or the satellite example at nside 64, or that scaled to ``nside`` (8 detectors, 24 h,
    ``rate_hz``, a spin of ``spin_period_s``: by default bench_resolution's 600 s), with the default
    preconditioner and coarse nside (or ``coarse_nside``), to 1e-6."""
    if spec_file is not None:
        spec = load_spec(spec_file)
    elif nside == 64:
        spec = load_spec(example_spec_path("satellite"))
    else:
        from benchmarks.bench_resolution import SPIN_PERIOD_S, bench_spec

        spec = bench_spec(nside, rate_hz, 8, 24.0, "cached", 200, spin_period_s or SPIN_PERIOD_S)
    defaults = type(spec.solver)()
    solver = spec.solver.model_copy(update={"tol": 1e-6, "max_iter": 200, "preconditioner": defaults.preconditioner,
                                            "coarse_nside": coarse_nside or defaults.coarse_nside})
    return spec.model_copy(update={"solver": solver})


def run_ranks_here(args: argparse.Namespace) -> dict:
    """Under mpiexec: every configuration on COMM_WORLD; rank 0 returns the figures."""
    from mpi4py import MPI

    from mapmaker.kernels import implementation
    from mapmaker.solve.realization import (
        resolve_preconditioner,
        right_hand_side,
        set_up_realization,
        solve_realization,
    )
    from mapmaker.solve.timing import Timers

    comm = MPI.COMM_WORLD
    spec = problem(args.nside, args.spec, args.spin_period, args.rate, args.coarse_nside)

    def quiet(message: str) -> None:
        pass

    setup = set_up_realization(spec, 0, comm, sky_root=None, threads=1, kernels=implementation.get("fast"), plan=None,
                               machine=None, timers=Timers(), say=quiet)
    b = right_hand_side(setup, Timers())
    folder = Path(comm.bcast(tempfile.mkdtemp(prefix="bench-default-") if comm.Get_rank() == 0 else None))
    cache = folder / "coarse.npz"

    def configured(name: str):
        """(spec, coarse cache or None, whether the cache file must be absent) of a configuration."""
        if name == "block-diagonal":
            return spec.model_copy(update={"solver": spec.solver.model_copy(update={"preconditioner": name})}), None, False
        if name.startswith("default-"):
            realizations = 1 if name == "default-one-off" else CAMPAIGN
            return spec.model_copy(update={"realizations": realizations}), cache, name != "default-cached"
        preconditioner, coarse_nside, *stokes = name.split(":")
        solver = spec.solver.model_copy(update={"preconditioner": preconditioner, "coarse_nside": int(coarse_nside),
                                                "coarse_stokes": stokes[0] if stokes else "IQU"})
        return spec.model_copy(update={"solver": solver}), None, False

    names = args.configs.split(",")
    samples: dict[str, list[dict]] = {name: [] for name in names}
    trials: dict[str, float] = {}  # auto's timed solves before default-cached's rounds: seconds by preconditioner

    def ensure_cache_file() -> None:
        """Build the coarse file unless it exists (default-one-off and default-first remove it)."""
        if comm.bcast(not cache.exists() if comm.Get_rank() == 0 else None):
            setup.spec = spec.model_copy(update={"realizations": CAMPAIGN})
            solve_realization(setup, timers=Timers(), say=quiet, b=b, coarse_cache=cache)

    if "default-cached" in names:
        ensure_cache_file()
        setup.spec = spec.model_copy(update={"realizations": CAMPAIGN})
        while resolve_preconditioner(setup, cache).timed:
            comm.Barrier()
            started = time.perf_counter()
            _, stats = solve_realization(setup, timers=Timers(), say=quiet, b=b, coarse_cache=cache)
            trials[stats.preconditioner] = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    for _ in range(args.rounds):
        for name in names:
            run_spec, run_cache, absent = configured(name)
            if name == "default-cached":
                ensure_cache_file()  # the timings beside it outlive the file: the trials are not run again
            if absent and comm.Get_rank() == 0:
                cache.unlink(missing_ok=True)
            setup.spec = run_spec
            comm.Barrier()
            started = time.perf_counter()
            result, stats = solve_realization(setup, timers=Timers(), say=quiet, b=b, coarse_cache=run_cache)
            total = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
            set_up = comm.allreduce(stats.coarse_setup_seconds, op=MPI.MAX)
            samples[name].append({"preconditioner": stats.preconditioner, "iterations": result.iterations,
                                  "converged": result.converged, "spectrum": result.spectrum(),
                                  "set_up_s": set_up, "solve_s": total - set_up,
                                  "total_s": total, "coarse_source": stats.coarse_source,
                                  "coarse_mib_rank0": stats.coarse_bytes / 2**20})
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)  # the coarse file and auto's timings beside it
    rows = []
    for name in names:
        runs = samples[name]
        row = {"configuration": name, **{k: runs[0][k] for k in ("preconditioner", "iterations", "converged", "spectrum",
                                                                  "coarse_source", "coarse_mib_rank0")}}
        row.update({k: statistics.median(r[k] for r in runs) for k in ("set_up_s", "solve_s", "total_s")})
        row["trials"] = trials if name == "default-cached" else None
        rows.append(row)
    return {"ranks": comm.Get_size(), "nside": spec.pixelization.nside, "samples": spec.total_samples,
            "observed_pixels": setup.pixels.n_observed, "tol": spec.solver.tol, "rounds": args.rounds,
            "campaign_realizations": CAMPAIGN, "configurations": rows}


def print_table(runs: list[dict]) -> None:
    for figures in runs:
        print(f"{figures['ranks']} rank(s), nside {figures['nside']}, {figures['samples']:,} samples, "
              f"{figures['observed_pixels']:,} pixels, tol {figures['tol']:g}: medians of {figures['rounds']} rounds")
        print(f"  {'configuration':<22}{'solved with':<20}{'iter':>5}{'Ritz min':>9}{'kappa':>7}{'set-up s':>10}"
              f"{'solve s':>9}{'total s':>9}{'coarse MiB':>11}")
        for row in figures["configurations"]:
            spectrum = row["spectrum"] or {"smallest": float("nan"), "condition": float("nan")}
            print(f"  {row['configuration']:<22}{row['preconditioner']:<20}{row['iterations']:>5}"
                  f"{spectrum['smallest']:>9.3f}{spectrum['condition']:>7.2f}{row['set_up_s']:>10.2f}"
                  f"{row['solve_s']:>9.2f}{row['total_s']:>9.2f}{row['coarse_mib_rank0']:>11.0f}")
            if row.get("trials"):
                print(f"  {'':<22}auto's trials: " + ", ".join(f"{name} {seconds:.2f} s"
                                                              for name, seconds in row["trials"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2", help="rank counts, each under mpiexec (default 1,2)")
    parser.add_argument("--nside", type=int, default=64, help="64: the satellite example; else scaled (default 64)")
    parser.add_argument("--spin-period", type=float, default=None,
                        help="the scaled satellite's spin period, s (default bench_resolution's 600; 60: the example's)")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="the scaled satellite's sample rate, Hz: the samples per pixel (default 20)")
    parser.add_argument("--coarse-nside", type=int, default=None,
                        help="solver.coarse_nside of the default configurations (default: the spec's default, 4)")
    parser.add_argument("--spec", default=None, help="a campaign spec file instead (its nside; --nside ignored)")
    parser.add_argument("--configs", default=CONFIGS, help=f"configurations (default {CONFIGS})")
    parser.add_argument("--rounds", type=int, default=3, help="solves per configuration; the median is reported")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.worker:
        print_json_on_root(run_ranks_here(args))
        return 0
    runs = []
    for ranks in [int(r) for r in args.ranks.split(",")]:
        command = [__file__, "--worker",
                   "--nside", str(args.nside), "--configs", args.configs, "--rounds", str(args.rounds)]
        command += ["--spec", args.spec] if args.spec else []
        command += ["--spin-period", str(args.spin_period)] if args.spin_period else []
        command += ["--rate", str(args.rate)]
        command += ["--coarse-nside", str(args.coarse_nside)] if args.coarse_nside else []
        runs.append(run_ranks_json(ranks, *command))
    if args.json != "-":
        print_table(runs)
    write_json(args.json, {"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
