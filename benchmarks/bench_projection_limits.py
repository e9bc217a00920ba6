#!/usr/bin/env python3
"""What bounds P and P^T on this core: the bench's scan against the same loops with the map taken away.

``python -m mapmaker bench`` times P and P^T against the copy floor (24 bytes a sample: the int32 index and
3 float32 weights read, the float64 TOD written or read, at ``np.copyto``'s rate). This script builds the same
synthetic satellite scan (``--samples``, ``--nside``) and times, in interleaved rounds with the copy rate,

* ``scan``: the fast P and P^T on the scan's own pixel rows (what ``mapmaker bench`` reports below
  ``VISIT_ORDER_SAMPLES_PER_PIXEL`` samples per local pixel);
* ``visit order``: the same after :func:`first_visit_order` renumbers the rows (locality of the map; what
  ``mapmaker bench`` reports above that);
* ``map in L1/L2``: the same loops with every pixel folded into 1,024 rows (24 KiB, runs kept): the loops'
  own cost when no map row ever misses;
* ``random pixels``: uniformly random rows of the same map: a pure random gather / scatter;
* ``stream only``: a numba loop that reads the index and the weights and writes a float64 per sample with no
  map at all: the 24 bytes a sample alone.

P^T adds into a kept map, as in ``mapmaker bench`` and the PCG operator (no fresh pages). Each row prints
seconds and ``times_copy_floor`` (seconds over 24 x samples / copy rate), best of
``--rounds``; ``--clock cpu`` times the process's CPU time (a shared machine's other work then counts less).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

BYTES_PER_SAMPLE = 24
COPY_ELEMENTS = 1 << 25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=12_000_000, help="samples of the scan (default 12M)")
    parser.add_argument("--nside", type=int, default=256, help="HEALPix nside of the scan (default 256)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; the best is kept (default 7)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    # Deferred: numba and the map-maker take seconds to import, which --help never pays.
    import numba
    from numba import njit

    from mapmaker.kernels import projection_fast, threads
    from mapmaker.model.decomposition import chunk_layout, decompose
    from mapmaker.model.noise import NoiseModel
    from mapmaker.programs.bench import bench_spec
    from mapmaker.solve.local_data import build_local_data

    @njit(nogil=True)
    def stream_only(local_index, weights, out):
        for t in range(len(out)):
            out[t] = weights[t, 0] + weights[t, 1] + weights[t, 2] + local_index[t]

    threads.configure(1)
    spec = bench_spec(args.samples, args.nside)
    layout = chunk_layout(spec)
    local = build_local_data(spec, layout, decompose(layout, 1).chunks_of(0), NoiseModel(spec, layout), "fast",
                             pixel_order="sorted")
    index, weights, n_local = local.local_index, local.weights, local.n_local
    n = len(index)
    rng = np.random.default_rng(0)
    local_map = rng.standard_normal((n_local, 3))
    tod = rng.standard_normal(n)
    out = np.empty(n)
    kept_map = np.zeros((n_local, 3))
    visit = index.copy()
    projection_fast.first_visit_order(visit, n_local)
    indices = {
        "scan": index,
        "visit order": visit,
        "map in L1/L2": (index % 1024).astype(index.dtype),
        "random pixels": rng.integers(0, n_local, n).astype(index.dtype),
    }
    source, target = np.ones(COPY_ELEMENTS), np.zeros(COPY_ELEMENTS)
    cases = {"copy": lambda: np.copyto(target, source),
             "stream only": lambda: stream_only(index, weights, out)}
    for name, rows in indices.items():
        cases[f"P, {name}"] = lambda rows=rows: projection_fast.project_map_to_tod(local_map, rows, weights, out=out)
        cases[f"P^T, {name}"] = lambda rows=rows: projection_fast.accumulate_tod_to_map(
            tod, rows, weights, n_local, out=kept_map
        )
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    best = dict.fromkeys(cases, float("inf"))
    for operation in cases.values():
        operation()  # compile, fault the pages in
    for _ in range(args.rounds):
        for name, operation in cases.items():
            start = clock()
            operation()
            best[name] = min(best[name], clock() - start)
    copy_rate = 16.0 * COPY_ELEMENTS / best.pop("copy")
    floor = BYTES_PER_SAMPLE * n / copy_rate
    rows = [{"case": name, "seconds": seconds, "times_copy_floor": seconds / floor} for name, seconds in best.items()]
    report = {"samples": n, "nside": args.nside, "local_pixels": n_local, "clock": args.clock,
              "numba_threads": numba.get_num_threads(), "copy_bytes_per_second": copy_rate,
              "copy_floor_seconds": floor, "cases": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{n:,} samples, nside {args.nside} ({n_local:,} local pixels), {args.clock} clock; copy "
          f"{copy_rate / 1e9:.1f} GB/s, floor {floor * 1e3:.2f} ms ({BYTES_PER_SAMPLE} bytes a sample)")
    for row in rows:
        print(f"{row['case']:<26}{row['seconds'] * 1e3:>9.2f} ms{row['times_copy_floor']:>8.2f} x copy floor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
