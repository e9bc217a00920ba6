"""Software prefetch of one map row, for the compiled gathers and scatters (numba intrinsics).

P, P^T and the preconditioner's accumulation visit map rows in scan
order: ``local_map[local_index[t]]``. Once the local map outgrows the
caches (nside 256: 550,000 pixels x 24 bytes, 13 MiB) nearly every
sample misses, and the hardware prefetchers cannot guess an indirect
address; the out-of-order core keeps only a few misses in flight, so the
loop waits on memory latency (~10 ns a sample measured), not bandwidth.
Asking for the row of sample ``t + PREFETCH_DISTANCE`` while sample ``t``
is worked on keeps many misses in flight: 3-4x faster P and P^T at nside
256 on an AMD EPYC (Zen 4), and no slower when the map fits in cache
(a prefetch of a cached line is one cheap instruction; the nside-64
satellite example, 1.2 MiB map: P 0.014-0.018 s with or without it).

A prefetch is only a hint: it cannot fault, and never changes a result.
Both the first and the last element of the row are requested, as a row
of 3 (or 6) float64 crosses a 64-byte cache line for some rows: either in
one call (:data:`prefetch_row_for_read`, :data:`prefetch_row_for_write`),
or one end per sample (:data:`prefetch_first_for_read` for sample ``t``,
:data:`prefetch_last_for_read` for ``t + 1``, and the ``_for_write``
twins), which asks for both ends of every row that two consecutive
samples share -- three samples in four on a scan -- with half the
instructions. P and P^T are bound by their instructions, not by memory,
once the rows are prefetched (on an L1-resident map, too): the one-end
requests made them 6-10% faster on the nside-256 bench scan (AMD EPYC,
Zen 4; ``benchmarks/bench_projection_limits.py``).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# Samples ahead of the one being worked on whose map row is requested: far enough to cover the memory
# latency at a few nanoseconds a sample, near enough that the lines are still cached when used. At nside
# 256 on 12M samples (Zen 4, best of 7, three rounds): 96-192 equal within the noise (P 0.029-0.030 s,
# P^T 0.032 s), 64 slower (0.033 / 0.035 s), 32 much slower (0.049 / 0.060 s), 512 0.033 / 0.038 s.
# Numba's caches do not see a change made here (it is compiled into the kernels of other modules):
# delete mapmaker/kernels/__pycache__/*.nbi and *.nbc after editing it.
PREFETCH_DISTANCE = 128

_LOCALITY_KEEP_IN_ALL_CACHES = 3  # llvm.prefetch locality: 3 = keep in every cache level
_DATA_CACHE = 1  # llvm.prefetch cache type: 1 = data


def _prefetch(write: int, columns: tuple[int, ...]):
    """An intrinsic ``prefetch(array, row)`` requesting ``array[row, c]`` for each c in ``columns`` (a negative c
    counts from the row's end) of a C-contiguous 2-D array; ``write`` 1 announces a store, 0 a load."""

    @intrinsic
    def prefetch(typingctx, array, row):
        if not (isinstance(array, types.Array) and array.ndim == 2 and isinstance(row, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            array_type, row_type = signature.args
            value = context.make_array(array_type)(context, builder, args[0])
            row_index = context.cast(builder, args[1], row_type, types.intp)
            row_length = cgutils.unpack_tuple(builder, value.shape, 2)[1]
            byte_pointer = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            function_type = ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32])
            function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.prefetch.p0")
            for column in columns:
                index = context.get_constant(types.intp, column)
                if column < 0:
                    index = builder.add(row_length, index)
                pointer = cgutils.get_item_pointer(context, builder, array_type, value, [row_index, index], wraparound=False)
                builder.call(function, [
                    builder.bitcast(pointer, byte_pointer),
                    ir.Constant(i32, write), ir.Constant(i32, _LOCALITY_KEEP_IN_ALL_CACHES), ir.Constant(i32, _DATA_CACHE),
                ])
            return context.get_dummy_value()

        return types.void(array, row), codegen

    return prefetch


_FIRST, _LAST = 0, -1
prefetch_row_for_read = _prefetch(write=0, columns=(_FIRST, _LAST))
prefetch_row_for_write = _prefetch(write=1, columns=(_FIRST, _LAST))
prefetch_first_for_read = _prefetch(write=0, columns=(_FIRST,))
prefetch_last_for_read = _prefetch(write=0, columns=(_LAST,))
prefetch_first_for_write = _prefetch(write=1, columns=(_FIRST,))
prefetch_last_for_write = _prefetch(write=1, columns=(_LAST,))
