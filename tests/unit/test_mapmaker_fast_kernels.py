"""The fast kernels (numba + ducc0) against the numpy reference and healpy.

Pixels must match exactly; everything else to 1e-10 of the result's scale
(``assert_close``). Each kernel is run through the switch for both
implementations, ``for impl in [DEFAULT, NUMPY]``, and with 1 and 2 threads
where threads change the code path (private maps, interval groups).
"""
from pathlib import Path

import healpy as hp
import numpy as np
import pytest
from mpi4py import MPI

from mapmaker.kernels import (
    boresight,
    implementation,
    noise,
    noise_fast,
    operator_fast,
    pointing,
    pointing_fast,
    preconditioner,
    projection,
    threads,
)
from mapmaker.solve import local_data
from tests.unit.mapmaker_cases import make_spec

IMPLEMENTATIONS = [implementation.DEFAULT, "numpy"]
RELATIVE = 1e-10


def assert_close(actual, expected, rel=RELATIVE):
    """Elementwise agreement within ``rel`` of the largest reference value."""
    expected = np.asarray(expected)
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * max(scale, 1e-300))


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def thread_count(request):
    threads.configure(request.param)
    yield request.param
    threads.configure(1)


@pytest.fixture
def rng():
    return np.random.default_rng(2011)


# ----------------------------------------------------------------------------- HEALPix RING vec2pix


def edge_case_vectors(nside: int) -> np.ndarray:
    """Poles, the equator, z = +-2/3 and +-0.99, phi = 0 / 2 pi / negative zero, and pixel corners and centres."""
    vectors = [
        (0.0, 0.0, 1.0), (0.0, 0.0, -1.0), (1e-300, 0.0, 1.0), (0.0, -1e-300, -1.0), (1e-17, 1e-17, 1.0),
        (1.0, 0.0, 0.0), (-1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, -1.0, 0.0), (1.0, -0.0, 0.0), (1.0, -1e-300, 0.0),
        (1.0, -1e-17, 0.3), (1.0, 1e-17, -0.3), (3.0, 4.0, 5.0),
    ]
    for z in (2.0 / 3.0, -2.0 / 3.0, 0.99, -0.99, 0.0):
        for nudge in (-1, 0, 1):
            zz = np.nextafter(z, z + nudge) if nudge else z
            for phi in (0.0, np.pi / 4, np.pi / 2, np.pi, 1.5 * np.pi, 2.0 * np.pi, np.nextafter(2.0 * np.pi, 0.0), -1e-16):
                r = np.sqrt(1.0 - zz * zz)
                vectors.append((r * np.cos(phi), r * np.sin(phi), zz))
    corners = np.concatenate([np.moveaxis(hp.boundaries(nside, p, step=2), -1, 1).reshape(-1, 3)
                              for p in np.linspace(0, 12 * nside * nside - 1, 64).astype(int)])
    centres = np.column_stack(hp.pix2vec(nside, np.arange(min(12 * nside * nside, 50_000))))
    # ring boundaries in z and meridians of pixel edges (phi = k pi / (2 nside))
    rings = np.unique(np.linspace(1, 4 * nside - 1, min(4 * nside - 1, 128)).astype(int))
    z_ring = np.cos(hp.ringinfo(nside, rings)[2])
    edges = np.unique(np.linspace(0, 8 * nside, min(8 * nside + 1, 257)).astype(int))
    phis = edges * np.pi / (4 * nside)
    zz, pp = np.meshgrid(np.concatenate([z_ring, [2 / 3, -2 / 3]]), phis)
    rr = np.sqrt(1 - zz**2)
    grid = np.column_stack([(rr * np.cos(pp)).ravel(), (rr * np.sin(pp)).ravel(), zz.ravel()])
    return np.concatenate([np.array(vectors), corners, centres, grid])


@pytest.mark.parametrize("nside", [1, 2, 4, 8, 64, 256, 2048, 8192])
def test_vec2pix_matches_healpy_exactly(nside, rng):
    random = rng.standard_normal((200_000, 3)) * rng.uniform(0.1, 10.0, (200_000, 1))  # not unit length
    near_poles = np.column_stack([rng.normal(0, 1e-3, (20_000, 2)), np.sign(rng.standard_normal(20_000))])
    vectors = np.concatenate([random, near_poles, edge_case_vectors(nside)])
    x, y, z = (np.ascontiguousarray(vectors[:, i]) for i in range(3))
    expected = hp.vec2pix(nside, x, y, z)
    np.testing.assert_array_equal(pointing_fast.vec2pix(nside, x, y, z), expected)


# ----------------------------------------------------------------------------- pointing


SATELLITE = {"start_longitude": 0.3, "drift_rate": 2 * np.pi / 86400, "precession_rate": 2 * np.pi / 600,
                 "precession_angle": np.radians(45), "spin_rate": 2 * np.pi / 60, "spin_angle": np.radians(50)}
