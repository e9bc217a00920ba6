"""Deflation by Ritz vectors recycled from earlier realisations: how many PCG iterations it saves.

    .venv/bin/python benchmarks/bench_recycled_deflation.py --json FILE    # nside 64; 512 at a 600 s and a 60 s spin
    .venv/bin/python benchmarks/bench_recycled_deflation.py --problems 512:60 --columns 2,8 --realizations 5

Every realisation of a campaign solves ``A x = b`` with the same ``A = P^T N^-1 P`` and a new ``b``. The
Krylov space of one solve holds approximations of the extreme eigenvectors of ``M_BD^-1 A``, and A-DEF2
accepts any deflation space ``Z`` whose ``A Z`` is known (``mapmaker.solve.coarse``). PCG computes ``A p_j``
for every search direction ``p_j``, so Ritz vectors ``Z = P Y`` come with ``A Z = (A P) Y`` and no further
operator application: a deflation space at no set-up cost (Saad, Yeung, Erhel & Guyomarc'h, SIAM J. Sci.
Comput. 21, 1909, 2000; for CMB map-making, Papez, Grigori & Stompor, A&A 638, A73, 2020).

Here, on the problems of ``benchmarks/bench_default_solver.py`` (``--problems``: the satellite example at
nside 64; ``512``, that scaled to nside 512 with bench_resolution's 600 s spin; ``512:60``, the same with
the example's own 60 s spin, whose 1/f modes are ten times larger on the sky), to 1e-6, under ``mpiexec -n
R`` (``--ranks``): realisation 0 is solved block-diagonal, recording ``p_j`` and ``A p_j``; Rayleigh-Ritz
on their span (``P^T A P y = theta P^T M_BD P y``) gives the K (``--columns``) Ritz vectors of smallest
``theta``; realisation r = 1 .. ``--realizations``-1 (the same set-up, noise draw r) is solved by A-DEF2
on those K vectors, and its own directions are added to the space for the next (Rayleigh-Ritz on ``[Z,
P_r]``, K kept). Printed: the iterations of each realisation, block-diagonal's for realisation 1 beside
them, and the smallest Ritz values of realisation 0's solve. Iterations are counts, not seconds: the load
of a shared machine does not move them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, print_json_on_root, run_ranks_json, write_json

RITZ_VALUES_SHOWN = 8


def run_ranks_here(args: argparse.Namespace) -> dict:
    """Under mpiexec: one set-up, realisation 0 block-diagonal, then the recycled deflation per K."""
    import numpy as np
    import scipy.linalg
    from mpi4py import MPI

    from benchmarks.bench_default_solver import problem
    from mapmaker.kernels import implementation
    from mapmaker.solve.realization import right_hand_side, set_up_realization
    from mapmaker.solve.solver import pcg
    from mapmaker.solve.timing import Timers

    comm = MPI.COMM_WORLD
    spec = problem(args.nside, args.spec, args.spin_period)
    spin_period_s = spec.scan.spin_period_s
    spec = spec.model_copy(update={"solver": spec.solver.model_copy(update={"preconditioner": "block-diagonal"})})
    setup = set_up_realization(spec, 0, comm, sky_root=None, threads=1, kernels=implementation.get("fast"),
                               plan=None, machine=None, timers=Timers(), say=lambda message: None)
    product, smoothed = np.empty((setup.pixels.n_local, 3)), np.empty((setup.pixels.n_local, 3))
    dot = setup.pixels.dot
    tol, max_iter = spec.solver.tol, spec.solver.max_iter

    def apply_matrix(x):
        setup.local.apply_operator(x, workers=1, out=product)
        setup.reduction.reduce(product)
        return product

    def block_diagonal(r):
        return setup.kernels.blocks.apply(setup.inverse_blocks, r, out=smoothed)

    # M_BD itself (the preconditioner applies its inverse blocks): for the Rayleigh-Ritz metric.
    blocks = np.zeros_like(setup.inverse_blocks)
    solved = np.abs(np.linalg.det(setup.inverse_blocks)) > 0
    blocks[solved] = np.linalg.inv(setup.inverse_blocks[solved])

    def rhs(realization: int):
        setup.realization = realization
        return right_hand_side(setup, Timers())

    def solve_recording(b, deflation):
        """PCG on b (block-diagonal, or A-DEF2 on ``deflation = (Z, A Z)``), recording (p_j, A p_j)."""
        directions, images = [], []

        def recording(p):
            directions.append(p.copy())
            images.append(apply_matrix(p).copy())
            return images[-1]

        if deflation is None:
            return pcg(recording, block_diagonal, dot, b, tol=tol, max_iter=max_iter), directions, images
        basis, basis_images = deflation
        factor = scipy.linalg.cho_factor(gram(basis, basis_images))

        def adef2(r):
            smooth = block_diagonal(r).copy()
            y = scipy.linalg.cho_solve(factor, [dot(z, r) - dot(az, smooth) for z, az in zip(basis, basis_images)])
            return smooth + np.tensordot(y, basis, axes=1)

        x0 = np.tensordot(scipy.linalg.cho_solve(factor, [dot(z, b) for z in basis]), basis, axes=1)
        result = pcg(recording, adef2, dot, b, tol=tol, max_iter=max_iter, x0=x0, initial_residual=b - apply_matrix(x0))
        return result, directions, images

    def gram(left, right):
        """``left^T right`` for a pair whose product is symmetric (``A``, ``M_BD`` are): the upper triangle's dots."""
        matrix = np.empty((len(left), len(left)))
        for i, u in enumerate(left):
            for j in range(i, len(left)):
                matrix[i, j] = matrix[j, i] = dot(u, right[j])
        return matrix

    def ritz(vectors, images, k):
        """The k Ritz pairs of smallest value of M_BD^-1 A on span(vectors): (values, Z, A Z)."""
        metric = gram(vectors, [np.einsum("nij,nj->ni", blocks, v) for v in vectors])
        values, coefficients = scipy.linalg.eigh(gram(vectors, images), metric)
        chosen = coefficients[:, :k].T
        return values, np.tensordot(chosen, np.stack(vectors), axes=1), np.tensordot(chosen, np.stack(images), axes=1)

    right_hand_sides = [rhs(realization) for realization in range(args.realizations)]  # the same for every K
    first, directions, images = solve_recording(right_hand_sides[0], None)
    block_diagonal_second = pcg(apply_matrix, block_diagonal, dot, right_hand_sides[1], tol=tol,
                                max_iter=max_iter).iterations
    spectrum = ritz(directions, images, 0)[0]
    runs = []
    for k in [int(c) for c in args.columns.split(",")]:
        _, basis, basis_images = ritz(directions, images, k)
        iterations = []
        for realization in range(1, args.realizations):
            result, new, new_images = solve_recording(right_hand_sides[realization], (basis, basis_images))
            iterations.append(result.iterations)
            _, basis, basis_images = ritz(list(basis) + new, list(basis_images) + new_images, k)
        runs.append({"columns": k, "iterations": iterations})
    return {"ranks": comm.Get_size(), "nside": spec.pixelization.nside, "spin_period_s": spin_period_s,
            "samples": spec.total_samples,
            "tol": tol, "block_diagonal_iterations": [first.iterations, block_diagonal_second],
            "smallest_ritz_values": [round(float(v), 4) for v in spectrum[:RITZ_VALUES_SHOWN]],
            "largest_ritz_value": round(float(spectrum[-1]), 4), "recycled": runs}


