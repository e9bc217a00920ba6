"""The alpha-beta model held against the paper's Figure 6, and what ``auto`` picks at 256-16384 ranks.

    .venv/bin/python benchmarks/bench_paper_model.py --json out.json

The Planck-like scan of ``benchmarks/specs/projection.toml`` (one year, 1 rpm
at 85 degrees, nside 256) is decomposed the way a run would be at 16,384
ranks (the paper's unthreaded Allreduce) and at each system's threaded rank
count (one process per socket: 4,096 on Franklin and Pleiades-H, 2,730 on
Jaguar, Pleiades-W and Hopper); its exact overlap figures are scaled by area
to the paper's map (N_p = 1.5e8 values, 5e7 pixels x I, Q, U;
:func:`mapmaker.parallel.commodel.scale_figures`). For each system the model
gives the per-iteration communication of both configurations and their
ratio, beside the paper's measured speedup:

* ``table2``: Table 2's latency and point-to-point bandwidth for every
  operation, one rank per node -- threads change only the rank count;
* ``per_node``: ranks x threads -- the ranks of a node share its network
  interface (beta x ranks per node: all cores unthreaded, one rank per
  socket threaded);
* ``figure5`` (Franklin): section 5.1's sustained bandwidths, 0.25 and
  0.86 GB/s for the unthreaded and threaded Allreduce, 0.58 and 1.15 GB/s
  for the unthreaded and threaded Allgather fit (used for the Alltoallv);
* ``best``: the cheapest of this project's strategies at the threaded rank
  count (ranks x threads machine), against the same Allreduce.

Then the choice of ``auto`` at 256 ... 16384 ranks for the projection spec
itself and for the paper's map (Franklin, Table 2). Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mapmaker.parallel import commodel
from mapmaker.parallel.overlap_model import chunk_sets, overlap_figures, rank_pixel_sets
from schemas.io import load_spec

PROJECTION_SPEC = REPO / "benchmarks" / "specs" / "projection.toml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--auto-ranks", default="256,1024,2730,4096,16384", help="rank counts of the auto table")
    parser.add_argument("--time-step", type=int, default=1, help="time step of the projection's pointing (default 1)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write every figure here")
    args = parser.parse_args()
    spec = load_spec(PROJECTION_SPEC)
    npix = spec.pixelization.npix
    paper_pixels = commodel.PAPER_MAP_VALUES // 3
    factor = paper_pixels / npix
    workload = commodel.Workload.of_spec(spec)
    started = time.perf_counter()
    sets = chunk_sets(spec, args.time_step)
    counts = sorted({commodel.PAPER_CORES, *(s.threaded_ranks for s in commodel.PAPER_SYSTEMS),
                     *(int(r) for r in args.auto_ranks.split(","))})
    figures, scaled = {}, {}
    for size in counts:
        tick = time.perf_counter()
        figures[size] = overlap_figures(rank_pixel_sets(sets, size), npix)
        scaled[size] = commodel.scale_figures(figures[size], factor, paper_pixels)
        print(f"{size} ranks: overlap figures in {time.perf_counter() - tick:.0f} s", file=sys.stderr, flush=True)

    rows = [commodel.figure6_row(system, scaled[commodel.PAPER_CORES], scaled[system.threaded_ranks],
                                 buffer_pixels=workload.buffer_pixels) for system in commodel.PAPER_SYSTEMS]
    auto = []
    for size in (int(r) for r in args.auto_ranks.split(",")):
        for label, these in (("projection spec", figures[size]), ("paper map", scaled[size])):
            selection = commodel.select_strategy(these, commodel.FRANKLIN, workload)
            auto.append({
                "ranks": size, "map": label, "chosen": selection.chosen,
                **{f"{name} s/iter": selection.modeled[name]["seconds_per_iteration"] for name in commodel.STRATEGY_ORDER},
            })
    overlap = [{
        "ranks": size, "mean_multiplicity": f.total_local / max(int(f.histogram[1:].sum()), 1),
        "shared_fraction_max": float((f.shared / f.n_local.clip(1)).max()), "neighbours_max": int(f.neighbours.max()),
        "neighbours_exact": f.neighbours_exact,
    } for size, f in figures.items()]
    report = {
        "spec": str(PROJECTION_SPEC.relative_to(REPO)), "npix": npix, "paper_pixels": paper_pixels,
        "area_factor": factor, "time_step": args.time_step, "iterations": workload.iterations,
        "realizations": workload.realizations, "seconds": time.perf_counter() - started,
        "figure6": rows, "auto": auto, "overlap": overlap,
    }

    print(f"Figure 6 in the model: {PROJECTION_SPEC.name} scaled to {paper_pixels:.3g} pixels x 3; per iteration")
    print(f"{'system':<11} {'ranks':>5} {'table2':>8} {'per node':>9} {'figure5':>8} {'best (strategy)':>24} {'paper':>7}")
    for row in rows:
        figure5 = f"{row['speedup_figure5']:.1f}x" if "speedup_figure5" in row else "-"
        best = f"{row['best_speedup_per_node']:.1f}x ({row['best_strategy']})"
        print(f"{row['system']:<11} {row['threaded_ranks']:>5} {row['speedup_table2']:>7.1f}x {row['speedup_per_node']:>8.1f}x "
              f"{figure5:>8} {best:>24} {row['paper_speedup']:>6.1f}x")
    print("\nauto (Franklin, Table 2):")
    for entry in auto:
        print(f"  {entry['ranks']:>6} ranks, {entry['map']:<15}: {entry['chosen']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
