"""Run under mpiexec: every reduction strategy against a serial sum, on random local pixel sets.

Each rank's set is drawn from a generator seeded by the rank (rank 2, when
present, observes nothing), so every rank can rebuild every set and the
exact sums. Checks, on the communicator it is given:

* the collective plan equals the serial plan of the same sets (same sift);
* the plan file written with MPI-IO reads back identically (argv[1] folder);
* reduce() of every strategy (hybrid's tau forced to 2 and 3, and
  model-chosen; the overlap variants also by start() / finish(), the
  persistent neighbourhood collective by a second call) and auto equals the serial sum to 1e-13 relative, for
  k = 1, 3, 12, with MPI messages capped at 7 doubles as well (rounds and
  pieces of the 32-bit-count logic);
* the bytes each rank counted equal the model's figures (commodel), exactly;
* the plan-driven strategies with the compiled exchange kernels (the runs' ``Kernels.exchange``) give the
  numpy reference's sums bit for bit.

Prints "reduction checks passed on N ranks" from rank 0.
"""
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mapmaker.kernels import exchange_fast
from mapmaker.parallel import commodel
from mapmaker.parallel.overlap import PLAN_ARRAYS, build_overlap_plan, plan_from_pixel_sets
from mapmaker.parallel.planfile import PlanIdentity, load_plan, write_plan
from mapmaker.parallel.reduction import PLAN_STRATEGIES, make_reduction

NPIX = 3000
BUFFER = 700


def pixels_of(rank: int) -> np.ndarray:
    if rank == 2:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(rank + 10)
    centre = rng.integers(0, NPIX)
    window = (centre + rng.integers(-500, 500, size=700)) % NPIX
    return np.unique(np.concatenate([window, rng.choice(NPIX, 60, replace=False), [0, 1, NPIX - 1]])).astype(np.int64)


def values_of(rank: int, pixels: np.ndarray, k: int) -> np.ndarray:
    return np.sin(pixels[:, None] * 0.37 + rank * 1.3 + np.arange(k)[None, :]) * 10.0 ** (rank % 3)


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    everyone = [pixels_of(r) for r in range(size)]
    mine = everyone[rank]

    plan = build_overlap_plan(comm, mine, NPIX, BUFFER, max_ids=500)
    serial = plan_from_pixel_sets(rank, everyone, NPIX, BUFFER)
    for name in PLAN_ARRAYS:
        np.testing.assert_array_equal(getattr(plan, name), getattr(serial, name), err_msg=name)

    folder = Path(sys.argv[1])
    identity = PlanIdentity("k" * 64, size, "d" * 64)
    write_plan(comm, folder / "plan.bin", plan, identity, {"npix": NPIX})
    loaded, document = load_plan(comm, folder / "plan.bin", identity)
    for name in PLAN_ARRAYS:
        np.testing.assert_array_equal(getattr(loaded, name), getattr(plan, name), err_msg=name)
    assert document["ranks"] == size and len(document["header_sha256"]) == 64

    figures = commodel.figures_from_plan(comm, plan)
    cases = [(name, None) for name in ("allreduce", *PLAN_STRATEGIES, "auto")]
    if size > 1:
        cases += [("hybrid", 2), ("hybrid", 3)]
    for name, threshold in cases:
        for max_elements in ((1 << 31) - 1, 7):
            for k in (1, 3, 12):
                reduction = make_reduction(
                    name, comm, mine, npix=NPIX, buffer_pixels=BUFFER, plan=loaded,
                    max_elements=max_elements, hybrid_threshold=threshold,
                )
                values = np.ascontiguousarray(values_of(rank, mine, k))
                reduction.reduce(values)
                total = np.zeros((NPIX, k))
                for other, theirs in enumerate(everyone):
                    total[theirs] += values_of(other, theirs, k)
                np.testing.assert_allclose(values, total[mine], rtol=1e-13, atol=1e-13 * np.abs(total).max())
                # A second call reuses what the first set up (persistent requests, cached positions); the
                # overlap variants also through start() / finish(): the same sums, bit for bit.
                again = np.ascontiguousarray(values_of(rank, mine, k))
                if reduction.overlaps:
                    reduction.start(again)
                    reduction.finish()
                else:
                    reduction.reduce(again)
                np.testing.assert_array_equal(again, values, err_msg=f"{name} second call")
                # The bytes this rank counted are the model's, exactly.
                counted = np.array(comm.allgather(reduction.bytes_sent), dtype=np.float64)
                modeled = reduction.name != "hybrid" or reduction.threshold in figures.thresholds
                if max_elements > 7 and modeled:
                    if reduction.name == "hybrid":
                        cost = commodel.hybrid_cost(
                            figures, commodel.FRANKLIN, reduction.threshold, k=k, buffer_pixels=BUFFER
                        )
                    else:
                        cost = commodel.strategy_costs(figures, commodel.FRANKLIN, k=k, buffer_pixels=BUFFER)[
                            reduction.name
                        ]
                    assert counted.max() == cost.bytes_max and counted.mean() == cost.bytes_mean, (name, k, counted, cost)
                    messages = np.array(comm.allgather(reduction.messages_sent), dtype=np.float64)
                    assert messages.max() == cost.messages_max, (name, k, messages, cost)
                if name in ("alltoallv", "neighbor", "pairwise", "alltoallv-overlap", "neighbor-overlap"):
                    assert reduction.bytes_sent == 8 * k * plan.n_shared
                if name == "auto":
                    assert reduction.selection.chosen == reduction.name
                if name != "allreduce" and name != "butterfly":
                    compiled = make_reduction(
                        name, comm, mine, npix=NPIX, buffer_pixels=BUFFER, plan=loaded, max_elements=max_elements,
                        hybrid_threshold=threshold, exchange=exchange_fast,
                    )
                    summed = np.ascontiguousarray(values_of(rank, mine, k))
                    compiled.reduce(summed)
                    np.testing.assert_array_equal(summed, values, err_msg=f"{name} with the compiled exchange")
    comm.Barrier()
    if rank == 0:
        print(f"reduction checks passed on {size} ranks")


main()
