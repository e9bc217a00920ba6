"""Run under mpiexec: every preconditioner, and each way ``auto`` resolves, solves to the default's map.

A masked sky (a 1 h satellite scan seeing part of the nside-16 sphere; 1/f noise, a CMB sky, tol 1e-10),
solved with the default (``auto`` with no coarse cache: block-diagonal), block-diagonal, two-level (A-DEF2),
two-level with the coarse space's I columns alone, two-level-additive, and ``auto`` with a coarse cache shared by the campaign's realisations: the first run
builds and writes it (two-level), the second reads it (a timed trial of two-level), the third solves with
block-diagonal (the other trial) and the fourth with the faster of the two; ``auto`` with a cache for a one-realisation campaign
builds nothing; and the default and two-level again with the local pixel rows numbered in visit order (the
fast path's order for local maps beyond the caches, forced here on this small map). Rank 0 compares each
gathered map with the default's (1e-7 of the largest |value|, per Stokes component over the solved pixels:
the solve's tolerance, 1e-10, times the condition of the system) and prints the preconditioner each run
solved with and its iterations. argv[1]: a scratch folder for the
coarse cache file. Exits non-zero (aborting all ranks) on a failed check.
"""
import sys
from pathlib import Path

import healpy as hp
import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit"))
from mapmaker_cases import make_spec

from mapmaker.solve import local_data, realization
from mapmaker.solve.realization import run_realization

CHANGES = {
    "noise.f_knee_hz": 0.2, "noise.f_min_hz": 1e-4, "scan.duration_s": 3600.0, "scan.chunk_s": 900.0,
    "scan.drift_deg_per_day": 0.0, "solver.tol": 1e-10, "solver.coarse_nside": 2,
}


def main() -> None:
    comm = MPI.COMM_WORLD
    cache = Path(sys.argv[1]) / f"coarse-{comm.Get_size()}.npz"
    if comm.Get_rank() == 0:
        cache.unlink(missing_ok=True)
    comm.Barrier()
    runs = {
        "default": run_realization(make_spec(CHANGES), 0, comm),
        "block-diagonal": run_realization(make_spec({**CHANGES, "solver.preconditioner": "block-diagonal"}), 0, comm),
        "two-level": run_realization(make_spec({**CHANGES, "solver.preconditioner": "two-level"}), 0, comm),
        "two-level-additive": run_realization(
            make_spec({**CHANGES, "solver.preconditioner": "two-level-additive"}), 0, comm
        ),
        "two-level-I": run_realization(
            make_spec({**CHANGES, "solver.preconditioner": "two-level", "solver.coarse_stokes": "I"}), 0, comm
        ),
        "auto-one-realisation": run_realization(make_spec(CHANGES, realizations=1), 0, comm, coarse_cache=cache),
        "auto-builds": run_realization(make_spec(CHANGES), 0, comm, coarse_cache=cache),
        "auto-reads": run_realization(make_spec(CHANGES), 0, comm, coarse_cache=cache),
        "auto-times-block-diagonal": run_realization(make_spec(CHANGES), 0, comm, coarse_cache=cache),
        "auto-keeps-the-faster": run_realization(make_spec(CHANGES), 0, comm, coarse_cache=cache),
    }
    local_data.VISIT_ORDER_MIN_LOCAL_PIXELS = 0  # every rank's rows in visit order from here on
    row_orders = []  # what each of these solves' pointing caches used: the check compares nothing otherwise

    def recording_build(*args, **kwargs):
        local = local_data.build_local_data(*args, **kwargs)
        row_orders.append("sorted" if local.order is None else "visit")
        return local

    realization.build_local_data = recording_build
    runs["visit-order"] = run_realization(make_spec(CHANGES), 0, comm)
    runs["visit-order-two-level"] = run_realization(make_spec({**CHANGES, "solver.preconditioner": "two-level"}), 0, comm)
    assert row_orders == ["visit", "visit"], row_orders
    assert runs["visit-order"].pcg.iterations == runs["default"].pcg.iterations
    assert runs["visit-order-two-level"].pcg.iterations == runs["two-level"].pcg.iterations
    solved_with = {name: run.stats.preconditioner for name, run in runs.items()}
    expected = {"default": "block-diagonal", "block-diagonal": "block-diagonal", "two-level": "two-level",
                "two-level-additive": "two-level-additive", "two-level-I": "two-level",
                "auto-one-realisation": "block-diagonal",
                "auto-builds": "two-level", "auto-reads": "two-level",
                "auto-times-block-diagonal": "block-diagonal",
                "auto-keeps-the-faster": solved_with["auto-keeps-the-faster"], "visit-order": "block-diagonal",
                "visit-order-two-level": "two-level"}
    assert solved_with == expected, solved_with
    timed = {name: runs[name].stats.solve_timed for name in ("auto-builds", "auto-reads", "auto-times-block-diagonal",
                                                             "auto-keeps-the-faster")}
    assert timed == {"auto-builds": False, "auto-reads": True, "auto-times-block-diagonal": True,
                     "auto-keeps-the-faster": False}, timed
    assert "faster" in runs["auto-keeps-the-faster"].stats.preconditioner_why
    assert runs["two-level-I"].stats.coarse_columns * 3 == runs["two-level"].stats.coarse_columns
    assert runs["auto-one-realisation"].stats.coarse_source is None
    assert runs["auto-builds"].stats.coarse_source == "built" and runs["auto-builds"].stats.coarse_written
    assert runs["auto-reads"].stats.coarse_source == "file"
    assert runs["auto-reads"].pcg.iterations == runs["two-level"].pcg.iterations
    assert runs["auto-reads"].pcg.iterations < runs["default"].pcg.iterations
    if comm.Get_rank() != 0:
        return
    default = runs["default"].iqu
    solved = default[0] != hp.UNSEEN
    assert 0 < np.count_nonzero(solved) < 0.9 * solved.size, np.count_nonzero(solved)  # a masked sky
    for name, run in runs.items():
        assert run.pcg.converged, name
        assert np.array_equal(run.iqu[0] != hp.UNSEEN, solved), name
        for s in range(3):
            scale = np.max(np.abs(default[s][solved]))
            worst = np.max(np.abs(run.iqu[s][solved] - default[s][solved]))
            assert worst <= 1e-7 * scale, (name, s, worst / scale)
    print("iterations " + " ".join(f"{name}={run.stats.preconditioner}:{run.pcg.iterations}" for name, run in runs.items()))
    print(f"preconditioner modes checks passed on {comm.Get_size()} ranks")


if __name__ == "__main__":
    main()