def print_table(runs: list[dict]) -> None:
    for figures in runs:
        print(f"nside {figures['nside']}, {figures['spin_period_s']:g} s spin, {figures['ranks']} rank(s), "
              f"{figures['samples']:,} samples, tol "
              f"{figures['tol']:g}: block-diagonal {figures['block_diagonal_iterations'][0]} iterations "
              f"(realisation 0), {figures['block_diagonal_iterations'][1]} (realisation 1)")
        print(f"  Ritz values of M_BD^-1 A, smallest: {figures['smallest_ritz_values']}; largest "
              f"{figures['largest_ritz_value']}")
        for row in figures["recycled"]:
            print(f"  K = {row['columns']:3d} recycled Ritz vectors: iterations of realisations 1.. "
                  f"{row['iterations']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", default="64,512,512:60",
                        help="NSIDE[:SPIN_S], 64 the satellite example, else scaled (default 64,512,512:60)")
    parser.add_argument("--spec", default=None, help="a campaign spec file instead (--problems ignored)")
    parser.add_argument("--spin-period", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=1, help="ranks under mpiexec (default 1)")
    parser.add_argument("--columns", default="4,16", help="Ritz vectors kept, K (default 4,16)")
    parser.add_argument("--realizations", type=int, default=4, help="realisations solved, the first block-diagonal")
    parser.add_argument("--nside", type=int, default=64, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.worker:
        print_json_on_root(run_ranks_here(args))
        return 0
    problems = [["--spec", args.spec]] if args.spec else [
        ["--nside", nside, *(["--spin-period", spin] if spin else [])]
        for nside, _, spin in (problem.partition(":") for problem in args.problems.split(","))]
    runs = [run_ranks_json(args.ranks, __file__, "--worker", *problem, "--columns", args.columns,
                           "--realizations", str(args.realizations)) for problem in problems]
    if args.json != "-":
        print_table(runs)
    write_json(args.json, {"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
