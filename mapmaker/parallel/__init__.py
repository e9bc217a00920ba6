"""The MPI layer and its cost model: pixel distribution, overlap plans and their file, reductions.

Everything that takes ``comm`` lives here (except the realisation's own glue,
:mod:`mapmaker.solve.realization`); collectives are written as numbered steps
and every rank reaches the same verdict. ``commodel`` and ``overlap_model`` are
the serial alpha-beta model of the same reductions, for ``auto`` and for the
``model`` command.
"""
