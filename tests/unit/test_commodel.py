"""The alpha-beta model: traffic figures, costs, and what auto picks in clear-cut cases."""
import numpy as np
import pytest

from mapmaker.parallel import commodel
from mapmaker.parallel.commodel import FRANKLIN, Machine, Workload, figures_from_plans, select_strategy, strategy_costs
from mapmaker.parallel.overlap import plan_from_pixel_sets


def figures_of(sets, npix):
    return figures_from_plans([plan_from_pixel_sets(r, sets, npix) for r in range(len(sets))])


def bands(size, npix, overlap, everyone=()):
    """Rank r observes a band of the map overlapping its neighbours' by ``overlap`` pixels, plus ``everyone``."""
    width = npix // size
    return [
        np.unique(np.concatenate([np.arange(r * width - overlap, (r + 1) * width + overlap) % npix, everyone])).astype(np.int64)
        for r in range(size)
    ]


MANY = Workload(realizations=100, iterations=50, buffer_pixels=1 << 16)


def test_figures_count_what_the_strategies_send():
    npix, size = 20_000, 8
    figures = figures_of(bands(size, npix, 10), npix)
    np.testing.assert_array_equal(figures.neighbours, 2)
    np.testing.assert_array_equal(figures.shared, 2 * 20)  # 2 x overlap on each side
    assert figures.total_local == npix + size * 20
    costs = strategy_costs(figures, FRANKLIN, k=3, buffer_pixels=npix)
    assert costs["alltoallv"].bytes_max == 40 * 3 * 8 and costs["alltoallv"].messages_max == 2
    # Rabenseifner: 2 n (p - 1) / p values of 8 bytes, 2 ceil(log2 p) messages, one buffer.
    assert costs["allreduce"].bytes_max == round(2 * npix * 3 * 7 / 8 * 8) and costs["allreduce"].messages_max == 6
    assert costs["butterfly"].messages_max <= 3


def test_dense_overlap_picks_allreduce():
    """Every rank observes the whole (small) map: the Alltoallv would send it p - 1 times."""
    npix, size = 3_000, 8
    figures = figures_of([np.arange(npix)] * size, npix)
    selection = select_strategy(figures, FRANKLIN, MANY)
    assert selection.chosen == "allreduce", selection.reason
    assert selection.modeled["allreduce"]["preprocessing_s"] == 0


def test_sparse_nearest_neighbour_overlap_picks_alltoallv():
    """Bands with thin overlaps on a big map: exchanging 40 pixels beats reducing 100,000."""
    npix, size = 100_000, 8
    selection = select_strategy(figures_of(bands(size, npix, 20), npix), FRANKLIN, MANY)
    assert selection.chosen == "alltoallv", selection.reason
    modeled = selection.modeled
    assert modeled["alltoallv"]["bytes_per_iteration"] * 100 < modeled["allreduce"]["bytes_per_iteration"]


def test_expensive_preprocessing_is_not_worth_it_for_one_realisation():
    npix, size = 100_000, 8
    figures = figures_of(bands(size, npix, 20), npix)
    slow_sift = Machine.uniform(8.15e-6, 1 / 1.65e9, "slow sift", sift_s_per_id=1e-3)
    assert select_strategy(figures, slow_sift, Workload(1, 50, 1 << 16)).chosen == "allreduce"
    assert select_strategy(figures, slow_sift, Workload(10_000, 50, 1 << 16)).chosen == "alltoallv"


