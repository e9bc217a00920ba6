"""One IQU row of P and P^T as short vector operations, for the compiled gathers and scatters (numba intrinsics).

P reads ``local_map[p]`` and ``weights[t]`` and forms their dot product;
P^T adds ``y weights[t]`` to ``out[p]``. Written in numba as three scalar
lines, each sample costs 8 loads and 3 stores (P^T), an index
multiplication by the row stride and a wraparound check of ``p``; the scan
loop is then bound by instructions, not by memory (P^T on a map that fits
in L1 ran as slowly as on the nside-256 map). Here columns 0-1 move as one
2-lane vector (a 16-byte load and store of the map row, an 8-byte load of
two float32 weights converted at once) and column 2 as a scalar, with the
row address ``data + 3 p`` (no stride multiplication, no check).

Same roundings as the scalar lines, hence the same bits: every product
``w_k m_k`` and ``y w_k`` is rounded on its own (no fused multiply-add),
and P sums ``(w_0 m_0 + w_1 m_1) + w_2 m_2`` in that order. A 4-lane
masked load and store of the whole row measured 3x slower for P^T: the
masked store of one sample does not forward to the masked load of the
next, and consecutive samples share a pixel 3 times in 4 on a scan.

Both take C-contiguous 2-D arrays of exactly 3 columns (the callers check
``shape[1]``); rows are not bounds-checked, like numba's own indexing.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_F64 = ir.DoubleType()
_I32 = ir.IntType(32)
_PAIR = ir.VectorType(_F64, 2)
_QUAD = ir.VectorType(_F64, 4)


def _iqu_rows(array) -> bool:
    return isinstance(array, types.Array) and array.ndim == 2 and array.layout == "C" and isinstance(
        array.dtype, types.Float
    )


def _row_pointer(context, builder, array_type, array, row, row_type):
    """Pointer to ``array[row, 0]`` of a C-contiguous [n, 3] array: ``data + 3 row``."""
    data = context.make_array(array_type)(context, builder, array).data
    row = context.cast(builder, row, row_type, types.intp)
    return builder.gep(data, [builder.mul(row, ir.Constant(row.type, 3))], inbounds=True)


def _pair(builder, pointer):
    """Elements 0 and 1 at ``pointer`` as a float64 pair (float32 ones widened exactly)."""
    element = pointer.type.pointee
    pair = builder.load(builder.bitcast(pointer, ir.VectorType(element, 2).as_pointer()), align=element == _F64 and 8 or 4)
    return pair if element == _F64 else builder.fpext(pair, _PAIR)


def _third(builder, pointer):
    """Element 2 at ``pointer`` as float64."""
    value = builder.load(builder.gep(pointer, [ir.Constant(_I32, 2)], inbounds=True))
    return value if value.type == _F64 else builder.fpext(value, _F64)


@intrinsic
def dot_row(typingctx, local_map, row, weights, t):
    """``weights[t, 0] local_map[row, 0] + weights[t, 1] local_map[row, 1] + weights[t, 2] local_map[row, 2]``.

    local_map [n_local, 3] float64, weights [n_samp, 3] float32/float64 (C-contiguous).
    """
    if not (_iqu_rows(local_map) and local_map.dtype == types.float64 and _iqu_rows(weights)
            and isinstance(row, types.Integer) and isinstance(t, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        map_type, row_type, weights_type, t_type = signature.args
        m = _row_pointer(context, builder, map_type, args[0], args[1], row_type)
        w = _row_pointer(context, builder, weights_type, args[2], args[3], t_type)
        products = builder.fmul(_pair(builder, w), _pair(builder, m))
        first_two = builder.fadd(builder.extract_element(products, ir.Constant(_I32, 0)),
                                 builder.extract_element(products, ir.Constant(_I32, 1)))
        return builder.fadd(first_two, builder.fmul(_third(builder, w), _third(builder, m)))

    return types.float64(local_map, row, weights, t), codegen


def _row_adder(scaled_weights):
    """An intrinsic ``add(out, row, weights, t, y)``: ``out[row, k] += y * weights[t, k]`` for k = 0, 1, 2.

    out [n_local, 3] float64, weights [n_samp, 3] float32/float64 (C-contiguous), y float64.
    ``scaled_weights(builder, w, y)`` forms the products from the weights' row pointer ``w``: the pair
    ``y w_0, y w_1`` and the scalar ``y w_2``, each product rounded on its own.
    """

    @intrinsic
    def add(typingctx, out, row, weights, t, y):
        if not (_iqu_rows(out) and out.dtype == types.float64 and _iqu_rows(weights) and isinstance(row, types.Integer)
                and isinstance(t, types.Integer) and y == types.float64):
            return None

        def codegen(context, builder, signature, args):
            out_type, row_type, weights_type, t_type, _ = signature.args
            m = _row_pointer(context, builder, out_type, args[0], args[1], row_type)
            w = _row_pointer(context, builder, weights_type, args[2], args[3], t_type)
            first_two, last = scaled_weights(builder, w, args[4])
            pair_pointer = builder.bitcast(m, _PAIR.as_pointer())
            builder.store(builder.fadd(builder.load(pair_pointer, align=8), first_two), pair_pointer, align=8)
            third = builder.gep(m, [ir.Constant(_I32, 2)], inbounds=True)
            builder.store(builder.fadd(builder.load(third), last), third)
            return context.get_dummy_value()

        return types.void(out, row, weights, t, y), codegen

    return add


def _pair_and_third_times(builder, w, y):
    """``y w_0, y w_1`` as one 2-lane multiplication, ``y w_2`` as a scalar one."""
    ys = builder.insert_element(ir.Constant(_PAIR, ir.Undefined), y, ir.Constant(_I32, 0))
    ys = builder.shuffle_vector(ys, ys, ir.Constant(ir.VectorType(_I32, 2), [0, 0]))
    return builder.fmul(ys, _pair(builder, w)), builder.fmul(y, _third(builder, w))


def _quad_times(builder, w, y):
    """``y w_0, y w_1`` and ``y w_2`` from one 4-lane load, widening and multiplication (lane 3 dropped)."""
    element = w.type.pointee
    quad = builder.load(builder.bitcast(w, ir.VectorType(element, 4).as_pointer()), align=element == _F64 and 8 or 4)
    quad = quad if element == _F64 else builder.fpext(quad, _QUAD)
    ys = builder.insert_element(ir.Constant(_QUAD, ir.Undefined), y, ir.Constant(_I32, 0))
    ys = builder.shuffle_vector(ys, ys, ir.Constant(ir.VectorType(_I32, 4), [0, 0, 0, 0]))
    products = builder.fmul(ys, quad)
    first_two = builder.shuffle_vector(products, products, ir.Constant(ir.VectorType(_I32, 2), [0, 1]))
    return first_two, builder.extract_element(products, ir.Constant(_I32, 2))


# ``out[row, k] += y * weights[t, k]`` for k = 0, 1, 2 (see _row_adder).
add_to_row = _row_adder(_pair_and_third_times)
# add_to_row with the three weights widened and multiplied by ``y`` as one 4-lane vector. The 4-lane load also
# reads ``weights[t + 1, 0]`` (its product is dropped), so row ``t + 1`` must exist: callers use it for every
# sample but the last. One widening and one multiplication instead of two each, the same products and sums (the
# same bits): P^T 4-5% faster on an L1-resident map (AMD EPYC, Zen 4).
add_to_row_reading_ahead = _row_adder(_quad_times)
