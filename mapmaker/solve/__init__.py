"""The solve of one realisation: a rank's share of the system, PCG, and the stages that run them.

``local_data`` sits here, not in :mod:`mapmaker.model`: it is the operator
data of one rank for the length of one solve (the pointing cache, the
intervals, the N^-1 filters, P / P^T / ``P^T N^-1 P`` through the kernel
registry), made for the solver and dropped with it. It holds no ``comm``, so
the MPI layer never needs it; ``realization`` is where the two meet.
``timing`` is here because the solve's stages are what it times (calc / comm /
io per rank); the programs read the totals.
"""
