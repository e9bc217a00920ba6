"""Pure numerical kernels of the map-maker: no MPI, no I/O, no spec models.

Each kernel is a plain function on flat numpy arrays whose docstring gives the
shapes, dtypes and units. They are the single definition of each operation:
faster twins (numba, threads) are checked against them.

========================  =====================================================
module                    operations
========================  =====================================================
``quaternion``            scalar-first rotation quaternions: product, axis rotations, rotate
``boresight``             boresight orientation of satellite and ground scans
``pointing``              detector pointing: pixels (HEALPix RING) and IQU weights
``projection``            the pointing matrix P (map -> TOD) and its transpose P^T
``noise``                 PSD, Fourier-space noise synthesis, N^-1 per stationary interval
``preconditioner``        3x3 hit blocks, rcond, block inverse, block apply
========================  =====================================================
"""
