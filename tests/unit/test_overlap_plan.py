"""The overlap plan without MPI: the sift against brute force, the allgather schedule, the butterfly schedule."""
import numpy as np
import pytest
from overlap_cases import random_sets

from mapmaker.parallel.overlap import (
    OWN_FOLDED,
    butterfly_schedule,
    butterfly_shape,
    gather_schedule,
    highest_bit,
    lowest_bit,
    plan_from_pixel_sets,
    simulate_butterfly,
)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("buffer_pixels", [37, 10_000])
def test_plan_matches_brute_force(size, buffer_pixels):
    npix = 600
    sets = random_sets(size, npix, seed=size, empty=(2,) if size > 3 else ())
    members = [set(s.tolist()) for s in sets]
    for rank in range(size):
        plan = plan_from_pixel_sets(rank, sets, npix, buffer_pixels)
        mine = sets[rank]
        observers = [[r for r in range(size) if int(p) in members[r]] for p in mine]
        np.testing.assert_array_equal(plan.multiplicity, [len(o) for o in observers])
        np.testing.assert_array_equal(plan.owner, [min(o) for o in observers])
        expected_neighbours = [r for r in range(size) if r != rank and members[r] & members[rank]]
        np.testing.assert_array_equal(plan.neighbours, expected_neighbours)
        for n, other in enumerate(plan.neighbours):
            shared = np.flatnonzero(np.isin(mine, sets[other]))
            np.testing.assert_array_equal(plan.shared_with(n), shared)
        # sum_j o_ij = sum over local pixels of (multiplicity - 1)
        assert plan.n_shared == int((plan.multiplicity - 1).sum())
        histogram = np.bincount([sum(int(p) in m for m in members) for p in range(npix)], minlength=size + 1)
        np.testing.assert_array_equal(plan.histogram, histogram)


@pytest.mark.parametrize("size", list(range(1, 13)) + [16, 17])
@pytest.mark.parametrize("k", [1, 3])
def test_butterfly_schedule_sums_exactly(size, k):
    """Every rank's schedule, run in one process, gives the serial sum for any p (folds for p not a power of 2)."""
    npix = 500
    sets = random_sets(size, npix, seed=100 + size, empty=(1,) if size > 2 else ())
    rng = np.random.default_rng(size)
    values = [rng.standard_normal((len(s), k)) for s in sets]
    total = np.zeros((npix, k))
    for s, v in zip(sets, values, strict=True):
        total[s] += v
    plans = [plan_from_pixel_sets(rank, sets, npix, buffer_pixels=97) for rank in range(size)]
    schedules = [butterfly_schedule(plan) for plan in plans]
    reduced = simulate_butterfly(schedules, values)
    for s, r in zip(sets, reduced, strict=True):
        np.testing.assert_allclose(r, total[s], rtol=1e-13, atol=1e-13)
    base, steps = butterfly_shape(size)
    for u in range(base):
        assert len(schedules[u].steps) == steps
        # What u sends at step m is what its partner expects.
        for m, step in enumerate(schedules[u].steps):
            assert len(step.send) == len(schedules[step.partner].steps[m].receive)
    for e in range(base, size):
        q = e - base
        assert len(schedules[e].fold_local) == len(schedules[q].fold_work)
        assert np.all(plans[q].interest_own[schedules[q].fold_work] & OWN_FOLDED)


def test_butterfly_sends_less_than_the_whole_map():
    """Sparse sets: each step carries only pixels the partner's subtree needs."""
    npix, size = 4000, 8
    sets = [np.arange(r * 500, r * 500 + 600) % npix for r in range(size)]  # neighbours overlap by 100
    plans = [plan_from_pixel_sets(rank, sets, npix) for rank in range(size)]
    sent = [sum(len(step.send) for step in butterfly_schedule(plan).steps) for plan in plans]
    assert max(sent) <= 2 * 100 * 3  # at most the overlaps, per step, never the 600-pixel sets


def test_gather_schedule_caps_every_piece():
    counts = np.array([5, 0, 12, 3, 7])
    for max_ids in (1, 4, 7, 12, 100):
        pieces = gather_schedule(counts, max_ids)
        assert all(lengths.sum() <= max_ids for _, lengths in pieces)
        got = np.zeros(len(counts), dtype=np.int64)
        for starts, lengths in pieces:
            present = lengths > 0
            np.testing.assert_array_equal(starts[present], got[present])  # each source in order, no gaps
            got += lengths
        np.testing.assert_array_equal(got, counts)
    assert len(gather_schedule(np.zeros(3, dtype=np.int64), 10)) == 1


def test_bit_helpers():
    values = np.array([0, 1, 2, 3, 4, 6, 8, 12, 2**31, 2**32 - 1])
    np.testing.assert_array_equal(highest_bit(values), [-1, 0, 1, 1, 2, 2, 3, 3, 31, 31])
    np.testing.assert_array_equal(lowest_bit(values), [-1, 0, 1, 0, 2, 1, 3, 2, 31, 0])
    assert butterfly_shape(1) == (1, 0) and butterfly_shape(6) == (4, 2) and butterfly_shape(8) == (8, 3)


def test_flat_positions_are_kept_only_for_the_pcg_columns():
    """The one-off 12-column reduction (hit and preconditioner blocks) must not leave its index arrays
    behind for the whole solve (found by review: ~300 bytes per local pixel on the butterfly)."""
    from mapmaker.parallel.reduction import FlatCache, flat_rows

    cache = FlatCache()
    rows = np.array([0, 2, 5])
    assert np.array_equal(cache(12, "slot", rows), flat_rows(rows, 12))
    assert np.array_equal(flat_rows(rows, 3), [0, 1, 2, 6, 7, 8, 15, 16, 17])
    assert cache(3, "slot", rows) is cache(3, "slot", rows)  # the PCG's k: made once, reused
    assert list(cache) == [(3, "slot")]


def test_butterfly_message_tags_fit_every_mpi():
    """Found by review: tags of 2^20 to 3 * 2^20 (+ step and piece) exceed MPI_TAG_UB on Cray MPICH
    (2^21 - 1) and Intel MPI 2021 (2^19 - 1); the standard only promises 32767. The pieces of a
    message now share its tag (MPI keeps their order), and steps number at most log2 of the ranks."""
    from mapmaker.parallel.reduction import ButterflyReduction

    most_steps = 64
    tags = [ButterflyReduction.FOLD, ButterflyReduction.UNFOLD]
    tags += [ButterflyReduction.STEP + m for m in range(most_steps)]
    assert max(tags) <= 32767 and len(set(tags)) == len(tags)
