"""The two-level preconditioner and the finite-correlation-length N^-1 against the exact solve (one rank).

Map comparisons: ``|a - b| <= rel * max|b|`` over the solved pixels, per Stokes component.
"""
import healpy as hp
import numpy as np
import pytest
from mapmaker_cases import make_spec
from mpi4py import MPI

from mapmaker.kernels import noise as reference
from mapmaker.kernels import noise_fast
from mapmaker.solve.realization import run_realization

# 1/f noise with f_knee 12x the spin frequency, 3 h at 5 Hz, nside 16: the block-diagonal PCG needs ~50
# iterations to 1e-11, the two-level one (coarse nside 1) ~30.
ONE_OVER_F = {"noise.f_knee_hz": 0.2, "noise.f_min_hz": 1e-4, "scan.duration_s": 10800.0, "scan.chunk_s": 3600.0}


def relative_difference(a, b):
    solved = b[0] != hp.UNSEEN
    return max(np.max(np.abs(a[s][solved] - b[s][solved])) / np.max(np.abs(b[s][solved])) for s in range(3))


def test_two_level_reaches_the_block_diagonal_map_in_fewer_iterations():
    base = {**ONE_OVER_F, "solver.tol": 1e-11}
    block = run_realization(make_spec({**base, "solver.preconditioner": "block-diagonal"}), 0, MPI.COMM_SELF)
    two_level = run_realization(make_spec({**base, "solver.preconditioner": "two-level", "solver.coarse_nside": 1}),
                                0, MPI.COMM_SELF)
    assert block.pcg.converged and two_level.pcg.converged
    assert relative_difference(two_level.iqu, block.iqu) < 1e-8
    np.testing.assert_array_equal(two_level.iqu == hp.UNSEEN, block.iqu == hp.UNSEEN)
    assert two_level.stats.coarse_columns == 3 * 12
    assert two_level.pcg.iterations < 0.75 * block.pcg.iterations, (two_level.pcg.iterations, block.pcg.iterations)
    # Deflation lifts the slow modes out of the preconditioned spectrum: PCG's own Ritz values say so.
    deflated, plain = two_level.pcg.spectrum(), block.pcg.spectrum()
    assert deflated["smallest"] > 2 * plain["smallest"] and deflated["condition"] < 0.5 * plain["condition"], (
        deflated, plain)


def test_an_i_only_coarse_space_reaches_the_same_map_with_a_third_of_the_columns():
    """solver.coarse_stokes = "I": 12 columns at coarse nside 1 (36 with IQU), A Z a third the size, the
    block-diagonal map to 1e-8, fewer iterations than block-diagonal; its coarse key differs from IQU's."""
    from schemas.spec import coarse_key

    base = {**ONE_OVER_F, "solver.tol": 1e-11, "solver.preconditioner": "two-level", "solver.coarse_nside": 1}
    block = run_realization(make_spec({**base, "solver.preconditioner": "block-diagonal"}), 0, MPI.COMM_SELF)
    iqu_spec, i_spec = make_spec(base), make_spec({**base, "solver.coarse_stokes": "I"})
    iqu = run_realization(iqu_spec, 0, MPI.COMM_SELF)
    i_only = run_realization(i_spec, 0, MPI.COMM_SELF)
    assert i_only.pcg.converged and relative_difference(i_only.iqu, block.iqu) < 1e-8
    assert (i_only.stats.coarse_columns, iqu.stats.coarse_columns) == (12, 36)
    assert i_only.stats.coarse_bytes < 0.4 * iqu.stats.coarse_bytes
    assert i_only.pcg.iterations < block.pcg.iterations, (i_only.pcg.iterations, block.pcg.iterations)
    assert coarse_key(i_spec) != coarse_key(iqu_spec)


@pytest.mark.parametrize("n", [5001, 12_000, 40_000])
def test_overlap_save_is_the_circulant_of_the_truncated_kernel(n):
    """The fast family's overlap-save filter and the reference's one FFT of the interval agree to round-off."""
    inverse = 1.0 / reference.psd(reference.rfft_frequencies(n, 10.0), 2.0, 0.5, 2.0, 0.2)
    half_width, spectrum, delta = reference.finite_kernel(inverse, n, 2e-2)
    assert half_width is not None and half_width < n // 4 and delta <= 2e-2
    tod = np.random.default_rng(n).standard_normal(n)
    expected = reference.apply_inverse_noise(tod.copy(), np.array([0]), np.array([n]), np.array([0]), [spectrum])
    [finite] = noise_fast.inverse_noise_filters([spectrum], {0: n}, [half_width])
    assert isinstance(finite, noise_fast.OverlapSaveFilter)
    got = finite.apply(tod.copy())
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12 * np.max(np.abs(expected)))
    # and the truncated circulant is within delta of the exact one on this TOD
    exact = reference.apply_inverse_noise(tod.copy(), np.array([0]), np.array([n]), np.array([0]), [inverse])
    assert np.linalg.norm(got - exact) <= delta * np.linalg.norm(exact) * 1.01