GROUND = {"site_latitude": np.radians(-22.9), "elevation": np.radians(50), "azimuth_min": np.radians(-30),
              "azimuth_max": np.radians(60), "azimuth_rate": np.radians(1.0), "start_lst": 1.0, "earth_rotation": True}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("scan", ["satellite", "ground"])
def test_pointing_matches_the_reference(impl, scan, thread_count):
    kernels = implementation.get(impl)
    times = np.arange(300_000) / 50.0
    angles = SATELLITE if scan == "satellite" else GROUND
    q_reference = getattr(boresight, scan)(times, **angles)
    q = getattr(kernels.boresight, scan)(times, **angles)
    assert_close(q, q_reference, rel=1e-13)
    for offset_x, offset_y, psi in [(0.01, -0.02, 0.7), (0.0, 0.0, 0.0), (-0.03, 0.0, np.pi / 2)]:
        q_detector = pointing.detector_quaternion(offset_x, offset_y, psi)
        pixels_reference, weights_reference = pointing.detector_pointing(q_reference, q_detector, 256)
        pixels, weights = kernels.pointing.detector_pointing(q_reference, q_detector, 256)
        np.testing.assert_array_equal(pixels, pixels_reference)
        assert pixels.dtype == np.int64
        assert_close(weights, weights_reference)


# ----------------------------------------------------------------------------- P, P^T, blocks


def smooth_pointing(rng, n_samp=400_000, n_local=5_000, index_dtype=np.int32, weights_dtype=np.float64):
    """Runs of samples on neighbouring pixels, like a scan, with some cut (zero-weight) samples.

    ``weights_dtype`` float32: the pointing cache's weights (``solver.pointing = "cached"``).
    """
    local_index = (np.cumsum(rng.integers(0, 2, n_samp)) * 7 % n_local).astype(index_dtype)
    psi = rng.uniform(0, np.pi, n_samp)
    weights = np.column_stack([np.ones(n_samp), np.cos(2 * psi), np.sin(2 * psi)]).astype(weights_dtype)
    weights[local_index % 97 == 3] = 0.0
    return local_index, weights


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("weights_dtype", [np.float32, np.float64])
def test_projection_matches_the_reference(impl, index_dtype, weights_dtype, thread_count, rng):
    kernels = implementation.get(impl)
    local_index, weights = smooth_pointing(rng, index_dtype=index_dtype, weights_dtype=weights_dtype)
    local_map = rng.standard_normal((5_000, 3))
    tod = rng.standard_normal(len(local_index))
    reference_tod = projection.project_map_to_tod(local_map, local_index.astype(np.int64), weights)
    np.testing.assert_array_equal(kernels.projection.project_map_to_tod(local_map, local_index, weights), reference_tod)
    out = np.empty(len(tod))
    assert kernels.projection.project_map_to_tod(local_map.T.copy().T, local_index, weights, out=out) is out
    np.testing.assert_array_equal(out, reference_tod)

    reference_map = projection.accumulate_tod_to_map(tod, local_index.astype(np.int64), weights, 5_000)
    assert_close(kernels.projection.accumulate_tod_to_map(tod, local_index, weights, 5_000), reference_map)
    added = np.ones((5_000, 3))
    kernels.projection.accumulate_tod_to_map(tod, local_index, weights, 5_000, out=added)
    assert_close(added, reference_map + 1)
    # P^T of the samples of some rows, then of the others: the whole P^T, each part zero on the other's rows
    rows = rng.random(5_000) < 0.3
    shared, private = np.zeros((5_000, 3)), np.zeros((5_000, 3))
    kernels.projection.accumulate_tod_to_rows(tod, local_index, weights, rows, True, shared)
    kernels.projection.accumulate_tod_to_rows(tod, local_index, weights, rows, False, private)
    assert np.all(shared[~rows] == 0.0) and np.all(private[rows] == 0.0)
    assert_close(shared + private, reference_map)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("weights_dtype", [np.float32, np.float64])
def test_blocks_match_the_reference(impl, weights_dtype, thread_count, rng):
    kernels = implementation.get(impl)
    local_index, weights = smooth_pointing(rng, weights_dtype=weights_dtype)
    sample_weight = rng.uniform(0.5, 2.0, len(local_index))
    for weight in (None, sample_weight):
        reference = preconditioner.accumulate_blocks(local_index.astype(np.int64), weights, 5_000, weight)
        assert_close(kernels.blocks.accumulate_blocks(local_index, weights, 5_000, weight), reference)
        # Products in float64 whatever the weights' type: the float32 weights' own blocks, exactly formed
        exact = preconditioner.accumulate_blocks(local_index.astype(np.int64), weights.astype(np.float64), 5_000, weight)
        assert_close(reference, exact)
        # Added into a given array (the slabs of LocalData.accumulate_blocks): slab by slab, the whole's sums
        split = len(local_index) // 3
        out = np.full((5_000, 6), 0.0)
        for part in (slice(0, split), slice(split, None)):
            returned = kernels.blocks.accumulate_blocks(
                local_index[part], weights[part], 5_000, None if weight is None else weight[part], out=out
            )
            assert returned is out
        assert_close(out, reference)
    keep = preconditioner.rcond(reference) > 1e-3
    inverse = preconditioner.invert(reference, keep)
    vectors = rng.standard_normal((5_000, 3))
    assert_close(kernels.blocks.apply(inverse, vectors), preconditioner.apply(inverse, vectors))


