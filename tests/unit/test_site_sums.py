"""Site partial sums: the Chan-Golub-LeVeque merge against a direct computation over all maps, and the file's checks."""

from __future__ import annotations

import numpy as np
import pytest

from campaignlib import montecarlo, sitesums
from campaignlib.sitesums import SiteSums, SiteSumsInvalid

NSIDE = 8
NPIX = 12 * NSIDE**2
RTOL = 1e-12  # merged moments against numpy over the same samples: round-off of a few operations per value


def _partial_maps(rng: np.random.Generator, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` maps on random partial skies (30 to 90 % of the pixels), with a large mean against the scatter."""
    maps = []
    for _ in range(n):
        seen = np.flatnonzero(rng.random(NPIX) < rng.uniform(0.3, 0.9))
        maps.append((seen, 1e3 + rng.normal(size=(3, seen.size))))
    return maps


def _direct(maps: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    full = np.full((len(maps), 3, NPIX), np.nan)
    for k, (pixels, iqu) in enumerate(maps):
        full[k][:, pixels] = iqu
    count = np.sum(np.isfinite(full[:, 0]), axis=0)
    mean = np.nansum(full, axis=0) / np.maximum(count, 1)
    m2 = np.nansum((full - mean) ** 2, axis=0)
    return count, mean, m2


def test_moments_merge_equals_the_direct_moments_on_partial_skies():
    rng = np.random.default_rng(1)
    maps = _partial_maps(rng, 9)
    halves = []
    for part in (maps[:4], maps[4:]):
        sums = SiteSums.empty(NSIDE)
        for k, (pixels, iqu) in enumerate(part):
            sums = sitesums.add_map(sums, len(halves) * 100 + k, pixels, iqu)
        halves.append(sums)
    merged = sitesums.merge(*halves)
    count, mean, m2 = _direct(maps)
    observed = count > 0
    np.testing.assert_array_equal(merged.pixels, np.flatnonzero(observed))
    np.testing.assert_array_equal(merged.count, count[observed])
    np.testing.assert_allclose(merged.mean, mean[:, observed], rtol=RTOL)
    np.testing.assert_allclose(merged.m2, m2[:, observed], rtol=1e-9)  # M2 ~ 1 against means of 1e3: 1e3 x eps
    assert merged.ledger == [[0, 4], [100, 105]] and merged.version == 9


def test_moments_merge_with_an_empty_side_keeps_the_other():
    mean = np.array([[1.0, 2.0]])
    m2 = np.array([[0.5, 0.0]])
    count, merged_mean, merged_m2 = montecarlo.moments_merge(
        np.array([3, 0]), mean, m2, np.array([0, 0]), np.zeros((1, 2)), np.zeros((1, 2))
    )
    np.testing.assert_array_equal(count, [3, 0])
    np.testing.assert_array_equal(merged_mean, [[1.0, 2.0]])
    np.testing.assert_array_equal(merged_m2, [[0.5, 0.0]])


def test_a_realisation_is_added_once():
    rng = np.random.default_rng(2)
    ((pixels, iqu),) = _partial_maps(rng, 1)
    once = sitesums.add_map(SiteSums.empty(NSIDE), 5, pixels, iqu)
    assert sitesums.add_map(once, 5, pixels, iqu) is once


def test_the_file_round_trips(tmp_path):
    rng = np.random.default_rng(3)
    sums = SiteSums.empty(NSIDE)
    for k, (pixels, iqu) in enumerate(_partial_maps(rng, 3)):
        sums = sitesums.add_map(sums, k, pixels, iqu)
    sitesums.write(tmp_path / "s.npz", sums)
    back = sitesums.read(tmp_path / "s.npz", nside=NSIDE)
    np.testing.assert_array_equal(back.pixels, sums.pixels)
    np.testing.assert_array_equal(back.mean, sums.mean)
    assert back.ledger == [[0, 3]]


def _members(**changes):
    pixels = np.array([1, 5, 9], np.int64)
    members = {
        "format": np.int64(1), "nside": np.int64(NSIDE), "pixels": pixels, "count": np.ones(3, np.int64),
        "mean": np.zeros((3, 3)), "m2": np.zeros((3, 3)), "ledger": np.array([[0, 1]], np.int64),
    }  # fmt: skip
    members.update(changes)
    return {name: value for name, value in members.items() if value is not None}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mean": np.zeros((3, 4))}, "mean"),
        ({"pixels": np.array([1, 5, NPIX], np.int64)}, "pixels"),
        ({"pixels": np.array([5, 1, 9], np.int64)}, "pixels"),
        ({"nside": np.int64(16)}, "nside"),
        ({"count": np.array([1, 0, 1], np.int64)}, "count"),
        ({"count": np.array([1, 2, 1], np.int64)}, "count"),
        ({"m2": -np.ones((3, 3))}, "m2"),
        ({"mean": np.full((3, 3), np.nan)}, "mean"),
        ({"ledger": np.array([[3, 1]], np.int64)}, "ledger"),
        ({"ledger": None}, "(file)"),
        ({"mean": np.array(["a"] * 9).reshape(3, 3)}, "mean"),
    ],
)
def test_hostile_files_are_refused_naming_the_member(tmp_path, changes, field):
    path = tmp_path / "s.npz"
    np.savez(path, **_members(**changes))
    with pytest.raises(SiteSumsInvalid) as caught:
        sitesums.read(path, nside=NSIDE)
    assert caught.value.field == field


def test_a_pickled_member_is_refused(tmp_path):
    path = tmp_path / "s.npz"
    np.savez(path, **_members(mean=np.array([object()] * 9, dtype=object).reshape(3, 3)))
    with pytest.raises(SiteSumsInvalid, match="mean"):
        sitesums.read(path, nside=NSIDE)


def test_not_a_zip_is_refused(tmp_path):
    path = tmp_path / "s.npz"
    path.write_bytes(b"hello")
    with pytest.raises(SiteSumsInvalid, match="npz"):
        sitesums.read(path)


def test_overlapping_ledgers_are_found():
    assert sitesums.ledgers_overlap([[0, 5]], [[4, 8]]) == [4]
    assert sitesums.ledgers_overlap([[0, 2], [6, 9]], [[2, 6]]) == []
