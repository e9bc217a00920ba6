"""The software prefetch of map rows: compiled into the gathers and scatters, harmless at the array's edges."""
from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from mapmaker.kernels.prefetch import prefetch_row_for_read, prefetch_row_for_write


@njit
def _touch_every_row(array, rows):
    for r in rows:
        prefetch_row_for_read(array, r)
        prefetch_row_for_write(array, r)


@pytest.mark.parametrize("columns", [3, 6])
@pytest.mark.parametrize("index_type", [np.int32, np.int64])
def test_prefetch_compiles_for_every_index_type_and_row_width_and_leaves_the_array_unchanged(columns, index_type):
    array = np.arange(10 * columns, dtype=np.float64).reshape(10, columns)
    before = array.copy()
    _touch_every_row(array, np.array([0, 9, 5, 9, 0], dtype=index_type))
    np.testing.assert_array_equal(array, before)


def test_prefetch_refuses_a_one_dimensional_array():
    with pytest.raises(TypingError):
        _touch_every_row(np.zeros(4), np.zeros(1, dtype=np.int64))


def _compiled_ir(kernel, *arguments) -> str:
    """The LLVM IR of ``kernel`` compiled afresh with its own options (numba cannot inspect cached code)."""
    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
    fresh = numba.njit(**options)(kernel.py_func)
    fresh(*arguments)
    return "\n".join(fresh.inspect_llvm().values())


def test_the_gathers_and_scatters_request_rows_ahead():
    """The hot loops carry the prefetch: it is what keeps P and P^T near the memory floor at nside 256."""
    from mapmaker.kernels import operator_fast, preconditioner_fast, projection_fast

    rng = np.random.default_rng(7)
    n_local, n_samp = 16, 300
    local_map = rng.standard_normal((n_local, 3))
    index = rng.integers(0, n_local, n_samp).astype(np.int32)
    weights = rng.standard_normal((n_samp, 3))
    tod = rng.standard_normal(n_samp)
    one_interval = (np.array([0, 1]), np.array([0]), np.array([n_samp]), np.array([2.0]))
    cases = {
        "P": (projection_fast._project, local_map, index, weights, np.empty(n_samp), 2, False),
        "P^T": (projection_fast._accumulate, tod, index, weights, np.zeros((n_local, 3)), 2),
        "operator gather": (operator_fast.gather_samples, local_map, index, weights, np.empty(n_samp)),
        "operator scatter": (operator_fast._scatter, tod, index, weights, np.zeros((n_local, 3))),
        "white operator": (operator_fast._white_operator, local_map, index, weights, *one_interval, np.zeros((n_local, 3))),
        "preconditioner": (preconditioner_fast._accumulate_blocks, index, weights, tod, True, np.zeros((n_local, 6)), 2),
    }
    for name, (kernel, *arguments) in cases.items():
        assert "llvm.prefetch" in _compiled_ir(kernel, *arguments), name
