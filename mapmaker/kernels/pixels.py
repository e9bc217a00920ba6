"""Local pixel numbering: the sorted set of pixels a rank observes and each sample's row in it.

Pure numpy on flat arrays (no MPI): the map-maker's per-rank cache
(:mod:`mapmaker.solve.local_data`) and the serial overlap model
(:mod:`mapmaker.parallel.overlap_model`) both number pixels this way.
"""
from __future__ import annotations

import numpy as np


def index_dtype(n: int) -> type[np.int32 | np.int64]:
    """int32 while ``n`` values fit, int64 beyond."""
    return np.int32 if n < 2**31 - 1 else np.int64


OBSERVED_PIXELS_BLOCK = 1 << 20  # samples per block of observed_pixels' sparse path


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by one sort: numpy 2.4's ``np.unique`` without ``return_inverse``
    hashes, then sorts the distinct values: 28x slower on 1M int32 pixel ids of 12M (measured)."""
    ordered = np.sort(values)
    if len(ordered) == 0:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def observed_pixels(pixels: np.ndarray, npix: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique pixel ids [n_local] int64 and each sample's position among them [n_samp].

    The positions are int32 (int64 beyond 2^31 local pixels), written over
    ``pixels`` when that is an int32 array (no sample-sized temporary). A
    lookup table over the whole map (5 bytes per pixel) when the map is not
    much larger than the samples -- ten times faster than sorting them.
    Otherwise (high nside, few samples per rank) block by block: the unique
    pixels of each block of samples, then of their union, then each block's
    positions by binary search (the block sorted first). That holds the
    blocks' unique ids (at most one per sample, in ``pixels``' dtype) instead
    of ``np.unique(..., return_inverse=True)``'s ~36 bytes per sample (a sort
    permutation, a sorted copy and an int64 inverse).
    """
    if npix <= 4 * len(pixels):
        seen = np.zeros(npix, dtype=bool)
        seen[pixels] = True
        local_pixels = np.flatnonzero(seen).astype(np.int64)
        del seen
        dtype = index_dtype(len(local_pixels))
        lookup = np.empty(npix, dtype=dtype)
        lookup[local_pixels] = np.arange(len(local_pixels), dtype=dtype)
        out = pixels if pixels.dtype == dtype else np.empty(len(pixels), dtype=dtype)
        step = 1 << 20
        for first in range(0, len(pixels), step):
            out[first : first + step] = lookup[pixels[first : first + step]]
        return local_pixels, out
    step = OBSERVED_PIXELS_BLOCK
    blocks = [sorted_unique(pixels[first : first + step]) for first in range(0, len(pixels), step)]
    local_pixels = sorted_unique(np.concatenate(blocks)) if blocks else np.zeros(0, dtype=pixels.dtype)
    del blocks
    dtype = index_dtype(len(local_pixels))
    out = pixels if pixels.dtype == dtype else np.empty(len(pixels), dtype=dtype)
    for first in range(0, len(pixels), step):
        block = pixels[first : first + step]
        order = np.argsort(block, kind="stable")
        # Needles in increasing order let the binary search start from the previous answer.
        out[first : first + step][order] = np.searchsorted(local_pixels, block[order])
    return local_pixels.astype(np.int64, copy=False), out
