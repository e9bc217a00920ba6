"""MapCampaign's map-maker: TOD simulation on the fly and a distributed PCG solve.

Numerics and MPI only: parameters arrive as :mod:`schemas` models, nothing is
read from the environment, and no web or database code is imported.

Wings, lowest first; a module imports from its own wing, the wings listed
before it, and :mod:`schemas` (tests/unit/test_mapmaker_layers.py checks):

``kernels/``    pure kernels on flat arrays, each with its numpy twin, and the registry of both
                implementations (``implementation``); never see ``comm``, a spec or a file
``model/``      the observation as pure models, no MPI: ``scan`` (boresight and detector pointing
                per chunk), ``decomposition`` (chunks and their ranks; fingerprint), ``noise``
                (intervals, PSDs, simulation), ``rng`` (Philox keys), ``sky`` (synfast or a FITS
                map), ``spectra`` (mask, pseudo-spectra, bandpowers)
``parallel/``   the MPI layer and its model: ``distributed`` (pixel owners, dot products, gather,
                broadcast), ``overlap`` (the overlap plan), ``planfile`` (its file, MPI-IO),
                ``reduction`` (allreduce, alltoallv, butterfly, hybrid, auto), ``commodel``
                (alpha-beta costs; auto's choice), ``overlap_model`` (serial projection to large p)
``solve/``      the solve of one realisation: ``local_data`` (one rank's cached pointing and
                interval layout; P, N^-1 and the operator through the registry), ``solver``
                (PCG), ``timing`` (calc / comm / io split), ``realization`` (the stages on a
                communicator: set-up, solve, gather)
``programs/``   the commands: ``cli`` (the parser of ``python -m mapmaker``), ``commands`` (one
                ``run_<name>`` each), ``realize`` (products and result.json of one realisation),
                ``preprocess``, ``calibrate``, ``bench``, ``products`` (the product folder),
                ``versions`` (the software a run records)
``data/``       the fiducial C_l and the script that made it
"""

__all__: list[str] = []
