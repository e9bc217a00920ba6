"""The spread partition of shared pixels (``DistributedPixels.spread_owned``): each pixel on one observer."""
import numpy as np

from mapmaker.parallel.distributed import spread_choice


def bit_sets(observer_lists: list[list[int]], words: int) -> np.ndarray:
    """[n, words] uint64 bit sets of the ranks in each list."""
    sets = np.zeros((len(observer_lists), words), dtype=np.uint64)
    for i, ranks in enumerate(observer_lists):
        for r in ranks:
            sets[i, r // 64] |= np.uint64(1) << np.uint64(r % 64)
    return sets


def test_each_pixel_goes_to_its_p_mod_m_th_observer_across_words():
    # Ranks on both sides of the 64-bit word boundary; 130 ranks take three words.
    observer_lists = [[0, 70, 129], [5, 63, 64, 65], [3], [64, 128], list(range(0, 130, 7))]
    pixels = np.array([11, 6, 1000, 7, 12_345], dtype=np.int64)
    sets = bit_sets(observer_lists, words=3)
    holders = np.zeros(len(pixels), dtype=int)
    for rank in sorted({r for ranks in observer_lists for r in ranks}):
        mine = np.array([rank in ranks for ranks in observer_lists])
        chosen = spread_choice(sets[mine], rank, pixels[mine])
        holders[np.flatnonzero(mine)[chosen]] += 1
        for pixel, ranks, held in zip(pixels[mine], [o for o, m in zip(observer_lists, mine) if m], chosen):
            assert held == (ranks[int(pixel) % len(ranks)] == rank), (pixel, ranks, rank)
    assert holders.tolist() == [1] * len(pixels)  # a partition: every pixel held exactly once


def test_a_sky_every_rank_sees_is_shared_out_evenly():
    ranks, pixels = 4, np.arange(10_000, dtype=np.int64)
    sets = bit_sets([list(range(ranks))], words=1).repeat(len(pixels), axis=0)
    counts = [int(spread_choice(sets, rank, pixels).sum()) for rank in range(ranks)]
    assert counts == [2_500] * ranks
