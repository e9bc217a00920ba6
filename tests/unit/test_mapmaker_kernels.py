"""Kernels against known answers: P / P^T adjointness, N^-1, 3x3 blocks and the rcond cut."""
import tracemalloc

import numpy as np
import pytest
import scipy.fft

from mapmaker.kernels import noise, preconditioner, projection
from mapmaker.kernels import pixels as pixels_kernels


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def random_pointing(rng, n_samp=5000, n_local=300):
    local_index = rng.integers(0, n_local, n_samp).astype(np.int64)
    psi = rng.uniform(0, np.pi, n_samp)
    weights = np.column_stack([np.ones(n_samp), np.cos(2 * psi), np.sin(2 * psi)])
    return local_index, weights


# ----------------------------------------------------------------------------- P and P^T


def test_transpose_is_the_adjoint(rng):
    local_index, weights = random_pointing(rng)
    x = rng.standard_normal((300, 3))
    y = rng.standard_normal(5000)
    lhs = np.vdot(projection.accumulate_tod_to_map(y, local_index, weights, 300), x)
    rhs = np.vdot(y, projection.project_map_to_tod(x, local_index, weights))
    assert lhs == pytest.approx(rhs, rel=1e-12)


def test_projection_against_explicit_loops(rng):
    local_index, weights = random_pointing(rng, n_samp=200, n_local=20)
    x = rng.standard_normal((20, 3))
    y = rng.standard_normal(200)
    expected_tod = np.array([weights[t] @ x[local_index[t]] for t in range(200)])
    expected_map = np.zeros((20, 3))
    for t in range(200):
        expected_map[local_index[t]] += weights[t] * y[t]
    np.testing.assert_allclose(projection.project_map_to_tod(x, local_index, weights), expected_tod, rtol=1e-13)
    np.testing.assert_allclose(projection.accumulate_tod_to_map(y, local_index, weights, 20), expected_map, rtol=1e-12, atol=1e-13)
    # ``out`` accumulates.
    out = np.ones((20, 3))
    projection.accumulate_tod_to_map(y, local_index, weights, 20, out=out)
    np.testing.assert_allclose(out, expected_map + 1, rtol=1e-12)


def test_zero_weights_leave_a_sample_out(rng):
    local_index, weights = random_pointing(rng, n_samp=100, n_local=10)
    weights[local_index == 3] = 0.0
    x = rng.standard_normal((10, 3))
    tod = projection.project_map_to_tod(x, local_index, weights)
    assert np.all(tod[local_index == 3] == 0.0)
    assert np.all(projection.accumulate_tod_to_map(np.ones(100), local_index, weights, 10)[3] == 0.0)


# ----------------------------------------------------------------------------- noise


def test_psd_shape():
    f = np.array([0.0, 1e-5, 0.1, 1.0, 10.0])
    s = noise.psd(f, 4.0, f_knee_hz=1.0, alpha=2.0, f_min_hz=1e-3)
    np.testing.assert_allclose(s, 4.0 * (1 + (1.0 / np.maximum(f, 1e-3)) ** 2))
    np.testing.assert_allclose(noise.psd(f, 4.0, 0.0, 1.0, 1e-3), 4.0)


