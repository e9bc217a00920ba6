"""The service's side of sites that keep their maps: partial sums checked, stored and merged with uploaded maps."""

from __future__ import annotations

import copy

import healpy as hp
import numpy as np
import pytest

from campaignlib import sitesums
from campaignlib.sitesums import SiteSums
from service.products.aggregates import include_realization, load_state
from service.products.mapsums import SiteSumsOutdated, SiteSumsRefused, mean_and_variance_maps, store_site_sums
from service.storage import CampaignProducts
from tests.unit.test_products_aggregates import NSIDE, make_realization

RTOL = 1e-12  # merged mean and variance against numpy over the same maps


def _kept(result, site):
    kept = copy.deepcopy(result)
    for product in kept["products"]:
        if product["name"] == "iqu":
            product["kept"] = {"site": site, "path": f"/store/{site}/{result['realization']}/map_iqu.fits"}
    return kept


def _site_file(tmp_path, name, maps):
    """A site's sums file of ``maps`` {index: iqu [3, npix] with UNSEEN where unobserved}."""
    sums = SiteSums.empty(NSIDE)
    for index, iqu in maps.items():
        seen = np.flatnonzero(iqu[0] != hp.UNSEEN)
        sums = sitesums.add_map(sums, index, seen, iqu[:, seen])
    path = tmp_path / f"{name}.npz"
    sitesums.write(path, sums)
    return path


@pytest.fixture
def campaign(tmp_path):
    """Realisations 0-1 uploaded, 2-3 kept at site a, 4-6 at site b; each map misses a different patch."""
    files = CampaignProducts(tmp_path / "campaigns", 3)
    made = []
    for index in range(7):
        result, product_dir, iqu, _ = make_realization(tmp_path / "uploads", index)
        iqu[:, 12 + 5 * index : 20 + 5 * index] = hp.UNSEEN  # partial skies that differ between realisations
        hp.write_map(str(product_dir / "map_iqu.fits"), iqu, dtype=np.float64, overwrite=True)
        site = None if index < 2 else "a" if index < 4 else "b"
        include_realization(files, index, _kept(result, site) if site else result, product_dir)
        made.append(iqu)
    return files, made


def test_the_merge_of_two_sites_equals_the_maps_uploaded(tmp_path, campaign):
    files, maps = campaign
    assert load_state(files).n_maps == 2 and load_state(files).kept == {"a": [[2, 4]], "b": [[4, 7]]}
    store_site_sums(files, site="a", received=_site_file(tmp_path, "a", {2: maps[2], 3: maps[3]}), nside=NSIDE)
    store_site_sums(files, site="b", received=_site_file(tmp_path, "b", {i: maps[i] for i in (4, 5, 6)}), nside=NSIDE)
    state = load_state(files)
    assert state.n_maps == 7
    mean, variance = mean_and_variance_maps(files, state)
    stack = np.where(np.array(maps) == hp.UNSEEN, np.nan, np.array(maps))
    count = np.sum(np.isfinite(stack[:, 0]), axis=0)
    expected_mean = np.nansum(stack, axis=0) / np.maximum(count, 1)
    expected_var = np.nansum((stack - expected_mean) ** 2, axis=0) / np.maximum(count - 1, 1)
    observed = count > 1
    assert np.all(mean[:, count == 0] == hp.UNSEEN)
    np.testing.assert_allclose(mean[:, observed], expected_mean[:, observed], rtol=RTOL)
    np.testing.assert_allclose(variance[:, observed], expected_var[:, observed], rtol=1e-10)


def test_a_later_send_replaces_the_sites_sums_and_an_older_one_is_refused(tmp_path, campaign):
    files, maps = campaign
    store_site_sums(files, site="b", received=_site_file(tmp_path, "b1", {4: maps[4]}), nside=NSIDE)
    store_site_sums(files, site="b", received=_site_file(tmp_path, "b2", {4: maps[4], 5: maps[5]}), nside=NSIDE)
    state = load_state(files)
    assert state.site_sums["b"]["version"] == 2 and state.n_maps == 4
    assert [p.name for p in files.site_sums_files()] == [state.site_sums["b"]["file"]]
    with pytest.raises(SiteSumsOutdated):
        store_site_sums(files, site="b", received=_site_file(tmp_path, "b3", {6: maps[6]}), nside=NSIDE)
    assert load_state(files).generation == state.generation


@pytest.mark.parametrize(
    ("site", "indexes", "words"),
    [
        ("a", (2, 4), "not accepted results whose map site 'a' keeps"),  # 4 is b's
        ("a", (0, 2), "counted from uploaded maps"),
        ("c", (2,), "not accepted results whose map site 'c' keeps"),
    ],
)
def test_a_realisation_counted_twice_is_refused_and_nothing_changes(tmp_path, campaign, site, indexes, words):
    files, maps = campaign
    before = files.state_path.read_bytes()
    with pytest.raises(SiteSumsRefused, match=words):
        store_site_sums(
            files, site=site, received=_site_file(tmp_path, "x", {i: maps[i] for i in indexes}), nside=NSIDE
        )
    assert files.state_path.read_bytes() == before and not list(files.site_sums_files())


def test_the_same_realisation_in_two_sites_is_refused(tmp_path, campaign):
    files, maps = campaign
    state = load_state(files)
    store_site_sums(files, site="a", received=_site_file(tmp_path, "a", {2: maps[2]}), nside=NSIDE)
    # A site claiming a's realisation (its state edited as if both kept it) names the other site.
    from service.products.aggregates import save_state

    state = load_state(files)
    state.kept["b"] = [[2, 7]]
    save_state(files, state)
    with pytest.raises(SiteSumsRefused, match="in the sums of site 'a'"):
        store_site_sums(files, site="b", received=_site_file(tmp_path, "b", {2: maps[2]}), nside=NSIDE)


def test_sums_of_another_nside_are_refused(tmp_path, campaign):
    files, maps = campaign
    with pytest.raises(SiteSumsRefused, match="nside"):
        store_site_sums(files, site="a", received=_site_file(tmp_path, "a", {2: maps[2]}), nside=2 * NSIDE)
