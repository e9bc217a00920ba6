"""Command line of the map-maker: ``python -m mapmaker COMMAND ...``.

Run it under MPI as ``mpiexec -n P python -m mpi4py -m mapmaker realize ...``
so that an exception on one rank aborts all of them. Exit status: 0 success,
2 bad input (spec, options, sky map, existing --out), 3 overlap plan refused
(``realize --plan`` with a plan that does not match the run or is damaged;
never rebuilt silently), anything else a failure of the run. Heavy modules
(numpy, healpy, mpi4py) are imported only once a command runs, so ``--help``
is instant.

Commands: ``realize``, ``preprocess`` and ``bench``, each a ``_add_<name>``
parser builder and a ``_run_<name>`` function.
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
        help="threads per rank for the FFTs (default: the spec's resources.threads_per_rank)",
    )
    parser.add_argument(
        "--sky-root", type=Path, default=None, metavar="DIR",
        help="folder that a spec's sky.path (kind 'map') is relative to; paths may not leave it",
    )
    parser.add_argument(
        "--plan", type=Path, default=None, metavar="PLAN",
        help="overlap plan from 'preprocess' for this spec and rank count; a mismatched or damaged plan exits 3",
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


def _add_bench(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench",
        help="throughput of pointing, P, P^T, N^-1 and one PCG iteration",
        description=(
            "Time the map-maker's kernels and one whole PCG iteration on a synthetic satellite scan and print "
            "samples per second per core. Runs serially or under mpiexec; takes about a minute at the default size."
        ),
    )
    parser.add_argument("--samples", type=_positive_int, default=12_000_000, help="samples per rank (default 12,000,000)")
    parser.add_argument("--nside", type=_positive_int, default=256, help="HEALPix nside (default 256)")
    parser.add_argument("--repeat", type=_positive_int, default=5, help="timed repetitions; the best is kept (default 5)")
    parser.add_argument("--threads", type=_positive_int, default=1, help="threads per rank for the FFTs (default 1)")
    parser.add_argument("--json", action="store_true", help="print only JSON on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mapmaker",
        description="MapCampaign map-maker: on-the-fly TOD simulation and distributed PCG map-making.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_realize(commands)
    _add_preprocess(commands)
    _add_bench(commands)
    return parser


def _run_realize(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from mapmaker.planfile import PlanRefused, load_plan
    from mapmaker.preprocess import plan_identity
    from mapmaker.products import OutputExists, refuse_existing
    from mapmaker.realize import realize_to_folder
    from mapmaker.reduction import ReductionUnavailable, resolve_strategy
    from mapmaker.sky import SkyError
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
        except OutputExists as error:
            out_problem = str(error)
    out_problem = comm.bcast(out_problem, root=0)
    if out_problem:
        return fail(out_problem)

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
            plan=plan, plan_document=plan_document,
        )
    except SkyError as error:
        return fail(f"sky: {error}")
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


def _run_preprocess(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from mapmaker.preprocess import run_preprocess
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
    for option, path in (("--out", args.out), ("--report", args.report)):
        if path is not None and path.is_dir():
            return fail(f"{option} {str(path)!r} is a folder; give a file name")
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


def _run_bench(args: argparse.Namespace) -> int:
    from mapmaker.bench import run_bench

    return run_bench(samples=args.samples, nside=args.nside, repeat=args.repeat, threads=args.threads, as_json=args.json)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "realize":
        return _run_realize(args)
    if args.command == "preprocess":
        return _run_preprocess(args)
    if args.command == "bench":
        return _run_bench(args)
    raise AssertionError(args.command)