def hit_blocks(angles: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Packed geometric blocks [n, 6]: pixel p hit ``counts[p]`` times, at the first ``counts[p]`` of ``angles[p]`` (rad)."""
    used = np.arange(angles.shape[1])[None, :] < counts[:, None]
    c, s = np.cos(2 * angles) * used, np.sin(2 * angles) * used
    return np.stack([used.sum(1), c.sum(1), s.sum(1), (c * c).sum(1), (c * s).sum(1), (s * s).sum(1)], axis=1) * 1.0


def every_kind_of_block(rng) -> np.ndarray:
    """Packed blocks [20_706, 6]: 20,000 of 0 to 9 hits at random angles, 500 of 4 hits 0.02 rad apart (rcond
    ~1e-7), 3 of uniform angles, 3 diagonal (the last empty) and 200 of 3 hits a million times over."""
    random = hit_blocks(rng.uniform(0, np.pi, (20_000, 9)), rng.integers(0, 10, 20_000))
    close = hit_blocks(0.3 + 0.02 * np.arange(4) + 1e-3 * rng.standard_normal((500, 4)), np.full(500, 4))
    uniform = hit_blocks(np.tile(np.arange(8) * np.pi / 8, (3, 1)), np.array([4, 8, 8]))
    diagonal = np.array([[4.0, 0, 0, 2.0, 0, 2.0], [3.0, 0, 0, 0.5, 0, 1.5], [0.0] * 6])
    many = hit_blocks(rng.uniform(0, np.pi, (200, 3)), np.full(200, 3)) * 1e6
    return np.concatenate([random, close, uniform, diagonal, many])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_rcond_matches_lapack_on_every_kind_of_block(impl, rng):
    """Jacobi (fast) against LAPACK's eigvalsh: 0 to 9 hits at random angles (empty, singular, ill-conditioned,
    well-crossed), angles 0.02 rad apart (rcond ~1e-7), uniform angles (Q and U eigenvalues equal), diagonal
    blocks (nothing to rotate) and hit counts of 10^6: within 1e-14 (rcond is in [0, 1])."""
    kernels = implementation.get(impl)
    blocks = every_kind_of_block(rng)
    expected = preconditioner.rcond(blocks)
    actual = kernels.blocks.rcond(blocks)
    assert actual.shape == expected.shape and np.all((actual >= 0) & (actual <= 1))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-14)
    side_by_side = np.concatenate([np.zeros_like(blocks), blocks], axis=1)  # the set-up's [n, 12]: a strided half
    np.testing.assert_array_equal(kernels.blocks.rcond(side_by_side[:, 6:]), actual)
    assert np.all(actual[np.all(blocks == 0, axis=1)] == 0)
    np.testing.assert_allclose(actual[-203:-200], [0.5, 1 / 6, 0.0], rtol=1e-15)
    # Angles 0.02 rad apart: rcond ~1e-7, nearly singular blocks, where relative agreement is the hard part.
    assert np.all((expected[20_000:20_500] > 1e-10) & (expected[20_000:20_500] < 1e-6))
    np.testing.assert_allclose(actual[20_000:20_500], expected[20_000:20_500], rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("rcond_min", [1e-2, 1e-12])  # the default cut; the least any solve keeps (SINGULAR_RCOND)
def test_the_block_inverse_matches_lapack_within_its_condition(impl, rcond_min, rng):
    """The kept blocks' inverses against LAPACK's: the two differ by the rounding unit over rcond (each is
    backward stable), zero where a block is not kept; a strided half of the set-up's [n, 12] as it is."""
    kernels = implementation.get(impl)
    blocks = every_kind_of_block(rng) * rng.uniform(0.5, 2.0, (1, 1))  # weighted: not integer hit counts
    rcond = preconditioner.rcond(blocks)
    keep = rcond >= rcond_min
    assert 0 < keep.sum() < len(keep) and (rcond_min > 1e-3 or np.any(keep & (rcond < 1e-6)))
    expected = preconditioner.invert(blocks, keep)
    side_by_side = np.concatenate([np.zeros_like(blocks), blocks], axis=1)
    actual = kernels.blocks.invert(side_by_side[:, 6:], keep)
    assert actual.shape == (len(blocks), 3, 3) and np.all(actual[~keep] == 0)
    scale = np.abs(expected[keep]).max(axis=(1, 2))
    difference = np.abs(actual[keep] - expected[keep]).max(axis=(1, 2))
    assert np.all(difference <= 1e-14 * scale / rcond[keep])
    if kernels.compiled:  # from the Cholesky factor: exactly symmetric, as the blocks (LAPACK's LU is not)
        np.testing.assert_array_equal(actual, np.swapaxes(actual, 1, 2))


