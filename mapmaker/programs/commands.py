"""The map-maker's commands, run once :mod:`mapmaker.programs.cli` has parsed the command line.

One ``run_<name>`` per command; each takes the parsed arguments and returns
the exit status (:class:`schemas.programs.MapmakerExit`; 1 for a failure of
the run that is not the input's fault).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mpi4py import MPI
from pydantic import ValidationError

from campaignlib.instrument import FocalPlaneFileError, resolve_files
from mapmaker.kernels import implementation
from mapmaker.model.bandpowers import CouplingMismatch
from mapmaker.model.sky import SkyError
from mapmaker.parallel.commodel import DEFAULT_MACHINE, Machine, load_machine
from mapmaker.parallel.overlap_model import project
from mapmaker.parallel.planfile import PlanRefused, load_plan
from mapmaker.parallel.reduction import ReductionUnavailable, resolve_strategy
from mapmaker.programs.bench import run_bench, run_hybrid
from mapmaker.programs.calibrate import run_calibration
from mapmaker.programs.preprocess import plan_identity, run_preprocess
from mapmaker.programs.products import OutputExists, OutputUnusable, refuse_existing, refuse_unwritable
from mapmaker.programs.realize import realize_to_folder
from mapmaker.programs.spectrum import MapUnusable, map_bandpowers
from mapmaker.solve.realization import NothingToSolve
from schemas.files import atomic_write_json
from schemas.io import SpecError, load_spec
from schemas.programs import MapmakerExit

RUN_FAILED = 1  # a failure of the run itself (an OSError writing the plan, say): not in MapmakerExit


def run(args: argparse.Namespace) -> int:
    """Run the command ``args.command`` of a parsed command line."""
    commands = {
        "realize": run_realize,
        "preprocess": run_preprocess_command,
        "calibrate": run_calibrate,
        "model": run_model,
        "bench": run_bench_command,
        "bandpowers": run_bandpowers_command,
    }
    return commands[args.command](args)


def run_realize(args: argparse.Namespace) -> int:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def fail(message: str, collective: bool = True, code: int = MapmakerExit.BAD_INPUT) -> int:
        if rank == 0:
            print(f"mapmaker realize: {message}", file=sys.stderr, flush=True)
        if collective:
            # Every rank exits with the code; without this barrier the first to exit aborts the
            # others (python -m mpi4py turns a non-zero exit into MPI_Abort) before rank 0 has spoken.
            comm.Barrier()
        return code

    # Every rank checks the same inputs and reaches the same verdict; only --out is checked once.
    try:
        spec = resolve_files(load_spec(args.spec), args.instrument_root)
    except SpecError as error:
        return fail("invalid spec\n" + str(error))
    except FocalPlaneFileError as error:
        return fail(str(error))
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
            machine = load_calibration(args.calibration)
        except ValueError as error:
            return fail(str(error))

    plan, plan_document = None, None
    if args.plan is not None:
        try:
            plan, plan_document = load_plan(comm, args.plan, plan_identity(spec, comm.Get_size()))
        except PlanRefused as error:
            return fail(f"plan refused: {error}", code=MapmakerExit.PLAN_REFUSED)

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
            coupling_path=args.coupling, coarse_cache=args.coarse_cache,
        )
    except SkyError as error:
        return fail(f"sky: {error}")
    except NothingToSolve as error:  # raised on every rank
        return fail(f"nothing to solve: {error}")
    except PlanRefused as error:  # raised on every rank, after the pixels were compared
        return fail(f"plan refused: {error}", code=MapmakerExit.PLAN_REFUSED)
    except CouplingMismatch as error:  # raised on every rank, before the solve or once the mask is known
        return fail(str(error), code=MapmakerExit.COUPLING_REFUSED)
    except OutputUnusable as error:  # --coupling cannot be written: raised on every rank before the solve
        return fail(str(error))
    except OutputExists as error:  # --out appeared during the run; only root sees it
        return fail(str(error), collective=False)
    if rank == 0 and not args.quiet:
        assert result is not None  # realize_to_folder returns the result on rank 0
        state = "converged" if result.converged else "NOT converged"
        print(
            f"realisation {args.realization}: {state} in {result.iterations} iterations "
            f"(residual {result.residual_history[-1]:.2e}), {result.timing.total:.1f} s; maps in {args.out}",
            file=sys.stderr, flush=True,
        )
    return MapmakerExit.OK


def load_calibration(path: Path) -> Machine:
    """The :class:`mapmaker.parallel.commodel.Machine` of a calibration file; ValueError with the reason."""
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


def run_preprocess_command(args: argparse.Namespace) -> int:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def fail(message: str, code: int = MapmakerExit.BAD_INPUT) -> int:
        if rank == 0:
            print(f"mapmaker preprocess: {message}", file=sys.stderr, flush=True)
        comm.Barrier()
        return code

    try:
        spec = resolve_files(load_spec(args.spec), args.instrument_root)
    except SpecError as error:
        return fail("invalid spec\n" + str(error))
    except FocalPlaneFileError as error:
        return fail(str(error))
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
        return fail(str(error), code=RUN_FAILED)
    if rank == 0 and not args.quiet:
        assert report is not None  # run_preprocess returns the report on rank 0
        print(
            f"plan for {report.ranks} ranks: {report.path}, {report.size_bytes} bytes, built in {report.build_time_s:.2f} s",
            file=sys.stderr, flush=True,
        )
    return MapmakerExit.OK


def run_calibrate(args: argparse.Namespace) -> int:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        print("mapmaker calibrate: run it under mpiexec with at least 2 ranks "
              "(mpiexec -n 2 python -m mpi4py -m mapmaker calibrate)", file=sys.stderr)
        return MapmakerExit.BAD_INPUT
    if args.out is not None and args.out.is_dir():
        if rank == 0:
            print(f"mapmaker calibrate: --out {str(args.out)!r} is a folder; give a file name", file=sys.stderr)
        comm.Barrier()
        return MapmakerExit.BAD_INPUT
    progress = None if args.json else (lambda message: print(message, file=sys.stderr, flush=True))
    calibration = run_calibration(comm, repeat=args.repeat, site=args.site, progress=progress)
    if rank != 0:
        return MapmakerExit.OK
    assert calibration is not None  # run_calibration returns the calibration on rank 0
    document = json.loads(calibration.model_dump_json())
    if args.out is not None:
        atomic_write_json(args.out, document, indent=2)
    if args.json:
        print(json.dumps(document, indent=2))
        return MapmakerExit.OK
    print(f"{calibration.ranks} ranks on {calibration.host} ({calibration.mpi}), load {calibration.load_average[0]:.2f}")
    print(f"{'operation':<10} {'alpha (us)':>11} {'bandwidth (GB/s)':>17} {'r2':>6}  form")
    for name in ("p2p", "allreduce", "alltoallv", "allgather", "neighbor", "pairwise"):
        fit = getattr(calibration, name)
        if fit is None:
            continue
        bandwidth = 1e-9 / fit.beta_s_per_byte if fit.beta_s_per_byte > 0 else float("inf")
        r2 = f"{fit.r2:.3f}" if fit.r2 is not None else "-"
        print(f"{name:<10} {fit.alpha_s * 1e6:>11.2f} {bandwidth:>17.2f} {r2:>6}  {fit.formula}")
    print(f"sift: {calibration.sift_s_per_id * 1e9:.1f} ns per id ({1e-6 / calibration.sift_s_per_id:.0f} M ids/s)")
    if args.out is not None:
        print(f"saved to {args.out}")
    return MapmakerExit.OK


def run_model(args: argparse.Namespace) -> int:
    if (args.alpha is None) != (args.beta is None):
        print("mapmaker model: give --alpha and --beta together", file=sys.stderr)
        return MapmakerExit.BAD_INPUT
    if args.alpha is not None and args.calibration is not None:
        print("mapmaker model: give either --alpha/--beta or --calibration, not both", file=sys.stderr)
        return MapmakerExit.BAD_INPUT
    try:
        spec = resolve_files(load_spec(args.spec), args.instrument_root)
    except SpecError as error:
        print(f"mapmaker model: invalid spec\n{error}", file=sys.stderr)
        return MapmakerExit.BAD_INPUT
    except FocalPlaneFileError as error:
        print(f"mapmaker model: {error}", file=sys.stderr)
        return MapmakerExit.BAD_INPUT
    if args.alpha is not None:
        machine = Machine.uniform(args.alpha, args.beta, f"alpha {args.alpha:g} s, beta {args.beta:g} s/byte")
    elif args.calibration is not None:
        try:
            machine = load_calibration(args.calibration)
        except ValueError as error:
            print(f"mapmaker model: {error}", file=sys.stderr)
            return MapmakerExit.BAD_INPUT
    else:
        machine = DEFAULT_MACHINE
    progress = None if args.json else (lambda message: print(message, file=sys.stderr, flush=True))
    report = project(spec, args.ranks, machine, time_step=args.time_step, progress=progress,
                     threads_per_rank=args.threads_per_rank, cores_per_node=args.cores_per_node)
    if args.json:
        print(json.dumps(report, indent=2))
        return MapmakerExit.OK
    print(f"model of {args.spec} ({report['npix']} pixels; {machine.name}); per reduction of 3 values per pixel,")
    print(f"slowest rank; campaign = {report['realizations']} realisation(s) x ({report['iterations']} iterations + 2 "
          "reductions) + one preprocessing")
    for projection in report["projections"]:
        overlap = projection["overlap"]
        exact = "" if overlap["neighbours_exact"] else " (sampled)"
        print(
            f"\n{projection['ranks']} ranks x {report['threads_per_rank']} threads: {overlap['local_pixels_max']} pixels per rank at most "
            f"(mean {overlap['local_pixels_mean']:.0f}), n_all / observed = {overlap['mean_multiplicity']:.2f}, "
            f"shared per rank {overlap['shared_pixels_max']} at most ({overlap['shared_fraction_max']:.2f} n_i), "
            f"neighbours {overlap['neighbours_max']}{exact} at most; {overlap['ranks_without_pixels']} ranks without pixels"
        )
        pre = projection["preprocessing"]
        print(f"  preprocessing: allgather {pre['allgather_s']:.3g} s ({pre['allgather_bytes']:.3g} bytes), "
              f"sift {pre['sift_s']:.3g} s")
        print(f"  {'strategy':<17} {'bytes/iter':>11} {'msgs/iter':>10} {'s/iter':>10} {'vs allreduce':>12} {'campaign s':>11}")
        for name, row in projection["strategies"].items():
            speedup = f"{row['speedup_vs_allreduce']:.1f}x" if row["speedup_vs_allreduce"] else "-"
            note = f"  tau={row['threshold']:.0f}, |H|={row['heavy_pixels']:.0f}" if name == "hybrid" else ""
            mark = " <- auto" if name == projection["chosen"] else ""
            print(
                f"  {name:<17} {row['bytes_per_iteration_max']:>11.4g} {row['messages_per_iteration_max']:>10.0f} "
                f"{row['seconds_per_iteration']:>10.3g} {speedup:>12} {row['campaign_s']:>11.4g}{note}{mark}"
            )
    return MapmakerExit.OK


def run_bench_command(args: argparse.Namespace) -> int:
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not kernels or any(k not in implementation.NAMES for k in kernels):
        print(f"mapmaker bench: --kernels takes numpy and/or fast, got {args.kernels!r}", file=sys.stderr)
        return MapmakerExit.BAD_INPUT
    if args.spec is not None:  # refused here, not as a traceback from every rank (or every split of --hybrid)
        try:
            resolve_files(load_spec(args.spec), args.instrument_root)
        except SpecError as error:
            print(f"mapmaker bench: --spec: invalid spec\n{error}", file=sys.stderr)
            return MapmakerExit.BAD_INPUT
        except FocalPlaneFileError as error:
            print(f"mapmaker bench: --spec: {error}", file=sys.stderr)
            return MapmakerExit.BAD_INPUT
    instrument_root = str(args.instrument_root) if args.instrument_root else None
    if args.hybrid:
        return run_hybrid(cores=args.hybrid, samples_total=args.samples * args.hybrid, nside=args.nside,
                          repeat=args.repeat, kernels=",".join(kernels), as_json=args.json,
                          spec_path=str(args.spec) if args.spec else None, clock_name=args.clock, rounds=args.rounds,
                          instrument_root=instrument_root)
    return run_bench(samples=args.samples, nside=args.nside, repeat=args.repeat, threads=args.threads,
                     as_json=args.json, kernels=",".join(kernels), spec_path=str(args.spec) if args.spec else None,
                     clock_name=args.clock, rounds=args.rounds, instrument_root=instrument_root)


def run_bandpowers_command(args: argparse.Namespace) -> int:
    try:
        measured = map_bandpowers(
            map_path=args.map,
            mask_path=args.mask,
            mask_sha256=args.mask_sha256,
            bin_width=args.bin_width,
            lmax=args.lmax,
            purify_b=args.purify_b,
            coupling_path=args.coupling,
        )
    except MapUnusable as error:
        print(f"mapmaker bandpowers: {error}", file=sys.stderr)
        return MapmakerExit.BAD_INPUT
    except CouplingMismatch as error:
        print(f"mapmaker bandpowers: {error}", file=sys.stderr)
        return MapmakerExit.COUPLING_REFUSED
    atomic_write_json(args.out, measured.model_dump(mode="json"))
    return MapmakerExit.OK
