"""The observation as pure models: scan, decomposition, noise, random streams, sky, spectra.

Functions of a :class:`schemas.spec.CampaignSpec` and of arrays; no MPI and no
files written (``sky`` reads a user map, ``spectra`` measures maps already made).
They call the kernels (:mod:`mapmaker.kernels`) and are called by every rank alike.
"""
