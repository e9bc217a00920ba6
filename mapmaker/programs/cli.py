"""Command line of the map-maker: ``python -m mapmaker COMMAND ...``.

Run it under MPI as ``mpiexec -n P python -m mpi4py -m mapmaker realize ...``
so that an exception on one rank aborts all of them. Exit status:
:class:`schemas.programs.MapmakerExit` (0 success, 2 bad input -- spec,
options, sky map, existing --out --, 3 overlap plan or coupling refused:
``realize --plan`` with a plan, or ``realize --coupling`` with a coupling file,
that does not match the run or is damaged, never rebuilt silently); anything
else a failure of the run. Heavy modules (numpy, healpy,
mpi4py) are imported only once a command runs, so ``--help`` is instant.

Commands: ``realize``, ``preprocess``, ``calibrate``, ``model``, ``bench`` and ``bandpowers``,
each a ``_add_<name>`` parser builder here and a ``run_<name>`` function in
:mod:`mapmaker.programs.commands`.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _nside(text: str) -> int:
    from schemas.spec import MAX_NSIDE  # deferred like the commands (see main): schemas.spec loads pydantic, 0.5 s

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
        "--instrument-root", type=Path, default=None, metavar="DIR",
        help="folder that a spec's focal_plane.file (a TOAST focal-plane HDF5 file) is relative to",
    )
    parser.add_argument(
        "--plan", type=Path, default=None, metavar="PLAN",
        help="overlap plan from 'preprocess' for this spec and rank count; a mismatched or damaged plan exits 3",
    )
    parser.add_argument(
        "--calibration", type=Path, default=None, metavar="FILE",
        help="site calibration from 'calibrate' that reduction 'auto' models with (default: the paper's Franklin figures)",
    )
    parser.add_argument(
        "--coupling", type=Path, default=None, metavar="FILE",
        help="mode-coupling file of the bandpowers: read if it exists (one built for another mask, binning or "
        "purify_b exits 4), else built and written here for the next realisations",
    )
    parser.add_argument(
        "--coarse-cache", type=Path, default=None, metavar="FILE",
        help="coarse operator of the two-level preconditioner: read if it exists and fits this run, else built "
        "(a damaged or foreign file is refused, rebuilt and replaced) and written here for the next realisations",
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
    parser.add_argument(
        "--instrument-root", type=Path, default=None, metavar="DIR",
        help="folder that a spec's focal_plane.file (a TOAST focal-plane HDF5 file) is relative to",
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
    parser.add_argument(
        "--instrument-root", type=Path, default=None, metavar="DIR",
        help="folder that a spec's focal_plane.file or schedule file is relative to",
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
    parser.add_argument(
        "--threads-per-rank", type=_positive_int, default=1, metavar="T",
        help="ranks x threads: --ranks counts cores, the model decomposes into cores / T ranks of T threads (the "
        "same samples on fewer, fatter ranks); default 1",
    )
    parser.add_argument(
        "--cores-per-node", type=_positive_int, default=None, metavar="C",
        help="cores per node: the C / T ranks of a node share its network interface (beta x C / T); default: "
        "every rank has the link to itself",
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
    parser.add_argument(
        "--instrument-root", type=Path, default=None, metavar="DIR",
        help="folder that the --spec's focal_plane.file and schedule file (TOAST files) are relative to",
    )
    parser.add_argument("--json", action="store_true", help="print only JSON on stdout")


def _add_bandpowers(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bandpowers",
        help="decoupled bandpowers of one HEALPix I/Q/U map on a campaign's mask",
        description=(
            "Remove the I map's monopole and dipole over the mask, then compute its decoupled (MASTER) "
            "bandpowers TT EE BB TE EB TB with the mask's coupling (read from --coupling, or built and written "
            "there), and write them as JSON (schemas.result.MapBandpowers) to --out. Exit 2: the map cannot be "
            "used; exit 4: the "
            "mask or coupling is not the one --mask-sha256 names."
        ),
    )
    parser.add_argument("--map", required=True, type=Path, metavar="FITS", help="HEALPix I, Q, U map (K, RING)")
    parser.add_argument("--mask", required=True, type=Path, metavar="FITS", help="the apodised analysis mask")
    parser.add_argument("--mask-sha256", required=True, metavar="HEX", help="the mask's checksum (coupling identity)")
    parser.add_argument("--bin-width", required=True, type=_positive_int, metavar="W", help="multipoles per bin")
    parser.add_argument("--lmax", required=True, type=_positive_int, metavar="L", help="band limit (3 nside - 1)")
    parser.add_argument("--purify-b", action=argparse.BooleanOptionalAction, default=True, help="pure-B estimator")
    parser.add_argument(
        "--coupling", type=Path, default=None, metavar="NPZ",
        help="coupling file: read if it exists, else built and written there for the next map",
    )  # fmt: skip
    parser.add_argument("--out", required=True, type=Path, metavar="JSON", help="where to write the bandpowers")


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
    _add_bandpowers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Deferred until a command runs, so that --help and usage errors stay instant: `python -m mapmaker --help`
    # takes 0.2 s, importing the commands (numpy, scipy, healpy, mpi4py, pydantic) 3-4 s on this project's
    # 2-core machine (/usr/bin/time).
    from mapmaker.programs import commands

    return commands.run(args)
