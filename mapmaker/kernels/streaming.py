"""Streaming (non-temporal) stores of P's TOD, for the compiled gathers (numba intrinsics).

P writes its TOD once, 8 bytes a sample, and reads nothing back. An
ordinary store first reads each line it writes into the cache (the
write-allocate read: 8 more bytes a sample from memory) and leaves it
there, pushing out map rows; a streaming store (``movnti``) collects the
line in a write-combining buffer and sends it to memory whole, as
``np.copyto``'s ``memcpy`` does for large arrays -- the copy rate that
``mapmaker bench`` takes as the floor. On the nside-256 bench scan
(12M samples, AMD EPYC, Zen 4) P ran 2-8% faster so.

Only for a TOD far larger than the caches: a TOD that is used again soon
(the PCG operator's batch buffer, filtered straight after) must stay in
cache, and goes through ordinary stores. Streaming stores are weakly
ordered: :func:`store_fence` (``sfence``) after the loop makes them
visible before anything that follows, another thread's reads included.
Neither changes a value.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def store_streaming(typingctx, out, t, value):
    """``out[t] = value`` for a 1-D float64 array, bypassing the caches (no bounds check, no wraparound)."""
    if not (isinstance(out, types.Array) and out.ndim == 1 and out.dtype == types.float64
            and isinstance(t, types.Integer) and value == types.float64):
        return None

    def codegen(context, builder, signature, args):
        out_type, t_type, _ = signature.args
        array = context.make_array(out_type)(context, builder, args[0])
        index = context.cast(builder, args[1], t_type, types.intp)
        pointer = cgutils.get_item_pointer(context, builder, out_type, array, [index], wraparound=False)
        store = builder.store(args[2], pointer, align=8)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(out, t, value), codegen


@intrinsic
def store_fence(typingctx):
    """``sfence``: every streaming store before it is visible before any store after it."""

    def codegen(context, builder, signature, args):
        if platform.machine().lower() in ("x86_64", "amd64"):
            function_type = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, function_type, "llvm.x86.sse.sfence"), [])
        else:  # elsewhere a full fence orders them
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen
