"""Pure numerical kernels of the map-maker: no MPI, no I/O, no spec models.

Each kernel is a plain function on flat numpy arrays whose docstring gives the
shapes, dtypes and units. The numpy modules are the single definition of each
operation; the ``*_fast`` twins (numba, ducc0, threads) take the same
arguments and are checked against them. Callers get either implementation
from the registry, :mod:`mapmaker.kernels.implementation`, by family.

========================  =====================================================
module (fast twin)        operations
========================  =====================================================
``implementation``        the registry: family -> module per implementation; warm-up
``quaternion``            scalar-first rotation quaternions: product, axis rotations, rotate
``boresight``             boresight of satellite and ground scans (``pointing_fast``)
``pointing``              detector pointing: pixels (HEALPix RING), IQU weights (``pointing_fast``)
``projection``            P (map -> TOD), P^T, first-visit pixel order (``projection_fast``)
``preconditioner``        3x3 hit blocks, rcond, block inverse, block apply (``preconditioner_fast``)
``noise``                 PSD, Fourier-space synthesis, N^-1 per stationary interval (``noise_fast``)
``operator``              the PCG operator P^T N^-1 P (``operator_fast``: fused, no TOD array)
``pixels``                sorted unique pixels of a rank and each sample's row among them
``vectors``               PCG's dot products (owned-weighted), map and residual step, direction (``vectors_fast``)
``threads``               threads per rank: numba, the FFT/operator pool, BLAS
``prefetch``              software prefetch of map rows inside numba loops (fast kernels only)
``rows``                  one IQU row of P and P^T as 2-lane vector operations (fast kernels only)
========================  =====================================================

``threads`` lives with the kernels because they are its only users inside a
solve (the pool runs their interval groups); a run sets it once, before the
kernels start.
"""