def test_finite_kernel_falls_back_to_the_exact_filter_for_a_deep_notch():
    """1/S 1000x below white at f_min = 1e-4 Hz: only a kernel as long as the interval follows it."""
    n = 72_000
    inverse = 1.0 / reference.psd(reference.rfft_frequencies(n, 20.0), 1.0, 0.1, 1.0, 1e-4)
    half_width, spectrum, delta = reference.finite_kernel(inverse, n, 1e-3)
    assert half_width is None and delta == 0.0 and spectrum is not None
    np.testing.assert_array_equal(spectrum, inverse)


def test_finite_filter_map_is_within_its_stated_bound():
    """Noise-only; shallow 1/f notch (f_min 0.05 Hz): the finite filter's map differs from the exact map by at
    most sqrt(2 delta / (1 - delta)) of the exact map's noise rms (Gauss-Markov; see mapmaker.kernels.noise)."""
    changes = {**ONE_OVER_F, "noise.f_min_hz": 0.05, "solver.tol": 1e-10, "solver.noise_filter_tolerance": 1e-2}
    exact = run_realization(make_spec(changes, kind="noise-only"), 1, MPI.COMM_SELF)
    finite_spec = make_spec({**changes, "solver.noise_filter": "finite"}, kind="noise-only")
    finite = run_realization(finite_spec, 1, MPI.COMM_SELF)
    from mapmaker.model.decomposition import chunk_layout, decompose
    from mapmaker.model.noise import NoiseModel
    from mapmaker.solve.local_data import build_local_data

    layout = chunk_layout(finite_spec)
    local = build_local_data(finite_spec, layout, decompose(layout, 1).chunks_of(0), NoiseModel(finite_spec, layout))
    delta = local.filter_error
    assert local.half_widths is not None and 0 < delta <= 1e-2
    solved = exact.iqu[0] != hp.UNSEEN
    for s in range(3):
        difference = np.sqrt(np.mean((finite.iqu[s][solved] - exact.iqu[s][solved]) ** 2))
        noise = np.sqrt(np.mean(exact.iqu[s][solved] ** 2))
        assert 0 < difference <= np.sqrt(2 * delta / (1 - delta)) * noise, (s, difference, noise, delta)


def test_coarse_cache_is_read_by_the_next_realisation_and_a_foreign_file_is_rebuilt(tmp_path):
    """One rank: realisation 0 writes the coarse file, realisation 1 reads it (same iterations and map as without
    it, 1e-10); a file of another noise model or one that is not a coarse file is refused by name and replaced."""
    changes = {**ONE_OVER_F, "solver.tol": 1e-10, "solver.preconditioner": "two-level", "solver.coarse_nside": 1}
    spec = make_spec(changes)
    cache = tmp_path / "coarse.npz"
    first = run_realization(spec, 0, MPI.COMM_SELF, coarse_cache=cache)
    assert (first.stats.coarse_source, first.stats.coarse_written, first.stats.coarse_refused) == ("built", True, None)
    second = run_realization(spec, 1, MPI.COMM_SELF, coarse_cache=cache)
    assert (second.stats.coarse_source, second.stats.coarse_written, second.stats.coarse_refused) == ("file", False, None)
    uncached = run_realization(spec, 1, MPI.COMM_SELF)
    assert uncached.stats.coarse_source == "built" and second.pcg.iterations == uncached.pcg.iterations
    assert relative_difference(second.iqu, uncached.iqu) <= 1e-10

    other_noise = make_spec({**changes, "noise.f_knee_hz": 0.3})
    foreign = run_realization(other_noise, 0, MPI.COMM_SELF, coarse_cache=cache)
    assert foreign.stats.coarse_source == "built" and foreign.stats.coarse_written
    assert "key is" in foreign.stats.coarse_refused and "refused" in foreign.stats.coarse_refused

    cache.write_bytes(b"not a coarse file")
    garbage = run_realization(spec, 2, MPI.COMM_SELF, coarse_cache=cache)
    assert garbage.stats.coarse_source == "built" and garbage.stats.coarse_written and garbage.stats.coarse_refused
    assert run_realization(spec, 3, MPI.COMM_SELF, coarse_cache=cache).stats.coarse_source == "file"


def test_additive_two_level_reaches_the_block_diagonal_map_in_fewer_iterations_and_keeps_no_a_z(tmp_path):
    """M = M_BD + Z E^-1 Z^T from the coarse start: the block-diagonal map (1e-8), fewer iterations, E alone held
    and cached (its file holds no A Z rows)."""
    base = {**ONE_OVER_F, "solver.tol": 1e-11}
    block = run_realization(make_spec({**base, "solver.preconditioner": "block-diagonal"}), 0, MPI.COMM_SELF)
    spec = make_spec({**base, "solver.preconditioner": "two-level-additive", "solver.coarse_nside": 1})
    cache = tmp_path / "additive.npz"
    additive = run_realization(spec, 0, MPI.COMM_SELF, coarse_cache=cache)
    assert block.pcg.converged and additive.pcg.converged
    assert relative_difference(additive.iqu, block.iqu) < 1e-8
    assert additive.stats.coarse_columns == 3 * 12 and additive.stats.coarse_bytes == 2 * 8 * 36**2
    assert additive.pcg.iterations < 0.85 * block.pcg.iterations, (additive.pcg.iterations, block.pcg.iterations)
    with np.load(cache) as members:
        assert members["columns_0"].shape == (36, 0)
    again = run_realization(spec, 1, MPI.COMM_SELF, coarse_cache=cache)
    assert again.stats.coarse_source == "file"
