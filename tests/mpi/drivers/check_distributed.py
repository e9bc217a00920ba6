"""Run under mpiexec: checks PixelReduction (allreduce) and DistributedPixels on real ranks.

Each rank's pixel set is drawn from a generator seeded by the rank, so every
rank can rebuild every other rank's set and compute the expected sums. Rank 2
(when present) observes nothing. Exits non-zero (and aborts all ranks) on the
first failed check.
"""
import math

import numpy as np
import pytest
from mpi4py import MPI

from mapmaker.kernels import implementation
from mapmaker.parallel.distributed import DistributedPixels
from mapmaker.parallel.reduction import make_reduction

NPIX = 1000


def pixels_of(rank: int) -> np.ndarray:
    if rank == 2:
        return np.zeros(0, dtype=np.int64)
    chosen = np.random.default_rng(rank).choice(NPIX, size=300, replace=False)
    return np.unique(np.concatenate([chosen, [0, 999, 500]])).astype(np.int64)


def values_of(rank: int, pixels: np.ndarray, k: int) -> np.ndarray:
    return pixels[:, None] * 10.0 + rank + 0.5 * np.arange(k)[None, :]


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    everyone = [pixels_of(r) for r in range(size)]
    mine = everyone[rank]
    union = np.unique(np.concatenate(everyone))

    for buffer_pixels in (NPIX, 77):
        for k in (1, 3, 6):
            reduction = make_reduction("auto", comm, mine, npix=NPIX, buffer_pixels=buffer_pixels)
            assert reduction.name == "allreduce"
            values = np.ascontiguousarray(values_of(rank, mine, k))
            reduction.reduce(values)
            expected = np.zeros((len(mine), k))
            for other, theirs in enumerate(everyone):
                shared = np.isin(mine, theirs)
                expected[shared] += values_of(other, mine[shared], k)
            np.testing.assert_allclose(values, expected, rtol=1e-14)
            # Rabenseifner volume and messages, summed over the buffers.
            pieces = [min(buffer_pixels, NPIX - s) for s in range(0, NPIX, buffer_pixels)]
            expected_bytes = sum(round(2 * n * k * (size - 1) / size * 8) for n in pieces) if size > 1 else 0
            assert abs(reduction.bytes_sent - expected_bytes) <= len(pieces), (reduction.bytes_sent, expected_bytes)
            assert reduction.messages_sent == (len(pieces) * 2 * math.ceil(math.log2(size)) if size > 1 else 0)
            assert reduction.calls == 1

    for buffer_pixels in (NPIX, 64):
        pixels = DistributedPixels(comm, mine, NPIX, buffer_pixels)
        assert pixels.n_observed == len(union)
        lowest = {int(p): min(r for r in range(size) if p in set(everyone[r].tolist())) for p in mine}
        assert all(pixels.owned[i] == (lowest[int(p)] == rank) for i, p in enumerate(mine))
        # Spread: pixel p on the (p mod m)-th of its m observers, so the partition holds each pixel once.
        observers = {int(p): [r for r in range(size) if p in set(everyone[r].tolist())] for p in mine}
        assert all(pixels.spread_owned[i] == (observers[int(p)][int(p) % len(observers[int(p)])] == rank)
                   for i, p in enumerate(mine))
        held = comm.allgather(mine[pixels.spread_owned])
        np.testing.assert_array_equal(np.sort(np.concatenate(held)), union)  # every pixel, each once
        if size > 1 and rank != 2:  # shared out: this rank holds more than its lowest-observer share
            assert pixels.spread_owned.sum() > pixels.owned.sum() or rank == 0, (rank, pixels.spread_owned.sum())
        ones = np.ones((len(mine), 3))
        assert pixels.dot(ones, ones) == 3 * len(union)  # shared pixels count once
        # PCG's (r, z) and (r, r) in one pass and one Allreduce, with either kernel set: each pixel once.
        r, z = np.column_stack([mine * 1.0, -mine * 0.5, mine % 7]), np.column_stack([mine % 5, mine * 2.0, -1.0 + 0 * mine])
        every = union.astype(np.float64)
        expected = (float(np.sum(every * (every % 5) - every * every - every % 7)),
                    float(np.sum(every**2 + 0.25 * every**2 + (every % 7) ** 2)))
        for kernels in ("numpy", "fast"):
            with_kernels = DistributedPixels(comm, mine, NPIX, buffer_pixels, vectors=implementation.get(kernels).vectors)
            along, norm = with_kernels.dot_and_norm(r, z)
            assert along == pytest.approx(expected[0], rel=1e-13) and norm == pytest.approx(expected[1], rel=1e-13)
            assert (along, norm) == pytest.approx((with_kernels.dot(r, z), with_kernels.dot(r, r)), rel=1e-13)
        assert pixels.sum_owned(np.ones(len(mine))) == len(union)

        # Gather: every rank holds the consistent (reduced) value pixel * 2; root sees each
        # observed pixel exactly once, in pieces of at most buffer_pixels rows.
        rows = np.column_stack([mine * 2.0, -mine * 1.0])
        received = []

        def receive(ids, piece, received=received, buffer_pixels=buffer_pixels):
            assert len(ids) == len(piece) <= buffer_pixels
            received.append((ids.copy(), piece.copy()))

        pixels.gather_owned_rows(rows, receive)
        if rank == 0:
            ids = np.concatenate([r[0] for r in received])
            gathered = np.concatenate([r[1] for r in received])
            np.testing.assert_array_equal(np.sort(ids), union)
            np.testing.assert_array_equal(gathered, np.column_stack([ids * 2.0, -ids * 1.0]))
        else:
            assert received == []

        # Broadcast: each rank receives its rows of root's full map.
        source = np.arange(NPIX * 3, dtype=np.float64).reshape(NPIX, 3) if rank == 0 else None
        local = pixels.broadcast_from_root(source, 3)
        np.testing.assert_array_equal(local, np.arange(NPIX * 3, dtype=np.float64).reshape(NPIX, 3)[mine])

    comm.Barrier()
    if rank == 0:
        print(f"distributed checks passed on {size} ranks")


main()
