"""The default preconditioner ``auto``: two-level only when its coarse operator is shared and fits, then the
faster of the two as timed on the campaign's realisations."""
import json

import pytest

from mapmaker.solve.coarse import AUTO_COARSE_BYTES, SolveTiming, choose_by_timing, choose_preconditioner
from mapmaker.solve.coarsefile import read_solve_timings, record_solve_timing, timings_folder


@pytest.mark.parametrize(
    ("cached", "realizations", "coarse_bytes", "expected"),
    [
        (False, 1, 1000, "block-diagonal"),  # a one-off with nothing cached: no set-up to pay back
        (False, 2, 1000, "two-level"),  # built once, read by the other realisation
        (True, 1, 1000, "two-level"),  # read from the cache: the first trial
        (True, 16, AUTO_COARSE_BYTES, "two-level"),
        (True, 16, AUTO_COARSE_BYTES + 1, "block-diagonal"),  # A Z too large to hold and read every iteration
    ],
)
def test_auto_resolves_by_sharing_and_size(cached, realizations, coarse_bytes, expected):
    chosen = choose_preconditioner("auto", cached=cached, realizations=realizations, coarse_bytes=coarse_bytes)
    assert chosen.preconditioner == expected and chosen.why
    assert chosen.timed == (cached and expected == "two-level")  # only a read operator's solve is a trial


@pytest.mark.parametrize("requested", ["block-diagonal", "two-level", "two-level-additive"])
def test_an_explicit_preconditioner_is_kept(requested):
    timings = [SolveTiming("block-diagonal", 1.0, 10), SolveTiming("two-level", 9.0, 5)]
    chosen = choose_preconditioner(requested, cached=True, realizations=1, coarse_bytes=10, timings=timings)
    assert chosen.preconditioner == requested and not chosen.timed


def test_cached_auto_times_each_preconditioner_once_then_keeps_the_faster():
    def choose(*timings: SolveTiming):
        return choose_preconditioner("auto", cached=True, realizations=16, coarse_bytes=1000, timings=timings)

    assert choose()[::2] == ("two-level", True)
    two_level = SolveTiming("two-level", 8.8, 13)
    assert choose(two_level)[::2] == ("block-diagonal", True)
    slower_block = SolveTiming("block-diagonal", 9.5, 16)
    faster_block = SolveTiming("block-diagonal", 7.9, 16)
    assert choose(two_level, slower_block)[::2] == ("two-level", False)
    verdict = choose(two_level, faster_block)
    assert verdict[::2] == ("block-diagonal", False) and "7.90 s" in verdict.why and "8.80 s" in verdict.why
    # medians: one slow outlier among three block-diagonal solves does not flip the verdict
    assert choose_by_timing([two_level, faster_block, faster_block, SolveTiming("block-diagonal", 60.0, 16)]
                            ).preconditioner == "block-diagonal"


def test_timings_round_trip_and_foreign_records_are_ignored(tmp_path):
    cache = tmp_path / "coarse.npz"
    assert read_solve_timings(cache, key="k", tol=1e-6) == []  # no folder yet
    mine = SolveTiming("two-level", 2.5, 11)
    assert record_solve_timing(cache, mine, key="k", tol=1e-6) is None
    assert record_solve_timing(cache, SolveTiming("block-diagonal", 2.0, 14), key="other", tol=1e-6) is None
    assert record_solve_timing(cache, SolveTiming("block-diagonal", 2.0, 14), key="k", tol=1e-8) is None
    folder = timings_folder(cache)
    (folder / "broken.json").write_text("{not json")
    (folder / "negative.json").write_text(json.dumps(
        {"key": "k", "tol": 1e-6, "preconditioner": "block-diagonal", "seconds": -1, "iterations": 3}))
    (folder / "unknown.json").write_text(json.dumps(
        {"key": "k", "tol": 1e-6, "preconditioner": "jacobi", "seconds": 1, "iterations": 3}))
    (folder / "huge.json").write_text(json.dumps(
        {"key": "k", "tol": 1e-6, "preconditioner": "block-diagonal", "seconds": 1, "iterations": 3, "pad": "x" * 2000}))
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"key": "k", "tol": 1e-6, "preconditioner": "block-diagonal", "seconds": 1,
                                   "iterations": 3}))
    (folder / "link.json").symlink_to(outside)
    assert read_solve_timings(cache, key="k", tol=1e-6) == [mine]


def test_an_unwritable_timings_folder_is_reported_not_raised(tmp_path):
    cache = tmp_path / "coarse.npz"
    timings_folder(cache).write_text("a file where the folder should be")
    problem = record_solve_timing(cache, SolveTiming("two-level", 1.0, 5), key="k", tol=1e-6)
    assert problem is not None and "coarse.npz" in problem