def test_latency_bound_all_to_all_sharing_picks_fewer_messages():
    """A few pixels seen by every rank make everyone a neighbour: hybrid reduces them in one small Allreduce."""
    npix, size = 200_000, 16
    figures = figures_of(bands(size, npix, 5, everyone=np.arange(0, npix, npix // 8)), npix)
    assert figures.neighbours.min() == size - 1
    high_latency = Machine.uniform(1e-3, 1 / 10e9, "high latency")
    selection = select_strategy(figures, high_latency, MANY)
    assert selection.chosen in ("hybrid", "butterfly"), selection.reason
    hybrid = selection.modeled["hybrid"]
    # At this latency even the thin band overlaps go into the compact Allreduce (tau = 2: 8 + 16 x 10 pixels).
    assert hybrid["heavy_pixels"] >= 8
    assert hybrid["messages_per_iteration"] < selection.modeled["alltoallv"]["messages_per_iteration"]


def test_one_rank_needs_no_communication():
    npix = 1000
    figures = figures_of([np.arange(npix)], npix)
    costs = strategy_costs(figures, FRANKLIN)
    assert all(cost.seconds == 0 and cost.bytes_max == 0 for cost in costs.values())
    assert select_strategy(figures, FRANKLIN, MANY).chosen == "allreduce"


@pytest.mark.parametrize("size, expected", [(1, [2]), (2, [2]), (4, [2, 3, 4]), (16, [2, 3, 4, 6, 8, 12, 16])])
def test_hybrid_thresholds(size, expected):
    assert commodel.hybrid_thresholds(size).tolist() == expected


def test_allreduce_traffic_counts_buffers():
    nbytes, messages, pieces = commodel.allreduce_traffic(1000, 300, 3, 4)
    assert pieces == 4 and messages == 4 * 2 * 2
    assert nbytes == round(2 * 1000 * 3 * 3 / 4 * 8)
    assert commodel.allreduce_traffic(1000, 300, 3, 1)[:2] == (0, 0)


def test_new_strategies_cost_like_the_alltoallv_on_their_own_links():
    npix, size = 20_000, 8
    figures = figures_of(bands(size, npix, 10), npix)
    slow_neighbour = Machine(
        "test", FRANKLIN.p2p, FRANKLIN.allreduce, FRANKLIN.alltoallv, FRANKLIN.allgather,
        neighbor=commodel.LinkCost(2 * FRANKLIN.alltoallv.alpha_s, FRANKLIN.alltoallv.beta_s_per_byte),
    )
    costs = strategy_costs(figures, slow_neighbour, k=3, buffer_pixels=npix)
    for name in ("neighbor", "pairwise", "alltoallv-overlap", "neighbor-overlap"):
        assert costs[name].bytes_max == costs["alltoallv"].bytes_max and costs[name].messages_max == 2, name
    # neighbor: the Alltoallv's form with its own alpha; pairwise: the point-to-point figures.
    assert costs["neighbor"].seconds == pytest.approx(costs["alltoallv"].seconds + 2 * FRANKLIN.alltoallv.alpha_s)
    assert costs["pairwise"].seconds == pytest.approx(FRANKLIN.p2p(2, 40 * 3 * 8))
    # With nothing to hide behind an overlap variant costs its twin; it hides at most what it is given.
    assert costs["alltoallv-overlap"].seconds == costs["alltoallv"].seconds
    hidden = strategy_costs(figures, FRANKLIN, k=3, buffer_pixels=npix, hideable_s=1e-6)
    assert hidden["alltoallv-overlap"].seconds == pytest.approx(costs["alltoallv"].seconds - 1e-6)
    assert strategy_costs(figures, FRANKLIN, k=3, hideable_s=1.0)["neighbor-overlap"].seconds == 0.0
    # Ties go to the blocking twin: auto picks an overlap variant only where it hides something.
    assert select_strategy(figures, FRANKLIN, MANY).chosen not in commodel.OVERLAP_TWINS


def test_ranks_per_node_share_the_interface_and_figures_scale_by_area():
    shared = commodel.per_node(FRANKLIN, 4)
    assert shared.allreduce.beta_s_per_byte == 4 * FRANKLIN.allreduce.beta_s_per_byte
    assert shared.alltoallv.alpha_s == FRANKLIN.alltoallv.alpha_s
    figures = figures_of(bands(4, 1000, 10), 1000)
    scaled = commodel.scale_figures(figures, 3.0, 3000)
    np.testing.assert_array_equal(scaled.shared, 3 * figures.shared)
    np.testing.assert_array_equal(scaled.neighbours, figures.neighbours)
    assert scaled.npix == 3000


def test_figure6_row_compares_the_two_configurations():
    """Franklin's Figure-5 bandwidths: the Allreduce at 0.25 GB/s against the Alltoallv at 1.15 GB/s."""
    original = figures_of(bands(8, 20_000, 10), 20_000)
    optimized = figures_of(bands(2, 20_000, 10), 20_000)
    franklin = commodel.PAPER_SYSTEMS[0]
    row = commodel.figure6_row(franklin, original, optimized, buffer_pixels=20_000)
    assert row["paper_speedup"] == 8.3 and row["threads_per_rank"] == 4
    allreduce_bytes = 2 * 20_000 * 3 * 7 / 8 * 8
    assert row["allreduce_s_figure5"] == pytest.approx(6 * 8.15e-6 + allreduce_bytes / 0.25e9)
    assert row["alltoallv_s_figure5"] == pytest.approx(8.15e-6 + 40 * 3 * 8 / 1.15e9)
    # ranks x threads: 4 ranks share Franklin's node unthreaded, 1 threaded.
    assert row["speedup_per_node"] > row["speedup_table2"]
