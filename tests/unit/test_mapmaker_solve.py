"""Whole solves on one rank (MPI.COMM_SELF) against known answers.

Relative map comparisons are stated per Stokes component: ``|a - b| <= rel *
max|b|`` over the solved pixels, unless a per-pixel rtol is named.
"""
import healpy as hp
import numpy as np
import pytest
from mapmaker_cases import COLOCATED_QUAD, make_spec
from mpi4py import MPI

from mapmaker.kernels import preconditioner as blocks
from mapmaker.kernels import projection
from mapmaker.model.decomposition import chunk_layout, decompose
from mapmaker.model.noise import NoiseModel
from mapmaker.model.sky import build_sky
from mapmaker.solve.local_data import build_local_data
from mapmaker.solve.realization import run_realization


def solved_mask(outcome):
    return outcome.iqu[0] != hp.UNSEEN


def simulate_all(spec, realization):
    """The TOD of every chunk in one flat array, with the cached pointing (one rank holds all).

    The numpy reference's cache: its local_index counts rows in sorted pixel order.
    """
    layout = chunk_layout(spec)
    noise = NoiseModel(spec, layout)
    local = build_local_data(spec, layout, decompose(layout, 1).chunks_of(0), noise, kernels="numpy")
    full_sky = build_sky(spec, realization, None)
    tod = np.zeros(local.n_samples)
    if full_sky is not None:
        projection.project_map_to_tod(full_sky.T[local.local_pixels], local.local_index, local.weights, out=tod)
    for i, chunk in enumerate(local.chunks):
        if noise.simulated:
            tod[local.chunk_offsets[i] : local.chunk_offsets[i + 1]] += noise.simulate_chunk(chunk, spec.seed, realization)
    return local, tod, full_sky


def binned_map(spec, realization):
    """The white-noise (3x3 binned) map solved directly per pixel, full sky [3, npix], NaN where cut."""
    local, tod, _ = simulate_all(spec, realization)
    inverse_variance = local.sample_noise_diagonal()
    geometric = blocks.accumulate_blocks(local.local_index, local.weights, local.n_local)
    keep = blocks.rcond(geometric) >= spec.solver.rcond_min
    weighted = blocks.accumulate_blocks(local.local_index, local.weights, local.n_local, inverse_variance)
    rhs = projection.accumulate_tod_to_map(tod * inverse_variance, local.local_index, local.weights, local.n_local)
    full = np.full((3, spec.pixelization.npix), np.nan)
    full[:, local.local_pixels[keep]] = blocks.solve(weighted, rhs, keep)[keep].T
    return full


def test_noiseless_solve_returns_the_input_sky():
    spec = make_spec({"solver.tol": 1e-10}, kind="signal-only", noise="off")
    outcome = run_realization(spec, 2, MPI.COMM_SELF)
    sky = build_sky(spec, 2, None)
    solved = solved_mask(outcome)
    assert outcome.pcg.converged and solved.sum() > 0.9 * outcome.observed_pixels
    assert outcome.cut_pixels == outcome.observed_pixels - solved.sum()
    for stokes in range(3):
        np.testing.assert_allclose(outcome.iqu[stokes, solved], sky[stokes, solved], rtol=1e-6)


@pytest.mark.parametrize("rcond_min", [0.01, 0.0])  # 0: singular blocks are still cut, never inverted
def test_noiseless_ground_solve_returns_the_input_sky(rcond_min):
    spec = make_spec(
        {"solver.tol": 1e-10, "solver.rcond_min": rcond_min},
        kind="signal-only",
        noise="off",
        scan={"kind": "ground", "duration_s": 7200.0, "chunk_s": 900.0, "azimuth_min_deg": 150.0,
              "azimuth_max_deg": 210.0, "elevation_deg": 45.0, "azimuth_rate_deg_s": 2.0},
    )
    outcome = run_realization(spec, 0, MPI.COMM_SELF)
    sky = build_sky(spec, 0, None)
    solved = solved_mask(outcome)
    assert solved.sum() > 20 and outcome.cut_pixels > 0  # the edges of the patch are cut
    for stokes in range(3):
        np.testing.assert_allclose(outcome.iqu[stokes, solved], sky[stokes, solved], rtol=1e-6)


def test_white_noise_pcg_map_equals_the_binned_map():
    spec = make_spec({"solver.tol": 1e-10}, kind="signal+noise")
    outcome = run_realization(spec, 1, MPI.COMM_SELF)
    direct = binned_map(spec, 1)
    solved = solved_mask(outcome)
    np.testing.assert_array_equal(solved, ~np.isnan(direct[0]))
    for stokes in range(3):
        scale = np.abs(direct[stokes, solved]).max()
        np.testing.assert_allclose(outcome.iqu[stokes, solved], direct[stokes, solved], rtol=0, atol=1e-8 * scale)


