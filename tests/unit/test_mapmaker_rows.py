"""The vector row operations of P and P^T (mapmaker.kernels.rows): the same bits as the scalar lines they replace."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from mapmaker.kernels import projection, projection_fast, threads
from mapmaker.kernels.rows import add_to_row, add_to_row_reading_ahead, dot_row


@njit
def _rows_with_intrinsics(local_map, local_index, weights, tod, out, scattered):
    for t in range(len(local_index)):
        out[t] = dot_row(local_map, local_index[t], weights, t)
        add_to_row(scattered, local_index[t], weights, t, tod[t])


@njit
def _rows_reading_ahead(local_map, local_index, weights, tod, out, scattered):
    n = len(local_index)
    for t in range(n):
        out[t] = dot_row(local_map, local_index[t], weights, t)
        if t + 1 < n:
            add_to_row_reading_ahead(scattered, local_index[t], weights, t, tod[t])
        else:
            add_to_row(scattered, local_index[t], weights, t, tod[t])


@njit
def _rows_scalar(local_map, local_index, weights, tod, out, scattered):
    for t in range(len(local_index)):
        p = local_index[t]
        out[t] = weights[t, 0] * local_map[p, 0] + weights[t, 1] * local_map[p, 1] + weights[t, 2] * local_map[p, 2]
        scattered[p, 0] += tod[t] * weights[t, 0]
        scattered[p, 1] += tod[t] * weights[t, 1]
        scattered[p, 2] += tod[t] * weights[t, 2]


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("weights_dtype", [np.float32, np.float64])
def test_row_operations_give_the_scalar_bits_on_every_row_alignment(index_dtype, weights_dtype):
    rng = np.random.default_rng(35)
    n_local, n_samp = 64, 5_000  # 24-byte rows: every offset in a 64-byte line, some rows across two lines
    local_map = rng.standard_normal((n_local, 3)) * 10.0 ** rng.integers(-8, 8, (n_local, 3))
    local_index = np.repeat(rng.integers(0, n_local, n_samp // 4), 4)[:n_samp].astype(index_dtype)
    weights = rng.standard_normal((n_samp, 3)).astype(weights_dtype)
    tod = rng.standard_normal(n_samp) * 1e3
    results = []
    for kernel in (_rows_scalar, _rows_with_intrinsics, _rows_reading_ahead):
        out, scattered = np.empty(n_samp), np.zeros((n_local, 3))
        kernel(local_map, local_index, weights, tod, out, scattered)
        results.append((out, scattered))
    for out, scattered in results[1:]:
        np.testing.assert_array_equal(out, results[0][0])
        np.testing.assert_array_equal(scattered, results[0][1])


def test_p_and_pt_equal_the_reference_bit_for_bit_on_a_masked_sky():
    """One thread: P and P^T of a scan whose cut pixels carry zero weights, against the numpy kernels exactly."""
    threads.configure(1)
    rng = np.random.default_rng(4)
    n_local, n_samp = 3_000, 300_000  # more samples than PREFETCH_DISTANCE, a map of 72 kB (beyond L1)
    local_index = (np.cumsum(rng.integers(0, 2, n_samp)) * 11 % n_local).astype(np.int32)
    psi = rng.uniform(0, np.pi, n_samp)
    weights = np.column_stack([np.ones(n_samp), np.cos(2 * psi), np.sin(2 * psi)]).astype(np.float32)
    cut = np.zeros(n_local, dtype=bool)
    cut[rng.choice(n_local, n_local // 5, replace=False)] = True  # a masked fifth of the sky
    weights[cut[local_index]] = 0.0
    local_map = rng.standard_normal((n_local, 3))
    local_map[cut] = 0.0
    tod = rng.standard_normal(n_samp)
    reference_tod = projection.project_map_to_tod(local_map, local_index.astype(np.int64), weights)
    np.testing.assert_array_equal(projection_fast.project_map_to_tod(local_map, local_index, weights), reference_tod)
    reference_map = projection.accumulate_tod_to_map(tod, local_index.astype(np.int64), weights, n_local)
    fast_map = projection_fast.accumulate_tod_to_map(tod, local_index, weights, n_local)
    np.testing.assert_array_equal(fast_map, reference_map)
    assert not fast_map[cut].any()


def test_row_shapes_are_checked_and_named():
    index = np.zeros(4, dtype=np.int32)
    with pytest.raises(ValueError, match="local_map"):
        projection_fast.project_map_to_tod(np.zeros((2, 4)), index, np.zeros((4, 3)))
    with pytest.raises(ValueError, match="weights"):
        projection_fast.accumulate_tod_to_map(np.zeros(4), index, np.zeros((4, 2)), 2)
    with pytest.raises(ValueError, match="out"):  # a copy of a strided target would drop the sums
        projection_fast.accumulate_tod_to_map(np.zeros(4), index, np.zeros((4, 3)), 2, out=np.zeros((3, 2)).T)


def test_p_with_streaming_stores_gives_the_same_bits(monkeypatch):
    """A TOD from STREAMING_SAMPLES on is written with streaming stores: the values of the ordinary path."""
    threads.configure(1)
    rng = np.random.default_rng(5)
    n_local, n_samp = 2_000, 4_000
    local_index = (np.cumsum(rng.integers(0, 2, n_samp)) * 7 % n_local).astype(np.int32)
    weights = rng.standard_normal((n_samp, 3)).astype(np.float32)
    local_map = rng.standard_normal((n_local, 3))
    reference = projection.project_map_to_tod(local_map, local_index.astype(np.int64), weights)
    monkeypatch.setattr(projection_fast, "STREAMING_SAMPLES", 1)
    np.testing.assert_array_equal(projection_fast.project_map_to_tod(local_map, local_index, weights), reference)
    strided = np.zeros(2 * n_samp)
    projection_fast.project_map_to_tod(local_map, local_index, weights, out=strided[::2])
    np.testing.assert_array_equal(strided[::2], reference)
    assert not strided[1::2].any()