# ----------------------------------------------------------------------------- N^-1 and the fused operator


def interval_layout(rng):
    lengths = np.array([4000, 4000, 2501, 4002, 1, 2, 2501, 3999, 4000, 6])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    filter_of_length: dict[tuple[int, int], int] = {}
    filters, filter_index = [], []
    for i, length in enumerate(lengths):
        key = (int(length), i % 2)
        if key not in filter_of_length:
            filter_of_length[key] = len(filters)
            psd = noise.psd(noise.rfft_frequencies(length, 20.0), 1.0 + key[1], f_knee_hz=0.5, alpha=1.5, f_min_hz=0.01)
            filters.append(1.0 / psd)
        filter_index.append(filter_of_length[key])
    by_index = {index: length for (length, _), index in filter_of_length.items()}
    # every other filter forced through the four-step transform, so both paths meet in one N^-1
    circulant = [
        noise_fast.CirculantFilter(
            filters[i], by_index[i], four_step_from=0 if i % 2 else noise_fast.FOUR_STEP_MIN_SAMPLES
        )
        for i in range(len(filters))
    ]
    assert any(c.four_step is not None for c in circulant) and any(c.four_step is None and c.packed for c in circulant)
    return starts, lengths, np.array(filter_index), filters, circulant


def test_halfcomplex_filter_layout():
    inverse = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(noise_fast.halfcomplex_filter(inverse, 6) * 6, [1, 2, 2, 3, 3, 4])
    np.testing.assert_array_equal(noise_fast.halfcomplex_filter(inverse, 7) * 7, [1, 2, 2, 3, 3, 4, 4])
    with pytest.raises(ValueError):
        noise_fast.halfcomplex_filter(inverse, 9)


