"""MapCampaign's map-maker: TOD simulation on the fly and a distributed PCG solve.

Numerics and MPI only: parameters arrive as :mod:`schemas` models, nothing is
read from the environment, and no web or database code is imported.

Module map
==========
``kernels/``        pure numpy kernels (pointing, P, P^T, N^-1, 3x3 blocks); never see ``comm``
``scan``            spec -> boresight quaternions per chunk, detector rotations
``decomposition``   chunks (detector x time) and their contiguous assignment to ranks; fingerprint
``noise``           noise model of a spec: intervals, PSDs, filters, simulation per chunk
``rng``             Philox keys derived from (seed, realisation, detector, interval, stream)
``sky``             input sky: synfast from the fiducial C_l, or a user FITS map
``local_data``      one rank's cached pointing (local pixel index, weights) and interval layout
``overlap``         the overlap plan: allgather + sift of pixel ids, shared lists, butterfly schedule
``planfile``        the plan file format: versioned, checksummed, one section per rank (MPI-IO)
``preprocess``      ``preprocess`` command: pixels of each rank -> plan -> file + report
``reduction``       the pixel-reduction interface and the buffered-Allreduce baseline (MPI)
``distributed``     distributed pixel vectors: owners, dot products, gather, broadcast (MPI)
``solver``          preconditioned conjugate gradients, independent of MPI
``realize``         one realisation end to end on a communicator (MPI)
``products``        FITS maps and result.json, written atomically
``timing``          calc / comm / io wall-clock split and peak memory of a rank
``cli``             ``python -m mapmaker realize | preprocess | bench``
``bench``           throughput of the kernels and of one PCG iteration
"""

__all__: list[str] = []
