"""Root's work (sky, coupling, spectra) with its node's cores under ``mpiexec -n 1, 2, 4``: one process's answer.

The driver (``drivers/check_root_work.py``) runs the steps through
:func:`mapmaker.parallel.rootwork.on_root_with_node_cores`; here the same steps run in this process
with one thread and the results are compared. Threads change only the order of sums, so the
tolerances are round-off: the sky and the mask to 1e-12 of their largest value, the inverse coupling
matrices, the pseudo-spectra and the bandpowers to 1e-9 of each row's largest value (a decoupled
bandpower is a difference of pseudo-powers, so its relative error grows where it is small).
"""
import os

import healpy as hp
import numpy as np
import pytest
from mpi_support import DRIVERS, run_ranks
from threadpoolctl import threadpool_limits

pytestmark = pytest.mark.mpi


def close_rows(got: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    """``got`` equals ``expected`` row by row within ``rtol`` of the row's largest absolute value."""
    got, expected = np.atleast_2d(got), np.atleast_2d(expected)
    assert got.shape == expected.shape
    for row_got, row_expected in zip(got, expected, strict=True):
        scale = np.max(np.abs(row_expected))
        np.testing.assert_allclose(row_got, row_expected, rtol=0, atol=rtol * scale)


@pytest.fixture(scope="module")
def single_process():
    """The driver's steps in this process on one thread (OpenMP, BLAS and pixell's ducc0)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(DRIVERS)))
    import check_root_work as driver  # the driver's own inputs, not a copy of them
    from mapmaker_cases import make_spec

    from mapmaker.model import bandpowers, spectra
    from mapmaker.model.sky import build_sky

    exported = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        with threadpool_limits(limits={"openmp": 1, "blas": 1}):
            spec = make_spec({"kind": "signal-only", "pixelization.nside": driver.NSIDE})
            iqu = build_sky(spec, 0, None)
            mask = bandpowers.analysis_mask(driver.band_hits(driver.NSIDE), apodisation_deg=10.0)
            coupling = bandpowers.build_coupling(mask, bandpowers.Binning.for_nside(driver.NSIDE, 8), purify_b=True)
            observed = np.where(mask > 0, iqu, hp.UNSEEN)
            measured = spectra.realization_spectra(observed, coupling, lmax=2 * driver.NSIDE, ell_bin_width=8)
    finally:
        if exported is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = exported
    return iqu, mask, coupling, measured


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_root_work_with_node_cores_gives_one_process_answer(ranks, tmp_path, single_process, monkeypatch):
    out = tmp_path / "root.npz"
    # as the worker launches a run of one thread per rank: ducc0 sizes its pool from this on import
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    completed = run_ranks(ranks, str(DRIVERS / "check_root_work.py"), str(out), timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"root work checks passed on {ranks} ranks" in completed.stdout
    iqu, mask, coupling, measured = single_process
    with np.load(out) as got:
        cores = min(ranks, os.cpu_count() or 1)  # one thread per rank, every rank on this node
        assert int(got["threads"]) == cores
        assert str(got["omp_num_threads"]) == str(cores)
        assert int(got["ducc0_threads"]) == cores  # pixell's transforms are not held to the pool fixed on import
        assert int(got["ducc0_threads_after"]) == 1  # and the pool is given back
        close_rows(got["iqu"], iqu, 1e-12)
        close_rows(got["mask"], mask, 1e-12)
        assert np.any(mask == 0) and np.any((mask > 0) & (mask < 1))  # a masked, apodised sky
        for pair, matrix in coupling.mode_coupling_inv.items():
            close_rows(got[f"mcm_inv_{pair}"], matrix, 1e-9)
        close_rows(got["cl"], measured.cl, 1e-9)
        close_rows(got["cb"], measured.bandpowers.cb, 1e-9)
        close_rows(got["windows"].reshape(6, -1), measured.bandpowers.windows.reshape(6, -1), 1e-9)