@pytest.mark.parametrize("n", [16, 17, 1, 2])
def test_white_noise_synthesis_is_an_isometry(n, rng):
    # For S = sigma^2 the map normals -> noise is sigma times an orthogonal transform (Parseval).
    normals = rng.standard_normal(n)
    x = noise.noise_from_normals(normals, np.full(n // 2 + 1, 9.0))
    assert np.sum(x**2) == pytest.approx(9.0 * np.sum(normals**2), rel=1e-12)


@pytest.mark.parametrize("n", [64, 63])
def test_white_inverse_noise_is_one_over_sigma_squared(n, rng):
    tod = rng.standard_normal(3 * n)
    starts = np.array([0, n, 2 * n])
    lengths = np.full(3, n)
    sigma2 = np.array([2.0, 0.5, 4.0])
    filters = [np.full(n // 2 + 1, 1 / s) for s in sigma2]
    by_fft = noise.apply_inverse_noise(tod.copy(), starts, lengths, np.arange(3), filters)
    direct = noise.apply_inverse_white(tod.copy(), starts, lengths, 1 / sigma2)
    np.testing.assert_allclose(by_fft, tod / np.repeat(sigma2, n), rtol=1e-12)
    np.testing.assert_allclose(direct, tod / np.repeat(sigma2, n), rtol=1e-15)


@pytest.mark.parametrize("n", [128, 127])
def test_inverse_noise_inverts_the_noise_covariance(n, rng):
    s = noise.psd(noise.rfft_frequencies(n, 10.0), 1.5, f_knee_hz=2.0, alpha=1.5, f_min_hz=0.01)
    x = rng.standard_normal(n)
    covariance_times_x = scipy.fft.irfft(scipy.fft.rfft(x) * s, n=n)  # C x for the circulant C
    back = noise.apply_inverse_noise(covariance_times_x, np.array([0]), np.array([n]), np.array([0]), [1 / s])
    np.testing.assert_allclose(back, x, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [16, 15])
def test_inverse_noise_diagonal_matches_the_explicit_matrix(n):
    inverse = 1 / noise.psd(noise.rfft_frequencies(n, 1.0), 1.0, f_knee_hz=0.3, alpha=1.0, f_min_hz=0.01)
    matrix = np.column_stack(
        [noise.apply_inverse_noise(np.eye(n)[j].copy(), np.array([0]), np.array([n]), np.array([0]), [inverse]) for j in range(n)]
    )
    np.testing.assert_allclose(np.diag(matrix), noise.inverse_noise_diagonal(inverse, n), rtol=1e-12)
    np.testing.assert_allclose(matrix, matrix.T, atol=1e-14)


def test_batched_and_scattered_intervals_match_one_by_one(rng, monkeypatch):
    lengths = np.array([50, 50, 30, 50, 30, 50])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    filter_index = np.array([0, 0, 1, 0, 1, 2])
    filters = [1 / noise.psd(noise.rfft_frequencies(n, 5.0), v, 1.0, 1.0, 0.01) for n, v in ((50, 1.0), (30, 2.0), (50, 3.0))]
    tod = rng.standard_normal(lengths.sum())
    expected = tod.copy()
    for start, length, index in zip(starts, lengths, filter_index):
        segment = expected[start : start + length]
        segment[:] = scipy.fft.irfft(scipy.fft.rfft(segment) * filters[index], n=length)
    monkeypatch.setattr(noise, "BATCH_SAMPLES", 100)  # force several batches
    np.testing.assert_allclose(noise.apply_inverse_noise(tod.copy(), starts, lengths, filter_index, filters), expected, rtol=1e-12)
    np.testing.assert_allclose(
        noise.apply_inverse_noise(tod.copy(), starts, lengths, filter_index, filters, threads=2), expected, rtol=1e-12
    )


# ----------------------------------------------------------------------------- 3x3 blocks


def test_blocks_against_explicit_sums(rng):
    local_index, weights = random_pointing(rng, n_samp=400, n_local=7)
    sample_weight = rng.uniform(0.5, 2.0, 400)
    packed = preconditioner.accumulate_blocks(local_index, weights, 7, sample_weight)
    for p in range(7):
        rows = weights[local_index == p]
        expected = (rows * sample_weight[local_index == p, None]).T @ rows
        np.testing.assert_allclose(preconditioner.unpack(packed[p : p + 1])[0], expected, rtol=1e-12)
    geometric = preconditioner.accumulate_blocks(local_index, weights, 7)
    np.testing.assert_array_equal(geometric[:, 0], np.bincount(local_index, minlength=7))


def test_inverse_and_apply(rng):
    local_index, weights = random_pointing(rng, n_samp=600, n_local=5)
    packed = preconditioner.accumulate_blocks(local_index, weights, 5)
    keep = np.array([True, True, False, True, True])
    inverse = preconditioner.invert(packed, keep)
    matrices = preconditioner.unpack(packed)
    for p in np.flatnonzero(keep):
        np.testing.assert_allclose(inverse[p] @ matrices[p], np.eye(3), atol=1e-12)
    assert np.all(inverse[2] == 0)
    vectors = rng.standard_normal((5, 3))
    applied = preconditioner.apply(inverse, vectors)
    np.testing.assert_allclose(applied[keep], np.linalg.solve(matrices[keep], vectors[keep][..., None])[..., 0], rtol=1e-10)
    np.testing.assert_allclose(preconditioner.solve(packed, vectors, keep), applied, rtol=1e-10, atol=1e-14)


def weights_for(psi_deg):
    psi = np.radians(np.asarray(psi_deg, dtype=float))
    return np.column_stack([np.ones_like(psi), np.cos(2 * psi), np.sin(2 * psi)])


@pytest.mark.parametrize(
    "angles_deg, expected",
    [
        ([0, 45, 90, 135], 0.5),  # diag(4, 2, 2)
        ([0, 60, 120], 0.5),  # diag(3, 3/2, 3/2)
        ([10, 10, 10, 10], 0.0),  # one angle: rank 1
        ([0, 90, 0, 90], 0.0),  # 2 psi = 0, 180: U never seen
        ([], 0.0),  # no hits
    ],
)
def test_rcond_known_answers(angles_deg, expected):
    weights = weights_for(angles_deg).reshape(-1, 3)
    packed = preconditioner.accumulate_blocks(np.zeros(len(weights), dtype=np.int64), weights, 1)
    assert preconditioner.rcond(packed)[0] == pytest.approx(expected, abs=1e-12)


def test_rcond_cut_selects_the_ill_conditioned_pixels():
    angles = [[0, 45, 90, 135], [0, 1, 2, 3], [5, 5, 5, 5], [0, 30, 60, 90]]
    weights = np.concatenate([weights_for(a) for a in angles])
    local_index = np.repeat(np.arange(4), 4)
    rcond = preconditioner.rcond(preconditioner.accumulate_blocks(local_index, weights, 4))
    np.testing.assert_array_equal(rcond < 0.01, [False, True, True, False])


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("npix", [50, 10**6])  # lookup table, sparse blocks
def test_observed_pixels_both_ways(npix, dtype, rng, monkeypatch):
    monkeypatch.setattr(pixels_kernels, "OBSERVED_PIXELS_BLOCK", 64)  # several blocks, the last one short
    pixels = rng.choice(npix, size=300).astype(dtype)
    original = pixels.copy()
    local_pixels, local_index = pixels_kernels.observed_pixels(pixels, npix)
    np.testing.assert_array_equal(local_pixels, np.unique(original))
    np.testing.assert_array_equal(local_pixels[local_index], original)
    assert local_pixels.dtype == np.int64
    assert local_index.dtype == np.int32  # the pointing cache's index: 4 bytes per sample
    if dtype == np.int32:
        assert np.shares_memory(local_index, pixels)  # written over the pixel ids, no sample-sized copy


def test_observed_pixels_sparse_path_memory(rng):
    """High nside, few samples: the sparse path holds ~16 bytes per sample, not np.unique's ~37.

    Worst case for it: random pixel ids (no two samples share a pixel, mostly).
    Measured with tracemalloc, which sees numpy's allocations.
    """
    npix, n = 12 * 2048**2, 4_000_000
    pixels = rng.choice(npix, size=n).astype(np.int32)
    original = pixels.copy()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        local_pixels, local_index = pixels_kernels.observed_pixels(pixels, npix)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(local_pixels[local_index], original)
    # The blocks' unique ids and their union (4 + 4), the int64 result (8), and one block's
    # sort and search (argsort int64, sorted ids, int64 positions: 20 per block sample).
    assert peak - before <= 17 * n + 24 * pixels_kernels.OBSERVED_PIXELS_BLOCK
