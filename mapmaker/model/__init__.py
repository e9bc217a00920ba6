"""The observation as pure models: scan, decomposition, noise, random streams, sky, spectra, bandpowers.

Functions of a :class:`schemas.spec.CampaignSpec` and of arrays; no MPI and no
files written (``sky`` reads a user map, ``spectra`` and ``bandpowers`` measure maps already made;
``bandpowers`` is the MASTER / pure-B estimator on pspy's mode coupling).
They call the kernels (:mod:`mapmaker.kernels`) and are called by every rank alike.
"""
