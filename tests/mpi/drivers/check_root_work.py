"""Run under mpiexec: the sky, the coupling and the spectra computed on root with its node's cores.

Every rank calls :func:`mapmaker.parallel.rootwork.on_root_with_node_cores` for each step, as a
realisation does: the CMB sky of a signal-only spec (nside 32), the analysis mask of a band of
hits (10 deg C2 apodisation), its pure-B coupling (bins of 8) and the spectra and bandpowers of the
sky on that mask. Root saves them with the OpenMP thread count, ``OMP_NUM_THREADS`` and ducc0's
thread pool it saw inside the work to argv[1] (npz); the test compares them with one process's computation. Exits non-zero
(aborting all ranks) on a failed check.
"""
import os
import sys
from pathlib import Path

import ducc0
import healpy as hp
import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit"))
from mapmaker_cases import make_spec

from mapmaker.model import bandpowers, spectra
from mapmaker.model.sky import build_sky
from mapmaker.parallel.rootwork import on_root_with_node_cores

NSIDE = 32


def band_hits(nside: int) -> np.ndarray:
    """Hits [npix]: 10 in the band |cos theta| < 0.5 with a hole at (theta, phi) = (90, 60) deg, 0 elsewhere."""
    theta, _ = hp.pix2ang(nside, np.arange(hp.nside2npix(nside)))
    hits = np.where(np.abs(np.cos(theta)) < 0.5, 10, 0)
    hits[hp.query_disc(nside, hp.ang2vec(np.pi / 2, np.pi / 3), np.radians(8.0))] = 0
    return hits


def openmp_threads() -> int:
    return max(info["num_threads"] for info in threadpool_info() if info["user_api"] == "openmp")


def main() -> None:
    comm = MPI.COMM_WORLD
    spec = make_spec({"kind": "signal-only", "pixelization.nside": NSIDE})
    seen: dict[str, object] = {}
    exported = os.environ.get("OMP_NUM_THREADS")

    def sky() -> np.ndarray:
        seen["threads"] = openmp_threads()
        seen["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS", "")
        made = build_sky(spec, 0, None)
        assert made is not None
        return made

    iqu = on_root_with_node_cores(comm, sky, threads=1)
    mask = on_root_with_node_cores(comm, lambda: bandpowers.analysis_mask(band_hits(NSIDE), apodisation_deg=10.0),
                                   threads=1)
    binning = bandpowers.Binning.for_nside(NSIDE, 8)
    coupling = on_root_with_node_cores(comm, lambda: bandpowers.build_coupling(mask, binning, purify_b=True), threads=1)

    def measure() -> spectra.RealizationSpectra:
        assert iqu is not None and coupling is not None
        seen["ducc0_threads"] = ducc0.misc.thread_pool_size()  # what caps pixell's transforms
        observed = np.where(coupling.mask > 0, iqu, hp.UNSEEN)
        return spectra.realization_spectra(observed, coupling, lmax=2 * NSIDE, ell_bin_width=8)

    measured = on_root_with_node_cores(comm, measure, threads=1)
    if comm.Get_rank() != 0:
        assert iqu is None and mask is None and coupling is None and measured is None
        return
    assert iqu is not None and mask is not None and coupling is not None and measured is not None
    assert os.environ.get("OMP_NUM_THREADS") == exported, "OMP_NUM_THREADS not restored after root's work"
    np.savez(
        sys.argv[1], iqu=iqu, mask=mask, cl=measured.cl, cb=measured.bandpowers.cb,
        windows=measured.bandpowers.windows,
        **{f"mcm_inv_{pair}": matrix for pair, matrix in coupling.mode_coupling_inv.items()},
        threads=np.int64(seen["threads"]), omp_num_threads=np.str_(seen["omp_num_threads"]),
        ducc0_threads=np.int64(seen["ducc0_threads"]), ducc0_threads_after=np.int64(ducc0.misc.thread_pool_size()),
    )
    print(f"root work checks passed on {comm.Get_size()} ranks, openmp threads {seen['threads']}")


if __name__ == "__main__":
    main()
