#!/usr/bin/env python3
"""What bounds P and P^T on this core: the bench's scan against the same loops with the map taken away.

``python -m mapmaker bench`` times P and P^T against the copy floor (24 bytes a sample: the int32 index and
3 float32 weights read, the float64 TOD written or read, at ``np.copyto``'s rate). This script builds the same
synthetic satellite scan (``--samples``, ``--nside``) and times, in interleaved rounds with the copy rate,

* ``scan``: the fast P and P^T on the scan's own pixel rows, sorted (what ``mapmaker bench`` reports up to
  ``VISIT_ORDER_MIN_LOCAL_PIXELS`` local pixels);
* ``visit order``: the same after :func:`first_visit_order` renumbers the rows (locality of the map; what
  ``mapmaker bench`` reports above that, as at the default size);
* ``map in L1/L2``: the same loops with every pixel folded into 1,024 rows (24 KiB, runs kept): the loops'
  own cost when no map row ever misses;
* ``random pixels``: uniformly random rows of the same map: a pure random gather / scatter;
* ``stream only``: a numba loop that reads the index and the weights and writes a float64 per sample with no
  map at all: the 24 bytes a sample alone;
* ``..., padded``: each of the above with map rows padded to 4 float64 (32 bytes, 32-byte aligned: no row
  across two cache lines) and weights to 4 float32 (a zero pad; 28 bytes a sample streamed, still measured
  against the 24-byte floor): one 4-lane load (P) or read-modify-write (P^T) of the map row a sample, and one
  request of the row ahead;
* ``..., padded map``: the padded map rows with the weights as they are (3 float32, read 4 wide with the
  fourth lane replaced by 0): what the map's layout alone changes, at 24 bytes a sample.

The padded loops give the same products and sums as the current ones, checked bit for bit before the timings.

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
PADDED_COLUMNS = 4


def aligned_zeros(shape: tuple[int, ...], dtype, alignment: int = 64) -> np.ndarray:
    """Zeros whose first element sits on an ``alignment``-byte boundary (numpy promises 16 bytes)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(size + alignment, dtype=np.uint8)
    offset = -raw.ctypes.data % alignment
    return raw[offset:offset + size].view(dtype).reshape(shape)


def padded(rows: np.ndarray, dtype) -> np.ndarray:
    """``rows`` [n, 3] as aligned [n, 4] rows of ``dtype`` with a zero fourth column."""
    out = aligned_zeros((len(rows), PADDED_COLUMNS), dtype)
    out[:, :3] = rows
    return out


