"""Pixel sets for the overlap tests: random, with the local structure of a scan."""
import numpy as np


def random_sets(size: int, npix: int, seed: int, empty: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Pixel sets with local structure (a window each) plus a few pixels everyone sees."""
    rng = np.random.default_rng(seed)
    sets = []
    for rank in range(size):
        if rank in empty:
            sets.append(np.zeros(0, dtype=np.int64))
            continue
        centre = rng.integers(0, npix)
        window = (centre + rng.integers(-npix // 5, npix // 5, size=npix // 6)) % npix
        scattered = rng.choice(npix, size=npix // 40, replace=False)
        sets.append(np.unique(np.concatenate([window, scattered, [0, npix - 1]])).astype(np.int64))
    return sets
