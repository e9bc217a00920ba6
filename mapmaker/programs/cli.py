"""Command line of the map-maker: ``python -m mapmaker COMMAND ...``.

Run it under MPI as ``mpiexec -n P python -m mpi4py -m mapmaker realize ...``
so that an exception on one rank aborts all of them. Exit status: 0 success,
2 bad input (spec, options, sky map, existing --out), 3 overlap plan refused
(``realize --plan`` with a plan that does not match the run or is damaged;
never rebuilt silently), anything else a failure of the run. Heavy modules
(numpy, healpy, mpi4py) are imported only once a command runs, so ``--help``
is instant.

Commands: ``realize``, ``preprocess``, ``calibrate``, ``model`` and ``bench``,
each a ``_add_<name>`` parser builder and a ``_run_<name>`` function.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

BAD_INPUT = 2
PLAN_REFUSED = 3


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _nside(text: str) -> int:
    from schemas.spec import MAX_NSIDE

    value = _positive_int(text)
    if value & (value - 1) or value > MAX_NSIDE:
        raise argparse.ArgumentTypeError(f"must be a power of two from 1 to {MAX_NSIDE}, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _add_realize(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "realize",
        help="simulate and map one realisation of a campaign",
        description=(
            "Simulate the TOD of one realisation of a campaign spec on the fly (pointing, sky, noise), "
            "solve for the maximum-likelihood IQU map with PCG, and write map_iqu.fits, hits.fits, "
            "rcond.fits and result.json into --out. --out must not exist; it appears only when complete."
        ),
        epilog="Under MPI: mpiexec -n 2 python -m mpi4py -m mapmaker realize --spec S --realization 0 --out DIR",
    )
    parser.add_argument("--spec", required=True, type=Path, metavar="FILE", help="campaign spec (TOML, YAML or JSON)")
    parser.add_argument(
        "--realization", required=True, type=_non_negative_int, metavar="N", help="realisation index, 0 .. realizations-1"
    )
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="product folder to create (must not exist)")
    parser.add_argument(
        "--threads", type=_positive_int, default=None, metavar="T",
        help="threads per rank: numba loops, FFTs over intervals, BLAS (default: the spec's resources.threads_per_rank)",
    )
    parser.add_argument(
        "--kernels", choices=("fast", "numpy"), default="fast",
        help="fast: numba + ducc0 (default; compiled once per machine, then cached); numpy: the reference",
    )
    parser.add_argument(
        "--sky-root", type=Path, default=None, metavar="DIR",
        help="folder that a spec's sky.path (kind 'map') is relative to; paths may not leave it",
    )
    parser.add_argument(
        "--plan", type=Path, default=None, metavar="PLAN",
        help="overlap plan from 'preprocess' for this spec and rank count; a mismatched or damaged plan exits 3",
    )
    parser.add_argument(
        "--calibration", type=Path, default=None, metavar="FILE",
        help="site calibration from 'calibrate' that reduction 'auto' models with (default: the paper's Franklin figures)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _add_preprocess(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "preprocess",
        help="build the overlap plan of a spec for the current rank count",
        description=(
            "Under mpiexec -n P: compute each rank's observed pixels from its own chunks' pointing (the spec's "
            "decomposition into P ranks), gather the pixel ids in pieces, sift out the pixels every pair of ranks "
            "shares, and write the plan file atomically. realize --plan PLAN uses it on P ranks."
        ),
        epilog="Under MPI: mpiexec -n 4 python -m mpi4py -m mapmaker preprocess --spec S --out plan.bin --report plan.json",
    )
    parser.add_argument("--spec", required=True, type=Path, metavar="FILE", help="campaign spec (TOML, YAML or JSON)")
    parser.add_argument("--out", required=True, type=Path, metavar="PLAN", help="plan file to write (replaced atomically)")
    parser.add_argument("--report", type=Path, default=None, metavar="REPORT.json", help="also write the build report (JSON)")
    parser.add_argument(
        "--buffer-pixels", type=_positive_int, default=None, metavar="N",
        help="pixels per range of the buffered allgather (default: the spec's solver.allreduce_buffer_pixels)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _rank_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rank counts, got {text!r}") from None
    if not values or min(values) < 1 or max(values) > 1 << 20:
        raise argparse.ArgumentTypeError(f"rank counts must be 1 .. 1048576, got {text!r}")
    return values


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _add_calibrate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "calibrate",
        help="measure alpha and beta of point-to-point, Allreduce, Alltoallv and Allgather",
        description=(
            "Under mpiexec -n P (P >= 2): ping-pong between ranks 0 and 1 and the collectives the reductions use, "
            "at several sizes; fit latency alpha and inverse bandwidth beta per operation; time the preprocessing "
            "sift. Prints the figures; --out saves the site calibration (JSON) that realize and model read."
        ),
        epilog="Under MPI: mpiexec -n 4 python -m mpi4py -m mapmaker calibrate --out site-calibration.json",
    )
    parser.add_argument("--out", type=Path, default=None, metavar="FILE", help="write the calibration (JSON) here")
    parser.add_argument("--repeat", type=_positive_int, default=7, help="trials per point; the median is kept (default 7)")
    parser.add_argument("--site", default="local", help="site name recorded in the file (default: local)")
    parser.add_argument("--json", action="store_true", help="print only JSON on stdout")


def _add_model(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "model",
        help="project the overlap and the cost of every reduction strategy to large rank counts",
        description=(
            "Serially simulate each rank's pixel set for the spec's decomposition into each rank count (the real "
            "pointing and decomposition code; one pointing per focal-plane offset) and print, per strategy, the "
            "bytes, messages and alpha-beta time per iteration, the preprocessing cost and the campaign total."
        ),
    )
    parser.add_argument("--spec", required=True, type=Path, metavar="FILE", help="campaign spec (TOML, YAML or JSON)")
    parser.add_argument(
        "--ranks", required=True, type=_rank_list, metavar="P1,P2,...", help="rank counts, e.g. 256,1024,4096,16384"
    )
    parser.add_argument("--alpha", type=_positive_float, default=None, metavar="S", help="latency per message (s)")
    parser.add_argument("--beta", type=_positive_float, default=None, metavar="S_PER_BYTE", help="inverse bandwidth (s/byte)")
    parser.add_argument(
        "--calibration", type=Path, default=None, metavar="FILE",
        help="site calibration from 'calibrate' (default, and without --alpha/--beta: the paper's Franklin figures)",
    )
    parser.add_argument(
        "--time-step", type=_positive_int, default=1, metavar="N",
        help="point every N-th sample only (faster, approximate; see README for the error); default 1 (exact)",
    )
    parser.add_argument("--json", action="store_true", help="print only JSON on stdout")


def _add_bench(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench",
        help="throughput of pointing, P, P^T, N^-1 and one PCG iteration, numpy vs fast, against the memory floor",
        description=(
            "Time the map-maker's kernels and one whole PCG iteration on a synthetic satellite scan with both "
            "implementations and print samples per second per core, bytes per sample and the ratio to the "
            "memory-bandwidth floor measured in the same run (STREAM triad). Runs serially or under mpiexec; "
            "--hybrid CORES runs every ranks x threads split of CORES cores under mpiexec and prints the "
            "calc/comm split per iteration. Takes a few minutes at the default size."
        ),
    )
    parser.add_argument("--samples", type=_positive_int, default=12_000_000, help="samples per rank (default 12,000,000)")
    parser.add_argument("--nside", type=_nside, default=256, help="HEALPix nside, a power of two (default 256)")
    parser.add_argument("--repeat", type=_positive_int, default=5, help="timed repetitions; the best is kept (default 5)")
    parser.add_argument(
        "--rounds", type=_positive_int, default=5,
        help="blocks of PCG iterations per implementation, taken in turns; best, median and range printed (default 5)",
    )
    parser.add_argument("--threads", type=_positive_int, default=1, help="threads per rank (default 1)")
    parser.add_argument(
        "--kernels", default="numpy,fast", help="comma-separated implementations to time (default numpy,fast)"
    )
    parser.add_argument(
        "--hybrid", type=_positive_int, default=None, metavar="CORES",
        help="run each ranks x threads split of CORES cores under mpiexec (same total samples: --samples x CORES)",
    )
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="wall time, or the process's CPU time (all threads): steadier on a machine others are using",
    )
    parser.add_argument(
        "--spec", type=Path, default=None, metavar="FILE",
        help="benchmark this campaign's observation (scan, detectors, nside, noise) instead of the synthetic one",
    )
    parser.add_argument("--json", action="store_true", help="print only JSON on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mapmaker",
        description="MapCampaign map-maker: on-the-fly TOD simulation and distributed PCG map-making.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_realize(commands)
    _add_preprocess(commands)
    _add_calibrate(commands)
    _add_model(commands)
    _add_bench(commands)
    return parser


def _run_realize(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from mapmaker.parallel.planfile import PlanRefused, load_plan
    from mapmaker.programs.preprocess import plan_identity
    from mapmaker.programs.products import OutputExists, OutputUnusable, refuse_existing, refuse_unwritable
    from mapmaker.programs.realize import NothingToSolve, realize_to_folder
    from mapmaker.parallel.reduction import ReductionUnavailable, resolve_strategy
    from mapmaker.model.sky import SkyError
    from schemas.io import SpecError, load_spec

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def fail(message: str, collective: bool = True, code: int = BAD_INPUT) -> int:
        if rank == 0:
            print(f"mapmaker realize: {message}", file=sys.stderr, flush=True)
        if collective:
            # Every rank exits with the code; without this barrier the first to exit aborts the
            # others (python -m mpi4py turns a non-zero exit into MPI_Abort) before rank 0 has spoken.
            comm.Barrier()
        return code

    # Every rank checks the same inputs and reaches the same verdict; only --out is checked once.
    try:
        spec = load_spec(args.spec)
    except SpecError as error:
        return fail("invalid spec\n" + str(error))
    if args.realization >= spec.realizations:
        return fail(f"--realization {args.realization} is out of range: the spec has {spec.realizations} (0 .. {spec.realizations - 1})")
    try:
        resolve_strategy(spec.solver.reduction)
    except ReductionUnavailable as error:
        return fail(f"solver.reduction: {error}")
    out_problem = None
    if rank == 0:
        try:
            refuse_existing(args.out)
            refuse_unwritable(args.out, "--out")
        except (OutputExists, OutputUnusable) as error:
            out_problem = str(error)
    out_problem = comm.bcast(out_problem, root=0)
    if out_problem:
        return fail(out_problem)

    machine = None
    if args.calibration is not None:
        try:
            machine = _load_calibration(args.calibration)
        except ValueError as error:
            return fail(str(error))

    plan, plan_document = None, None
    if args.plan is not None:
        try:
            plan, plan_document = load_plan(comm, args.plan, plan_identity(spec, comm.Get_size()))
        except PlanRefused as error:
            return fail(f"plan refused: {error}", code=PLAN_REFUSED)

    threads = args.threads or spec.resources.threads_per_rank
    if rank == 0 and not args.quiet and comm.Get_size() != spec.resources.ranks:
        print(
            f"note: running on {comm.Get_size()} ranks; the spec's resources.ranks is {spec.resources.ranks}",
            file=sys.stderr, flush=True,
        )
    progress = None if args.quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    try:
        result = realize_to_folder(
            spec, args.realization, args.out, comm, sky_root=args.sky_root, threads=threads, progress=progress,
            plan=plan, plan_document=plan_document, machine=machine, kernels=args.kernels,
        )
    except SkyError as error:
        return fail(f"sky: {error}")
    except NothingToSolve as error:  # raised on every rank
        return fail(f"nothing to solve: {error}")
    except PlanRefused as error:  # raised on every rank, after the pixels were compared
        return fail(f"plan refused: {error}", code=PLAN_REFUSED)
    except OutputExists as error:  # --out appeared during the run; only root sees it
        return fail(str(error), collective=False)
    if rank == 0 and not args.quiet:
        state = "converged" if result.converged else "NOT converged"
        print(
            f"realisation {args.realization}: {state} in {result.iterations} iterations "
            f"(residual {result.residual_history[-1]:.2e}), {result.timing.total:.1f} s; maps in {args.out}",
            file=sys.stderr, flush=True,
        )
    return 0


def _load_calibration(path: Path):
    """The :class:`mapmaker.parallel.commodel.Machine` of a calibration file; ValueError with the reason."""
    from pydantic import ValidationError

    from mapmaker.parallel.commodel import load_machine

    try:
        return load_machine(path)
    except OSError as error:
        raise ValueError(f"--calibration {str(path)!r}: cannot read the file ({error.strerror or error})") from error
    except UnicodeDecodeError:
        raise ValueError(f"--calibration {str(path)!r} is not a calibration file: not UTF-8 text") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the document"
        raise ValueError(f"--calibration {str(path)!r} is not a calibration file: {where}: {first['msg']}") from error


def _run_preprocess(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from mapmaker.programs.preprocess import run_preprocess
    from mapmaker.programs.products import OutputUnusable, refuse_unwritable
    from schemas.io import SpecError, load_spec

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def fail(message: str, code: int = BAD_INPUT) -> int:
        if rank == 0:
            print(f"mapmaker preprocess: {message}", file=sys.stderr, flush=True)
        comm.Barrier()
        return code

    try:
        spec = load_spec(args.spec)
    except SpecError as error:
        return fail("invalid spec\n" + str(error))
    problem = None
    if rank == 0:  # one verdict for every rank: the paths are checked once
        for option, path in (("--out", args.out), ("--report", args.report)):
            if path is None:
                continue
            if path.is_dir():
                problem = f"{option} {str(path)!r} is a folder; give a file name"
                break
            try:
                refuse_unwritable(path, option)
            except OutputUnusable as error:
                problem = str(error)
                break
    problem = comm.bcast(problem, root=0)
    if problem:
        return fail(problem)
    progress = None if args.quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    try:
        report = run_preprocess(
            spec, args.out, comm, report_path=args.report, buffer_pixels=args.buffer_pixels, progress=progress
        )
    except OSError as error:
        return fail(str(error), code=1)
    if rank == 0 and not args.quiet:
        print(
            f"plan for {report.ranks} ranks: {report.path}, {report.size_bytes} bytes, built in {report.build_time_s:.2f} s",
            file=sys.stderr, flush=True,
        )
    return 0


def _run_calibrate(args: argparse.Namespace) -> int:
    import json

    from mpi4py import MPI

    from mapmaker.programs.calibrate import run_calibration
    from mapmaker.programs.preprocess import write_json_atomically

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        print("mapmaker calibrate: run it under mpiexec with at least 2 ranks "
              "(mpiexec -n 2 python -m mpi4py -m mapmaker calibrate)", file=sys.stderr)
        return BAD_INPUT
    if args.out is not None and args.out.is_dir():
        if rank == 0:
            print(f"mapmaker calibrate: --out {str(args.out)!r} is a folder; give a file name", file=sys.stderr)
        comm.Barrier()
        return BAD_INPUT
    progress = None if args.json else (lambda message: print(message, file=sys.stderr, flush=True))
    calibration = run_calibration(comm, repeat=args.repeat, site=args.site, progress=progress)
    if rank != 0:
        return 0
    document = json.loads(calibration.model_dump_json())
    if args.out is not None:
        write_json_atomically(args.out, document)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{calibration.ranks} ranks on {calibration.host} ({calibration.mpi}), load {calibration.load_average[0]:.2f}")
    print(f"{'operation':<10} {'alpha (us)':>11} {'bandwidth (GB/s)':>17} {'r2':>6}  form")
    for name in ("p2p", "allreduce", "alltoallv", "allgather"):
        fit = getattr(calibration, name)
        bandwidth = 1e-9 / fit.beta_s_per_byte if fit.beta_s_per_byte > 0 else float("inf")
        r2 = f"{fit.r2:.3f}" if fit.r2 is not None else "-"
        print(f"{name:<10} {fit.alpha_s * 1e6:>11.2f} {bandwidth:>17.2f} {r2:>6}  {fit.formula}")
    print(f"sift: {calibration.sift_s_per_id * 1e9:.1f} ns per id ({1e-6 / calibration.sift_s_per_id:.0f} M ids/s)")
    if args.out is not None:
        print(f"saved to {args.out}")
    return 0


def _run_model(args: argparse.Namespace) -> int:
    import json

    from mapmaker.parallel.commodel import DEFAULT_MACHINE, Machine
    from mapmaker.parallel.overlap_model import project
    from schemas.io import SpecError, load_spec

    if (args.alpha is None) != (args.beta is None):
        print("mapmaker model: give --alpha and --beta together", file=sys.stderr)
        return BAD_INPUT
    if args.alpha is not None and args.calibration is not None:
        print("mapmaker model: give either --alpha/--beta or --calibration, not both", file=sys.stderr)
        return BAD_INPUT
    try:
        spec = load_spec(args.spec)
    except SpecError as error:
        print(f"mapmaker model: invalid spec\n{error}", file=sys.stderr)
        return BAD_INPUT
    if args.alpha is not None:
        machine = Machine.uniform(args.alpha, args.beta, f"alpha {args.alpha:g} s, beta {args.beta:g} s/byte")
    elif args.calibration is not None:
        try:
            machine = _load_calibration(args.calibration)
        except ValueError as error:
            print(f"mapmaker model: {error}", file=sys.stderr)
            return BAD_INPUT
    else:
        machine = DEFAULT_MACHINE
    progress = None if args.json else (lambda message: print(message, file=sys.stderr, flush=True))
    report = project(spec, args.ranks, machine, time_step=args.time_step, progress=progress)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"model of {args.spec} ({report['npix']} pixels; {machine.name}); per reduction of 3 values per pixel,")
    print(f"slowest rank; campaign = {report['realizations']} realisation(s) x ({report['iterations']} iterations + 2 "
          "reductions) + one preprocessing")
    for projection in report["projections"]:
        overlap = projection["overlap"]
        exact = "" if overlap["neighbours_exact"] else " (sampled)"
        print(
            f"\n{projection['ranks']} ranks: {overlap['local_pixels_max']} pixels per rank at most "
            f"(mean {overlap['local_pixels_mean']:.0f}), n_all / observed = {overlap['mean_multiplicity']:.2f}, "
            f"shared per rank {overlap['shared_pixels_max']} at most ({overlap['shared_fraction_max']:.2f} n_i), "
            f"neighbours {overlap['neighbours_max']}{exact} at most; {overlap['ranks_without_pixels']} ranks without pixels"
        )
        pre = projection["preprocessing"]
        print(f"  preprocessing: allgather {pre['allgather_s']:.3g} s ({pre['allgather_bytes']:.3g} bytes), "
              f"sift {pre['sift_s']:.3g} s")
        print(f"  {'strategy':<10} {'bytes/iter':>11} {'msgs/iter':>10} {'s/iter':>10} {'vs allreduce':>12} {'campaign s':>11}")
        for name, row in projection["strategies"].items():
            speedup = f"{row['speedup_vs_allreduce']:.1f}x" if row["speedup_vs_allreduce"] else "-"
            note = f"  tau={row['threshold']:.0f}, |H|={row['heavy_pixels']:.0f}" if name == "hybrid" else ""
            mark = " <- auto" if name == projection["chosen"] else ""
            print(
                f"  {name:<10} {row['bytes_per_iteration_max']:>11.4g} {row['messages_per_iteration_max']:>10.0f} "
                f"{row['seconds_per_iteration']:>10.3g} {speedup:>12} {row['campaign_s']:>11.4g}{note}{mark}"
            )
    return 0


def _run_bench(args: argparse.Namespace) -> int:
    from mapmaker.programs.bench import run_bench, run_hybrid

    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not kernels or any(k not in ("numpy", "fast") for k in kernels):
        print(f"mapmaker bench: --kernels takes numpy and/or fast, got {args.kernels!r}", file=sys.stderr)
        return BAD_INPUT
    if args.spec is not None:  # refused here, not as a traceback from every rank (or every split of --hybrid)
        from schemas.io import SpecError, load_spec

        try:
            load_spec(args.spec)
        except SpecError as error:
            print(f"mapmaker bench: --spec: invalid spec\n{error}", file=sys.stderr)
            return BAD_INPUT
    if args.hybrid:
        return run_hybrid(cores=args.hybrid, samples_total=args.samples * args.hybrid, nside=args.nside,
                          repeat=args.repeat, kernels=",".join(kernels), as_json=args.json,
                          spec_path=str(args.spec) if args.spec else None, clock_name=args.clock, rounds=args.rounds)
    return run_bench(samples=args.samples, nside=args.nside, repeat=args.repeat, threads=args.threads,
                     as_json=args.json, kernels=",".join(kernels), spec_path=str(args.spec) if args.spec else None,
                     clock_name=args.clock, rounds=args.rounds)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "realize":
        return _run_realize(args)
    if args.command == "preprocess":
        return _run_preprocess(args)
    if args.command == "calibrate":
        return _run_calibrate(args)
    if args.command == "model":
        return _run_model(args)
    if args.command == "bench":
        return _run_bench(args)
    raise AssertionError(args.command)
