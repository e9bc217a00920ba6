"""The serial model of the overlap structure: the same pixel sets and figures as real plans."""
import numpy as np
import pytest
from mapmaker_cases import make_spec
from overlap_cases import random_sets

from mapmaker.model.decomposition import chunk_layout, decompose
from mapmaker.model.noise import NoiseModel
from mapmaker.parallel.commodel import figures_from_plans
from mapmaker.parallel.overlap import plan_from_pixel_sets
from mapmaker.parallel.overlap_model import chunk_sets, overlap_figures, rank_pixel_sets, relative_error
from mapmaker.solve.local_data import build_local_data

FIELDS = ("n_local", "shared", "neighbours", "butterfly", "light_shared", "light_neighbours", "heavy_pixels", "thresholds")


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 8, 12])
def test_model_figures_equal_the_plans_figures(size, dense, monkeypatch):
    """Exact equality; ``dense``: the butterfly counts of every shared pixel through the dense (BLAS) path."""
    if dense:
        monkeypatch.setattr("mapmaker.parallel.overlap_model.DENSE_MULTIPLICITY", 2)
    npix = 800
    sets = random_sets(size, npix, seed=7 * size, empty=(1,) if size > 4 else ())
    expected = figures_from_plans([plan_from_pixel_sets(r, sets, npix, 301) for r in range(size)])
    modeled = overlap_figures(sets, npix)
    assert modeled.neighbours_exact
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(modeled, name), getattr(expected, name), err_msg=name)


def test_over_budget_neighbours_are_sampled_and_right_where_known():
    npix, size = 800, 12
    sets = random_sets(size, npix, seed=3)
    exact = overlap_figures(sets, npix)
    sampled = overlap_figures(sets, npix, pair_budget=50)
    assert not sampled.neighbours_exact
    known = sampled.neighbours >= 0
    assert known.any()
    np.testing.assert_array_equal(sampled.neighbours[known], exact.neighbours[known])
    np.testing.assert_array_equal(sampled.butterfly, exact.butterfly)


@pytest.mark.parametrize("kind", ["satellite", "ground"])
def test_modeled_pixel_sets_are_the_ranks_pixels(kind):
    """One pointing per focal-plane offset reproduces every rank's local_pixels exactly."""
    changes = {"pixelization.nside": 32}
    if kind == "ground":
        changes["scan"] = {"kind": "ground", "duration_s": 7200.0, "chunk_s": 600.0, "azimuth_min_deg": 100.0,
                           "azimuth_max_deg": 200.0}
    spec = make_spec(changes)
    sets = chunk_sets(spec)
    assert len({tuple(row[0][:5]) for row in sets.sets}) > 1
    layout = chunk_layout(spec)
    noise = NoiseModel(spec, layout)
    for size in (1, 3, 4, 7):
        decomposition = decompose(layout, size)
        modeled = rank_pixel_sets(sets, size)
        for rank in range(size):
            local = build_local_data(spec, layout, decomposition.chunks_of(rank), noise)
            np.testing.assert_array_equal(modeled[rank], local.local_pixels)


def test_subsampling_error_is_measurable():
    spec = make_spec({"pixelization.nside": 64})
    exact = overlap_figures(rank_pixel_sets(chunk_sets(spec), 4), spec.pixelization.npix)
    coarse = overlap_figures(rank_pixel_sets(chunk_sets(spec, time_step=4), 4), spec.pixelization.npix)
    error = relative_error(exact, coarse)
    assert 0 < error["n_local"] < 1 and set(error) == {"n_local", "shared", "neighbours", "butterfly"}
    assert relative_error(exact, exact)["shared"] == 0