def large_scale_power(iqu, solved, lmax=8):
    """Sum of the I pseudo-spectrum of an error map over 1 <= l <= lmax (unsolved pixels set to 0)."""
    error = np.where(solved, iqu[0], 0.0)
    return hp.anafast(error, lmax=lmax)[1:].sum()


ONE_OVER_F = {"noise.f_knee_hz": 1.0, "noise.alpha": 1.0, "noise.f_min_hz": 1e-3, "scan.duration_s": 21600.0}


def test_one_over_f_ml_map_has_less_large_scale_error_than_the_binned_map():
    """Noise-only campaign, f_knee = 1 Hz, 60 x above the 1/60 Hz spin frequency, 6 hours, nside 8.

    The map *is* the error. Measure: the I pseudo-spectrum of the error map
    (unsolved pixels zero) summed over 1 <= l <= 8. Binned maps carry the
    1/f drifts as stripes, which live at large scales; the ML map removes
    what the cross-linking constrains. For this scan the ML map has about 6
    times less such power than the binned one (white noise alone: 100 times
    less); the test asks for a factor 3.
    """
    spec = make_spec({**ONE_OVER_F, "solver.tol": 1e-6}, kind="noise-only", pixelization={"nside": 8})
    outcome = run_realization(spec, 0, MPI.COMM_SELF)
    assert outcome.pcg.converged and outcome.pcg.residual_history[-1] < 1e-6
    assert outcome.pcg.iterations > 3
    naive = binned_map(spec, 0)
    solved = solved_mask(outcome)
    np.testing.assert_array_equal(solved, ~np.isnan(naive[0]))
    ml_power = large_scale_power(outcome.iqu, solved)
    naive_power = large_scale_power(np.nan_to_num(naive), solved)
    assert ml_power < naive_power / 3, (ml_power, naive_power)


def test_white_noise_map_errors_have_unit_chi_square():
    """White noise, four co-located detectors at 0/45/90/135 degrees, nside 32.

    Every sample time adds diag(4, 2, 2) / sigma^2 to its pixel's block, so
    the I variance is exactly sigma^2 / hits. chi^2 per degree of freedom:
    I alone (one dof per pixel) against sigma^2 / hits, and I, Q, U together
    through the full 3x3 block (e^T H e, three dof per pixel). With ~12,000
    pixels the I statistic has sd sqrt(2 / 12,000) = 1.3 %, so 5 % is ~4 sd.
    """
    spec = make_spec(
        {"focal_plane.detectors": COLOCATED_QUAD, "scan.duration_s": 21600.0, "scan.chunk_s": 1800.0},
        kind="noise-only",
        pixelization={"nside": 32},
    )
    outcome = run_realization(spec, 0, MPI.COMM_SELF)
    solved = solved_mask(outcome)
    assert solved.sum() > 10_000 and outcome.cut_pixels == 0
    sigma2 = (spec.noise.net_k_sqrt_s**2) * spec.focal_plane.sample_rate_hz
    hits = outcome.hits[solved]
    errors = outcome.iqu[:, solved]
    chi2_i = np.mean(errors[0] ** 2 * hits / sigma2)
    assert chi2_i == pytest.approx(1.0, abs=0.05)
    block = np.array([1.0, 0.5, 0.5])[:, None] * hits / sigma2  # H = diag(hits, hits/2, hits/2) / sigma^2
    chi2_iqu = np.mean(np.sum(errors**2 * block, axis=0)) / 3
    assert chi2_iqu == pytest.approx(1.0, abs=0.05)


def test_outcome_reports_counts():
    spec = make_spec({"noise.f_knee_hz": 0.2})
    outcome = run_realization(spec, 0, MPI.COMM_SELF)
    assert outcome.samples == spec.total_samples == outcome.stats.samples
    assert outcome.hits.sum() == spec.total_samples
    assert outcome.observed_pixels == np.count_nonzero(outcome.hits)
    assert outcome.strategy == "allreduce" and outcome.requested == "auto"
    assert len(outcome.pcg.residual_history) == outcome.pcg.iterations + 1
    rcond = outcome.rcond[outcome.hits > 0]
    assert np.all((rcond >= 0) & (rcond <= 0.5 + 1e-12))  # rcond of (1, cos, sin) blocks is at most 1/2
    assert outcome.stats.reduce_bytes == 0  # one rank sends nothing