@pytest.mark.parametrize("four_step_from", [noise_fast.FOUR_STEP_MIN_SAMPLES, 0], ids=["default", "four-step"])
@pytest.mark.parametrize("length", [*range(1, 41), 4002, 15_838, 72_000])
def test_circulant_filter_matches_rfft_multiply_irfft(length, four_step_from, rng):
    """Even lengths go through the packed half-length complex FFT, odd ones through halfcomplex r2r.

    Forced from 0 samples on, the four-step path meets every parity of its split (n1, n2 odd or
    even: 6 = 2 x 3 points... 72,000 = 200 x 180); 15,838 (twice a prime) has no split and stays 1-D.
    """
    inverse = rng.uniform(0.1, 10.0, length // 2 + 1)
    tod = rng.standard_normal(length)
    expected = np.fft.irfft(np.fft.rfft(tod) * inverse, n=length)
    circulant = noise_fast.CirculantFilter(inverse, length, four_step_from=four_step_from)
    assert circulant.packed == (length % 2 == 0)
    split = noise_fast.balanced_split(length // 2) if circulant.packed else None
    uses_four_step = circulant.packed and length >= four_step_from and split is not None
    assert (circulant.four_step is not None) == uses_four_step
    buffer = np.zeros(length + 1)
    segment = buffer[1:]  # 8 bytes off a 16-byte boundary: the packed complex view must not care
    segment[:] = tod
    circulant.apply(segment)
    np.testing.assert_allclose(segment, expected, rtol=0, atol=1e-13 * np.abs(expected).max())
    assert buffer[0] == 0.0
    with pytest.raises(ValueError, match="frequencies"):
        noise_fast.CirculantFilter(inverse[:-1], length)


@pytest.mark.parametrize(
    ("points", "split"),
    [(1, None), (2, None), (4, (2, 2)), (6, (3, 2)), (12, (4, 3)), (7919, None), (2 * 7919, None),
     (68, (17, 4)), (2 * 101, None), (72, (9, 8)), (180_000, (450, 400)), (131_072, (512, 256))],
)
def test_balanced_split(points, split):
    """n2 is the largest divisor up to sqrt(m); splits more lopsided than 16:1 (or with n2 = 1) are refused."""
    assert noise_fast.balanced_split(points) == split


def test_four_step_is_the_default_for_long_intervals_only(rng):
    long, short = noise_fast.FOUR_STEP_MIN_SAMPLES, noise_fast.FOUR_STEP_MIN_SAMPLES - 2
    assert noise_fast.CirculantFilter(np.ones(long // 2 + 1), long).four_step.shape == (512, 256)
    assert noise_fast.CirculantFilter(np.ones(short // 2 + 1), short).four_step is None
    # the twiddle table is shared by every filter of one split, and nobody may write to it
    a, b = (noise_fast.CirculantFilter(rng.uniform(1, 2, 37), 72, four_step_from=0) for _ in range(2))
    assert a.four_step.twiddle is b.four_step.twiddle
    assert not a.four_step.twiddle.flags.writeable
    with pytest.raises(ValueError, match="does not make"):
        noise_fast.FourStepSplit(np.ones(37), 72, (9, 9))


def test_inverse_noise_matches_the_reference(thread_count, rng):
    starts, lengths, filter_index, filters, circulant = interval_layout(rng)
    tod = rng.standard_normal(int(lengths.sum()))
    tod[starts[3] : starts[3] + lengths[3]] *= 1e-9  # a faint interval keeps its own precision
    tod[starts[8] : starts[8] + lengths[8]] = 0.0  # a cut interval stays exactly zero
    reference = noise.apply_inverse_noise(tod.copy(), starts, lengths, filter_index, filters)
    fast = noise_fast.apply_inverse_noise(tod.copy(), starts, lengths, filter_index, circulant, threads=thread_count)
    for start, length in zip(starts, lengths, strict=True):  # each interval to 1e-10 of its own scale
        assert_close(fast[start : start + length], reference[start : start + length])
    assert np.all(fast[starts[8] : starts[8] + lengths[8]] == 0.0)


@pytest.mark.parametrize("batch_samples", [1, 12_000, None])  # None: the default for the map
@pytest.mark.parametrize("weights_dtype", [np.float32, np.float64])
def test_fused_operator_matches_p_n_pt(batch_samples, weights_dtype, thread_count, rng):
    starts, lengths, filter_index, filters, circulant = interval_layout(rng)
    n_samp = int(lengths.sum())
    local_index, weights = smooth_pointing(rng, n_samp=n_samp, n_local=700, weights_dtype=weights_dtype)
    local_map = rng.standard_normal((700, 3))
    tod = projection.project_map_to_tod(local_map, local_index, weights)
    noise.apply_inverse_noise(tod, starts, lengths, filter_index, filters)
    reference = projection.accumulate_tod_to_map(tod, local_index, weights, 700)
    fused = operator_fast.apply_inverse_noise_operator(
        local_map, local_index, weights, starts, lengths, filter_index, circulant, threads=thread_count,
        batch_samples=batch_samples,
    )
    assert_close(fused, reference)

    inverse_variance = rng.uniform(0.5, 2.0, len(lengths))
    tod = projection.project_map_to_tod(local_map, local_index, weights)
    noise.apply_inverse_white(tod, starts, lengths, inverse_variance)
    reference = projection.accumulate_tod_to_map(tod, local_index, weights, 700)
    out = np.full((700, 3), np.nan)
    white = operator_fast.apply_white_operator(local_map, local_index, weights, starts, lengths, inverse_variance, out=out)
    assert white is out
    assert_close(white, reference)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_operators_add_into_out_when_asked(impl, rng):
    # What recomputed pointing relies on: the operator of each chunk added into one map.
    kernels = implementation.get(impl)
    starts, lengths, filter_index, filters, circulant = interval_layout(rng)
    n_samp = int(lengths.sum())
    local_index, weights = smooth_pointing(rng, n_samp=n_samp, n_local=700)
    local_map = rng.standard_normal((700, 3))
    chosen_filters = circulant if kernels.compiled else filters
    whole = kernels.operator.apply_inverse_noise_operator(local_map, local_index, weights, starts, lengths,
                                                          filter_index, chosen_filters)
    split = len(starts) // 2
    added = np.zeros((700, 3))
    for part in (slice(0, split), slice(split, None)):
        first = int(starts[part][0])
        stop = int(starts[part][-1] + lengths[part][-1])
        kernels.operator.apply_inverse_noise_operator(
            local_map, local_index[first:stop], weights[first:stop], starts[part] - first, lengths[part],
            filter_index[part], chosen_filters, out=added, accumulate=True,
        )
    assert_close(added, whole)
    inverse_variance = rng.uniform(0.5, 2.0, len(lengths))
    whole = kernels.operator.apply_white_operator(local_map, local_index, weights, starts, lengths, inverse_variance)
    added = np.ones((700, 3))
    kernels.operator.apply_white_operator(local_map, local_index, weights, starts, lengths, inverse_variance,
                                          out=added, accumulate=True)
    assert_close(added, whole + 1)


def test_operator_batches_are_bounded_whatever_the_map_and_the_samples():
    # A map that stays in cache: short batches (2 MiB of buffer), whose TOD stays in cache too
    assert operator_fast.batch_samples_for(700) == operator_fast.SMALL_MAP_BATCH_SAMPLES == 262_144
    assert operator_fast.batch_samples_for(49_152) == 262_144  # the satellite example, nside 64
    # Past it, 4M samples (32 MiB per thread) at any nside: the buffer never grows with the rank's samples
    assert operator_fast.batch_samples_for(131_073) == operator_fast.BATCH_SAMPLES == 1 << 22
    assert operator_fast.batch_samples_for(3_145_728) == 1 << 22  # nside 512, the whole sky on one rank


def test_batches_take_back_to_back_intervals():
    starts, lengths = [0, 10, 20, 35, 40], [10, 10, 10, 5, 10]  # a gap between 30 and 35
    assert operator_fast.batches(starts, lengths, range(5), 25) == [(0, 20, range(2)), (20, 10, range(2, 3)),
                                                                   (35, 15, range(3, 5))]
    assert operator_fast.batches(starts, lengths, range(5), 1) == [(s, n, range(i, i + 1)) for i, (s, n) in
                                                                  enumerate(zip(starts, lengths, strict=True))]
    assert operator_fast.batches(starts, lengths, range(1, 3), 100) == [(10, 20, range(1, 3))]
    assert operator_fast.batches(starts, lengths, range(0), 100) == []


@pytest.mark.parametrize("index_type", [np.int32, np.int64])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_first_visit_order_renumbers_in_place(impl, index_type):
    """The permutations take the index's type: int32 ones (4 bytes a pixel each) for the pointing cache's index."""
    first_visit_order = implementation.get(impl).projection.first_visit_order
    sorted_index = np.array([5, 5, 2, 7, 2, 0, 7, 1, 3, 4, 6, 0], dtype=index_type)
    index = sorted_index.copy()
    order, position = first_visit_order(index, 8)
    np.testing.assert_array_equal(index, [0, 0, 1, 2, 1, 3, 2, 4, 5, 6, 7, 3])
    np.testing.assert_array_equal(order[index], sorted_index)  # compute row -> sorted row
    np.testing.assert_array_equal(position[order], np.arange(8))
    assert order.dtype == position.dtype == index.dtype == index_type


@pytest.mark.parametrize("order_type", [np.int32, np.int64])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_permute_rows_is_a_gather_of_whole_rows(impl, order_type):
    """IQU maps and the 3x3 blocks' rows (the compiled gather, more rows than PREFETCH_DISTANCE) and other rows
    alike, into out or not, out a strided view or not."""
    permute_rows = implementation.get(impl).projection.permute_rows
    rng = np.random.default_rng(7)
    order = rng.permutation(1_000).astype(order_type)
    iqu = rng.standard_normal((1_000, 3))
    np.testing.assert_array_equal(permute_rows(iqu, order), iqu[order])
    out = np.empty_like(iqu)
    assert permute_rows(iqu, order, out) is out
    np.testing.assert_array_equal(out, iqu[order])
    mask = rng.random(1_000) < 0.5
    np.testing.assert_array_equal(permute_rows(mask, order), mask[order])
    blocks = rng.standard_normal((1_000, 6))
    np.testing.assert_array_equal(permute_rows(blocks, order), blocks[order])
    both = np.zeros((1_000, 12))  # the set-up's blocks: each half written through a strided view
    assert permute_rows(blocks, order, both[:, 6:]).base is both
    np.testing.assert_array_equal(both[:, 6:], blocks[order])
    assert not both[:, :6].any()


@pytest.mark.parametrize("index_type", [np.int32, np.int64])
@pytest.mark.parametrize("stokes", [3, 1])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_coarse_space_sums_and_gathers_match_a_dense_z(impl, stokes, index_type):
    """``Z^T v`` over held rows, the float32 gather and ``out + Z y`` against a dense Z [3 n, K] built from the
    columns, with cut pixels and (I-only) Q and U rows in no column; the compiled twin gives the reference's bits."""
    coarse_space = implementation.get(impl).coarse
    rng = np.random.default_rng(11)
    n_local, n_coarse = 2_000, 7
    n_columns = stokes * n_coarse
    column = stokes * rng.integers(0, n_coarse, n_local)[:, None] + np.arange(3)[None, :]
    column[:, stokes:] = n_columns
    column[rng.random(n_local) < 0.1] = n_columns  # cut pixels
    column = column.reshape(-1).astype(index_type)
    held_rows = np.flatnonzero(np.repeat(rng.random(n_local) < 0.7, 3)).astype(index_type)
    dense = np.zeros((3 * n_local, n_columns))
    dense[np.flatnonzero(column < n_columns), column[column < n_columns]] = 1.0
    residual, smoothed = rng.standard_normal((n_local, 3)), rng.standard_normal((n_local, 3))
    gathered = np.empty(len(held_rows), dtype=np.float32)
    restricted = coarse_space.restrict_and_gather(residual, smoothed, held_rows, column[held_rows], n_columns, gathered)
    assert_close(restricted, dense[held_rows].T @ residual.reshape(-1)[held_rows])
    np.testing.assert_array_equal(gathered, smoothed.reshape(-1)[held_rows].astype(np.float32))
    np.testing.assert_array_equal(coarse_space.restrict(residual, held_rows, column[held_rows], n_columns), restricted)
    y = rng.standard_normal(n_columns)
    out = smoothed.copy()
    assert coarse_space.prolong_add(y, column, out) is out
    with pytest.raises(ValueError, match="C-contiguous"):  # a strided view would take the sums in a copy
        coarse_space.prolong_add(y, column[: 3 * (n_local // 2)], np.zeros((n_local, 3))[::2])
    assert_close(out.reshape(-1), smoothed.reshape(-1) + dense @ y)
    reference = implementation.get("numpy").coarse
    np.testing.assert_array_equal(restricted, reference.restrict(residual, held_rows, column[held_rows], n_columns))
    np.testing.assert_array_equal(out, reference.prolong_add(y, column, smoothed.copy()))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("width", [3, 12])  # the PCG's maps; the set-up's [n, 12] blocks
def test_exchange_packs_and_adds_the_shared_rows(impl, width, rng):
    """A reduction's shared rows: packed by row, and the received rows added in order where a row repeats (a
    pixel shared with several neighbours): numpy's ``np.add.at`` bits, and against explicit sums."""
    kernels = implementation.get(impl)
    values = rng.standard_normal((1_000, width))
    rows = np.concatenate([np.sort(rng.choice(1_000, 600, replace=False)), rng.choice(1_000, 300)])  # repeats
    packed = np.full((len(rows), width), np.nan)
    assert kernels.exchange.gather_rows(values, rows, packed) is packed
    np.testing.assert_array_equal(packed, values[rows])
    received = rng.standard_normal((len(rows), width))
    expected = values.copy()
    for row, addend in zip(rows, received, strict=True):  # one after the other, in the order received
        expected[row] += addend
    added = values.copy()
    assert kernels.exchange.add_rows(added, rows, received) is added
    np.testing.assert_array_equal(added, expected)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("width", [1, 3])  # a 1-D vector counts as one column
def test_pcg_vector_kernels_match_explicit_sums(impl, width, rng, thread_count):
    """PCG's dot products against row-by-row sums in extended precision (owned-weighted: 0/1 weights, and
    unweighted); the step and the new direction with numpy's roundings, hence its bits."""
    kernels = implementation.get(impl)
    n = 5_001  # not a multiple of the threads' blocks
    shape = (n,) if width == 1 else (n, width)
    a, b, p, q = (rng.standard_normal(shape) for _ in range(4))
    weight = (rng.random(n) < 0.6).astype(np.float64)
    a_rows, b_rows = a.reshape(n, -1).astype(np.longdouble), b.reshape(n, -1).astype(np.longdouble)
    for w in (None, weight):
        w_rows = np.ones(n, dtype=np.longdouble) if w is None else w.astype(np.longdouble)
        along = float((w_rows * (a_rows * b_rows).sum(axis=1)).sum())
        norm = float((w_rows * (a_rows * a_rows).sum(axis=1)).sum())
        assert kernels.vectors.dot(a, b, w) == pytest.approx(along, rel=1e-12, abs=1e-12 * n)
        got_along, got_norm = kernels.vectors.dot_and_norm(a, b, w)
        assert got_along == pytest.approx(along, rel=1e-12, abs=1e-12 * n)
        assert got_norm == pytest.approx(norm, rel=1e-13)
    x, r = a.copy(), b.copy()
    kernels.vectors.step(x, r, p, q, 0.37, np.empty_like(x))
    np.testing.assert_array_equal(x, a + 0.37 * p)
    np.testing.assert_array_equal(r, b - 0.37 * q)
    direction = p.copy()
    kernels.vectors.conjugate(direction, q, -1.9)
    np.testing.assert_array_equal(direction, q + -1.9 * p)


# What each family of the registry offers, in both implementations alike.
FAMILY_FUNCTIONS = {
    "boresight": ["satellite", "ground"],
    "pointing": ["detector_pointing"],
    "projection": ["project_map_to_tod", "accumulate_tod_to_map", "first_visit_order", "permute_rows"],
    "blocks": ["accumulate_blocks", "rcond", "invert", "apply"],
    "noise": ["inverse_noise_filters", "apply_inverse_noise", "apply_inverse_white"],
    "operator": ["apply_inverse_noise_operator", "apply_white_operator"],
    "coarse": ["restrict", "restrict_and_gather", "prolong_add"],
    "exchange": ["gather_rows", "add_rows"],
    "vectors": ["dot", "dot_and_norm", "step", "conjugate"],
}


def test_the_registry_offers_every_family_in_both_implementations():
    assert set(implementation.FAMILIES) == set(FAMILY_FUNCTIONS)
    for name in implementation.NAMES:
        kernels = implementation.get(name)
        for family, functions in FAMILY_FUNCTIONS.items():
            module = getattr(kernels, family)
            assert all(callable(getattr(module, function, None)) for function in functions), (name, family)
    assert implementation.get("fast").compiled and not implementation.get("numpy").compiled
    with pytest.raises(ValueError, match="unknown kernels"):
        implementation.get("fortran")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_the_registry_operator_matches_p_n_pt(impl, thread_count, rng):
    kernels = implementation.get(impl)
    starts, lengths, filter_index, inverse_psds, _ = interval_layout(rng)
    filters = kernels.noise.inverse_noise_filters(
        inverse_psds, {int(f): int(n) for f, n in zip(filter_index, lengths, strict=True)}
    )
    local_index, weights = smooth_pointing(rng, n_samp=int(lengths.sum()), n_local=700)
    local_map = rng.standard_normal((700, 3))
    tod = projection.project_map_to_tod(local_map, local_index, weights)
    noise.apply_inverse_noise(tod, starts, lengths, filter_index, inverse_psds)
    reference = projection.accumulate_tod_to_map(tod, local_index, weights, 700)
    out = np.full((700, 3), np.nan)
    product = kernels.operator.apply_inverse_noise_operator(
        local_map, local_index, weights, starts, lengths, filter_index, filters, threads=thread_count, out=out
    )
    assert product is out
    assert_close(product, reference)
    again = kernels.noise.apply_inverse_noise(
        projection.project_map_to_tod(local_map, local_index, weights), starts, lengths, filter_index, filters,
        threads=thread_count,
    )
    assert_close(again, tod)


def test_balanced_groups_cover_every_item_once():
    for lengths, groups in [([5, 5, 5, 5], 2), ([100, 1, 1, 1], 3), ([1], 4), ([], 2), ([3, 1, 4, 1, 5, 9, 2, 6], 3)]:
        ranges = threads.balanced_groups(lengths, groups)
        assert [i for r in ranges for i in r] == list(range(len(lengths)))
        assert len(ranges) <= max(groups, 1)


# ----------------------------------------------------------------------------- whole solves


@pytest.mark.parametrize("changes", [
    {"noise.f_knee_hz": 0.05, "noise.interval_s": 300.0},  # 1/f: FFT N^-1, fused operator
    {},  # white noise: fused white operator
    {"scan.kind": "ground", "scan.duration_s": 3600.0},
])
def test_whole_solve_matches_the_reference(changes, thread_count, monkeypatch):
    if changes.get("scan.kind") == "ground":
        spec = make_spec(scan={"kind": "ground", "duration_s": 3600.0, "chunk_s": 600.0, "elevation_deg": 50.0,
                               "azimuth_min_deg": 20.0, "azimuth_max_deg": 80.0, "azimuth_rate_deg_s": 1.0},
                         solver={"tol": 1e-10, "max_iter": 40, "rcond_min": 0.01})
    else:
        spec = make_spec(changes, solver={"tol": 1e-10, "max_iter": 40, "rcond_min": 0.01})
    from mapmaker.solve.realization import run_realization

    reference = run_realization(spec, 1, MPI.COMM_SELF, kernels="numpy", threads=thread_count)
    for pixel_order in ("sorted", "visit"):
        with monkeypatch.context() as patch:
            patch.setattr(local_data, "VISIT_ORDER_MIN_LOCAL_PIXELS", 0 if pixel_order == "visit" else 10**12)
            fast = run_realization(spec, 1, MPI.COMM_SELF, kernels="fast", threads=thread_count)
        assert fast.pcg.iterations == reference.pcg.iterations
        np.testing.assert_array_equal(fast.hits, reference.hits)
        assert fast.cut_pixels == reference.cut_pixels
        assert_close(fast.pcg.residual_history, reference.pcg.residual_history, rel=1e-6)
        seen = reference.iqu != hp.UNSEEN
        np.testing.assert_array_equal(fast.iqu != hp.UNSEEN, seen)
        assert_close(fast.iqu[seen], reference.iqu[seen])


def test_the_numpy_path_runs_without_numba():
    """The numpy kernels solve without numba and without ducc0's FFTs. A noise-only campaign, since
    a CMB sky is synthesised by pixell over ducc0 whatever the kernels (mapmaker.model.sky)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from mpi4py import MPI\n"
        "from tests.unit.mapmaker_cases import make_spec\n"
        "from mapmaker.solve.realization import run_realization\n"
        "spec = make_spec({'noise.f_knee_hz': 0.05, 'kind': 'noise-only'})\n"
        "run_realization(spec, 0, MPI.COMM_SELF, kernels='numpy')\n"
        "print('numba' in sys.modules, 'ducc0' in sys.modules)\n"
    )
    repository = Path(__file__).resolve().parents[2]
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=repository, check=False
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.split() == ["False", "False"]


def test_the_ahead_compile_forgets_numba_caches_and_nothing_else(tmp_path):
    """numba does not invalidate a cache when an inlined function of another module changes, so the
    ahead-of-time compile removes every .nbi/.nbc of the kernels first; bytecode and sources stay."""
    from mapmaker.kernels.implementation import forget_compiled

    cache = tmp_path / "__pycache__"
    cache.mkdir()
    stale = [cache / "projection_fast.project-40.py311.nbi", cache / "projection_fast.project-40.py311.1.nbc"]
    kept = [cache / "projection_fast.cpython-311.pyc", tmp_path / "projection_fast.py"]
    for path in stale + kept:
        path.write_bytes(b"x")
    assert forget_compiled(tmp_path) == 2
    assert not any(path.exists() for path in stale) and all(path.exists() for path in kept)
    assert forget_compiled(tmp_path) == 0