def padded_row_loops(weight_columns: int):
    """P and P^T on map rows padded to 4 float64, as ``(project, accumulate)`` (see the module's docstring).

    project(local_map [n_local, 4] float64, local_index [n], weights [n, weight_columns] float32/float64,
    out [n] float64, streaming); accumulate(tod [n], local_index [n], weights, out [n_local, 4] float64) adds
    into ``out``. Rows are addressed as ``data + columns x row`` and loaded 4 lanes wide: weights of 3 columns
    read the next sample's first weight as lane 3 and replace it by 0 (so the last sample goes through plain
    indexing). Arrays C-contiguous and aligned (:func:`aligned_zeros`): 32 bytes for the map.
    """
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    from mapmaker.kernels.prefetch import PREFETCH_DISTANCE, prefetch_first_for_read, prefetch_first_for_write
    from mapmaker.kernels.streaming import store_fence, store_streaming

    f64, i32 = ir.DoubleType(), ir.IntType(32)
    quad = ir.VectorType(f64, PADDED_COLUMNS)

    def rows_of(array, dtype=None) -> bool:
        return (isinstance(array, types.Array) and array.ndim == 2 and array.layout == "C"
                and isinstance(array.dtype, types.Float) and (dtype is None or array.dtype == dtype))

    def row_pointer(context, builder, array_type, array, row, row_type, columns):
        """``array[row]`` as a pointer to 4 lanes: ``data + columns x row``."""
        data = context.make_array(array_type)(context, builder, array).data
        row = context.cast(builder, row, row_type, types.intp)
        pointer = builder.gep(data, [builder.mul(row, ir.Constant(row.type, columns))], inbounds=True)
        return builder.bitcast(pointer, ir.VectorType(pointer.type.pointee, PADDED_COLUMNS).as_pointer())

    def weight_lanes(context, builder, weights_type, weights, t, t_type):
        """``weights[t, 0..2]`` and a 0 as 4 float64 lanes (float32 ones widened exactly)."""
        pointer = row_pointer(context, builder, weights_type, weights, t, t_type, weight_columns)
        element = pointer.type.pointee.element
        alignment = element.get_abi_size(context.target_data) * (PADDED_COLUMNS if weight_columns == PADDED_COLUMNS else 1)
        lanes = builder.load(pointer, align=alignment)
        lanes = lanes if element == f64 else builder.fpext(lanes, quad)
        if weight_columns != PADDED_COLUMNS:  # lane 3 is the next sample's first weight
            lanes = builder.shuffle_vector(lanes, ir.Constant(quad, None), ir.Constant(ir.VectorType(i32, PADDED_COLUMNS), [0, 1, 2, 4]))
        return lanes

    @intrinsic
    def dot_padded_row(typingctx, local_map, row, weights, t):
        if not (rows_of(local_map, types.float64) and rows_of(weights) and isinstance(row, types.Integer)
                and isinstance(t, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            map_type, row_type, weights_type, t_type = signature.args
            m = builder.load(row_pointer(context, builder, map_type, args[0], args[1], row_type, PADDED_COLUMNS), align=32)
            products = builder.fmul(weight_lanes(context, builder, weights_type, args[2], args[3], t_type), m)
            # (w0 m0 + w1 m1) + w2 m2, the order of mapmaker.kernels.rows.dot_row; lane 3 (0 x 0) left out
            first, second, third = (builder.extract_element(products, ir.Constant(i32, k)) for k in range(3))
            return builder.fadd(builder.fadd(first, second), third)

        return types.float64(local_map, row, weights, t), codegen

    @intrinsic
    def add_to_padded_row(typingctx, out, row, weights, t, y):
        if not (rows_of(out, types.float64) and rows_of(weights) and isinstance(row, types.Integer)
                and isinstance(t, types.Integer) and y == types.float64):
            return None

        def codegen(context, builder, signature, args):
            out_type, row_type, weights_type, t_type, _ = signature.args
            pointer = row_pointer(context, builder, out_type, args[0], args[1], row_type, PADDED_COLUMNS)
            ys = builder.insert_element(ir.Constant(quad, ir.Undefined), args[4], ir.Constant(i32, 0))
            ys = builder.shuffle_vector(ys, ys, ir.Constant(ir.VectorType(i32, PADDED_COLUMNS), [0] * PADDED_COLUMNS))
            products = builder.fmul(ys, weight_lanes(context, builder, weights_type, args[2], args[3], t_type))
            builder.store(builder.fadd(builder.load(pointer, align=32), products), pointer, align=32)
            return context.get_dummy_value()

        return types.void(out, row, weights, t, y), codegen

    @njit(nogil=True)
    def project(local_map, local_index, weights, out, streaming):
        n = len(out)
        ahead = max(n - PREFETCH_DISTANCE, 0)
        if streaming:  # as mapmaker's P writes a TOD of STREAMING_SAMPLES or more
            for t in range(ahead):
                prefetch_first_for_read(local_map, local_index[t + PREFETCH_DISTANCE])
                store_streaming(out, t, dot_padded_row(local_map, local_index[t], weights, t))
        else:
            for t in range(ahead):
                prefetch_first_for_read(local_map, local_index[t + PREFETCH_DISTANCE])
                out[t] = dot_padded_row(local_map, local_index[t], weights, t)
        for t in range(ahead, n - 1):
            out[t] = dot_padded_row(local_map, local_index[t], weights, t)
        if n:
            p = local_index[n - 1]
            out[n - 1] = (weights[n - 1, 0] * local_map[p, 0] + weights[n - 1, 1] * local_map[p, 1]
                          + weights[n - 1, 2] * local_map[p, 2])
        store_fence()

    @njit(nogil=True)
    def accumulate(tod, local_index, weights, out):
        n = len(tod)
        ahead = max(n - PREFETCH_DISTANCE, 0)
        for t in range(ahead):
            prefetch_first_for_write(out, local_index[t + PREFETCH_DISTANCE])
            add_to_padded_row(out, local_index[t], weights, t, tod[t])
        for t in range(ahead, n - 1):
            add_to_padded_row(out, local_index[t], weights, t, tod[t])
        if n:
            p = local_index[n - 1]
            for k in range(3):
                out[p, k] += tod[n - 1] * weights[n - 1, k]

    return project, accumulate


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

    @njit(nogil=True)
    def stream_only_padded(local_index, weights, out):
        for t in range(len(out)):
            out[t] = weights[t, 0] + weights[t, 1] + weights[t, 2] + weights[t, 3] + local_index[t]

    layouts = {"padded": padded_row_loops(weight_columns=PADDED_COLUMNS), "padded map": padded_row_loops(weight_columns=3)}
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
    padded_map, kept_padded_map = padded(local_map, np.float64), padded(kept_map, np.float64)
    layout_weights = {"padded": padded(weights, weights.dtype), "padded map": weights}
    streaming = n >= projection_fast.STREAMING_SAMPLES
    for layout, (project, accumulate) in layouts.items():
        check_same_bits(layout, projection_fast, project, accumulate, local_map, index, weights,
                        layout_weights[layout], tod, n_local, streaming)
    source, target = np.ones(COPY_ELEMENTS), np.zeros(COPY_ELEMENTS)
    cases = {"copy": lambda: np.copyto(target, source),
             "stream only": lambda: stream_only(index, weights, out),
             "stream only, padded": lambda: stream_only_padded(index, layout_weights["padded"], out)}
    for name, rows in indices.items():
        cases[f"P, {name}"] = lambda rows=rows: projection_fast.project_map_to_tod(local_map, rows, weights, out=out)
        for layout, (project, _) in layouts.items():
            cases[f"P, {name}, {layout}"] = lambda rows=rows, project=project, layout=layout: project(
                padded_map, rows, layout_weights[layout], out, streaming
            )
        cases[f"P^T, {name}"] = lambda rows=rows: projection_fast.accumulate_tod_to_map(
            tod, rows, weights, n_local, out=kept_map
        )
        for layout, (_, accumulate) in layouts.items():
            cases[f"P^T, {name}, {layout}"] = lambda rows=rows, accumulate=accumulate, layout=layout: accumulate(
                tod, rows, layout_weights[layout], kept_padded_map
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
        print(f"{row['case']:<34}{row['seconds'] * 1e3:>9.2f} ms{row['times_copy_floor']:>8.2f} x copy floor")
    return 0


def check_same_bits(layout, projection_fast, project, accumulate, local_map, index, weights, layout_weights, tod,
                    n_local, streaming) -> None:
    """A padded layout's loops compute what the current ones do, to the bit: else their timings would mean nothing."""
    tod_now, tod_padded = projection_fast.project_map_to_tod(local_map, index, weights), np.empty(len(index))
    project(padded(local_map, np.float64), index, layout_weights, tod_padded, streaming)
    map_now, map_padded = projection_fast.accumulate_tod_to_map(tod, index, weights, n_local), aligned_zeros((n_local, 4), np.float64)
    accumulate(tod, index, layout_weights, map_padded)
    if not (np.array_equal(tod_now, tod_padded) and np.array_equal(map_now, map_padded[:, :3]) and not map_padded[:, 3].any()):
        raise SystemExit(f"{layout}: P or P^T differ from the current layout's")


if __name__ == "__main__":
    raise SystemExit(main())