def test_gathered_maps_are_typed_full_sky_arrays_built_without_a_dense_copy():
    """gather_maps fills IQU, hits and rcond from the owned rows, and holds no other full-sky array.

    The earlier gather built a dense [npix, 6] float64 copy of every column
    before the typed maps (~100 bytes per sky pixel at its peak); the typed
    maps themselves are 40 bytes per pixel (3 + 1 + 1 values of 8 bytes).
    """
    import tracemalloc

    from mapmaker.parallel.distributed import DistributedPixels
    from mapmaker.solve.realization import gather_maps

    nside = 128
    npix = hp.nside2npix(nside)
    generator = np.random.default_rng(5)
    local_pixels = np.sort(generator.choice(npix, size=npix // 2, replace=False)).astype(np.int64)
    pixels = DistributedPixels(MPI.COMM_SELF, local_pixels, npix, buffer_pixels=4096)
    n = len(local_pixels)
    solution = generator.standard_normal((n, 3))
    hits = generator.integers(1, 50, n).astype(np.float64)
    rcond = generator.uniform(0, 0.5, n)
    cut = rcond < 0.05

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        iqu, hit_map, rcond_map = gather_maps(pixels, solution, hits, rcond, cut)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    solved = local_pixels[~cut]
    expected_iqu = np.full((3, npix), hp.UNSEEN)
    expected_iqu[:, solved] = solution[~cut].T
    np.testing.assert_array_equal(iqu, expected_iqu)
    expected_hits = np.zeros(npix, dtype=np.int64)
    expected_hits[local_pixels] = hits.astype(np.int64)
    np.testing.assert_array_equal(hit_map, expected_hits)
    assert hit_map.dtype == np.int64
    expected_rcond = np.full(npix, hp.UNSEEN)
    expected_rcond[local_pixels] = rcond
    np.testing.assert_array_equal(rcond_map, expected_rcond)

    # The maps (40 bytes per sky pixel) plus the local [n_local, 6] rows (48 per observed pixel,
    # half the sky here) and one piece; the dense copy would add 48 more per sky pixel.
    assert peak - before <= 40 * npix + 48 * n + 200 * 4096 + (1 << 20)


@pytest.mark.parametrize("pixel_order", ["sorted", "visit"])
@pytest.mark.parametrize("kernels", ["numpy", "fast"])
@pytest.mark.parametrize("f_knee_hz", [0.0, 0.5])
def test_overlapped_operator_equals_the_operator(kernels, f_knee_hz, pixel_order):
    """P^T N^-1 P with the shared rows' P^T first and start() between: the same product to round-off,
    the shared rows final when start() sees them (the private rows' samples added after), on sorted and
    visit-order rows, and again on a second call (the kept buffers reused)."""
    spec = make_spec({"noise.f_knee_hz": f_knee_hz})  # white, then 1/f noise
    layout = chunk_layout(spec)
    local = build_local_data(spec, layout, decompose(layout, 1).chunks_of(0), NoiseModel(spec, layout), kernels=kernels,
                             pixel_order=pixel_order)
    assert (local.order is None) == (pixel_order == "sorted")
    x = np.random.default_rng(5).standard_normal((local.n_local, 3))
    shared = np.random.default_rng(6).random(local.n_local) < 0.4
    expected = local.apply_operator(x)
    seen = {}

    def start(partial):
        seen["shared"] = partial[shared].copy()

    scale = np.abs(expected).max()
    for _ in range(2):
        product = local.apply_operator_overlapped(x, local.operator_split(shared), start)
        np.testing.assert_allclose(product, expected, rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(seen["shared"], expected[shared], rtol=0, atol=1e-12 * scale)
        seen.clear()
    assert 0 < local.operator_split(shared).private_fraction < 1


@pytest.mark.parametrize("kernels", ["fast", "numpy"])
@pytest.mark.parametrize(
    "changes",
    [
        {"noise.f_knee_hz": 0.5, "solver.preconditioner": "block-diagonal"},
        {"noise.f_knee_hz": 0.5, "solver.preconditioner": "two-level"},
        {"noise.f_knee_hz": 0.0, "solver.preconditioner": "block-diagonal"},
    ],
)
def test_recomputed_pointing_gives_the_cached_pointing_map(kernels, changes, monkeypatch):
    # float32 cached weights against float64 recomputed ones: one system to ~1e-7, so the maps agree to the tolerance
    from mapmaker.solve import local_data

    monkeypatch.setattr(local_data, "RECOMPUTE_SAMPLES", 10_000)  # runs of two 4,500-sample chunks: 16 runs
    tol = 1e-8
    maps = {}
    for mode in ("cached", "recomputed"):
        spec = make_spec({**changes, "solver.tol": tol, "solver.pointing": mode, "solver.rcond_min": 0.1})
        outcome = run_realization(spec, 1, MPI.COMM_SELF, kernels=kernels)
        assert outcome.pcg.converged
        maps[mode] = outcome
    cached, recomputed = maps["cached"], maps["recomputed"]
    np.testing.assert_array_equal(cached.hits, recomputed.hits)
    solved = solved_mask(cached)
    np.testing.assert_array_equal(solved, solved_mask(recomputed))
    assert cached.excluded_samples == recomputed.excluded_samples
    for k in range(3):
        scale = np.max(np.abs(cached.iqu[k, solved]))
        # the solve's tolerance on ||r|| / ||b|| bounds the map error through the condition number; 1e-5 is
        # far under the maps' noise and far over float32 rounding (6e-8)
        assert np.max(np.abs(recomputed.iqu[k, solved] - cached.iqu[k, solved])) <= 1e-5 * scale


@pytest.mark.parametrize("kernels,visit_order", [("numpy", False), ("fast", False), ("fast", True)])
def test_slabs_give_the_blocks_and_the_cut_of_the_whole(kernels, visit_order, monkeypatch):
    """Weighted blocks summed slab by slab into one array, and cut samples zeroed slab by slab (slabs of 1,000
    samples here): the blocks of the whole pointing at once, exactly the cut pixels' samples out, on a masked sky.
    Both kinds of blocks side by side (the set-up's [n, 12], each half permuted into its columns from visit
    order when the rows are in it): the same, in sorted order, and the same from recomputed pointing."""
    from mapmaker.solve import local_data

    monkeypatch.setattr(local_data, "VISIT_ORDER_MIN_LOCAL_PIXELS", 0 if visit_order else 10**12)
    spec = make_spec({"noise.f_knee_hz": 0.5})
    layout = chunk_layout(spec)
    local = build_local_data(spec, layout, decompose(layout, 1).chunks_of(0), NoiseModel(spec, layout), kernels=kernels)
    assert (local.position is not None) == visit_order
    weights_before = local.weights.copy()
    sample_weight = local.sample_noise_diagonal()
    whole = local.to_sorted(blocks.accumulate_blocks(local.local_index, local.weights, local.n_local, sample_weight))
    geometric = local.to_sorted(blocks.accumulate_blocks(local.local_index, local.weights, local.n_local))
    monkeypatch.setattr(local_data, "SLAB_SAMPLES", 1_000)
    assert local.n_samples > 10 * local_data.SLAB_SAMPLES
    slabbed = local.accumulate_blocks(noise_weighted=True)
    np.testing.assert_allclose(slabbed, whole, rtol=0, atol=1e-12 * np.abs(whole).max())
    both = local.accumulate_both_blocks()
    np.testing.assert_allclose(both[:, :6], geometric, rtol=0, atol=1e-12 * np.abs(geometric).max())
    np.testing.assert_array_equal(both[:, 6:], slabbed)
    # Recomputed pointing sums run by run (runs of 10,000 samples here) into the same two arrays: float64 weights
    # against the cache's float32, so the same blocks to ~1e-7.
    monkeypatch.setattr(local_data, "RECOMPUTE_SAMPLES", 10_000)
    recomputed = build_local_data(spec, layout, decompose(layout, 1).chunks_of(0), NoiseModel(spec, layout),
                                  kernels=kernels, pointing="recomputed")
    assert recomputed.weights is None and len(recomputed.chunk_runs()) > 10
    again = recomputed.accumulate_both_blocks()
    for half in (slice(0, 6), slice(6, 12)):  # each on its own scale (hits; K^-2)
        np.testing.assert_allclose(again[:, half], both[:, half], rtol=0, atol=1e-6 * np.abs(both[:, half]).max())

    cut = np.random.default_rng(3).random(local.n_local) < 0.2  # sorted order
    excluded = cut[local.to_compute(np.arange(local.n_local))[local.local_index]]  # each sample's pixel cut or not
    assert local.exclude_pixels(cut) == np.count_nonzero(excluded) > 0
    assert np.all(local.weights[excluded] == 0.0)
    np.testing.assert_array_equal(local.weights[~excluded], weights_before[~excluded])
    assert local.exclude_pixels(np.zeros(local.n_local, dtype=bool)) == 0
