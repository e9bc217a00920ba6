"""Distributed pixel vectors: which rank owns a shared pixel, dot products, gather, broadcast.

Each rank holds the sorted unique global ids of the pixels it observes
(``local_pixels [n_local] int64``) and, for a pixel vector, one row per local
pixel (``[n_local, k]``). After a reduction every rank holding a pixel holds
the same value for it. A shared pixel is *owned* by the lowest rank that
observes it; global sums (dot products, counts) add owned rows only, so a
shared pixel counts once. The owners come from the overlap plan when there is
one (no whole-map collective), else from one buffered ``Allreduce(MIN)``.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from types import ModuleType

import numpy as np
from mpi4py import MPI

from mapmaker.kernels import vectors as numpy_vectors

_GATHER_TAG = 77  # point-to-point messages of gather_owned_rows


def spread_choice(observers: np.ndarray, rank: int, pixels: np.ndarray) -> np.ndarray:
    """[n] bool: whether ``rank`` holds each pixel of :attr:`DistributedPixels.spread_owned`.

    observers [n, words] uint64: the bit set of the ranks observing each pixel (rank r is bit r % 64 of
    word r // 64), ``rank`` among them; pixels [n] int64 global ids. Pixel p goes to its (p mod m)-th
    observer of m, counted from the lowest rank.
    """
    word, bit = divmod(rank, 64)
    below = np.zeros(observers.shape[1], dtype=np.uint64)  # the bits of the ranks below ``rank``
    below[:word] = np.iinfo(np.uint64).max
    below[word] = (np.uint64(1) << np.uint64(bit)) - np.uint64(1)
    count = np.bitwise_count(observers).sum(axis=1, dtype=np.int64)
    position = np.bitwise_count(observers & below).sum(axis=1, dtype=np.int64)
    return position == pixels % count


class DistributedPixels:
    """The pixel distribution of one solve.

    comm: communicator of the solve; local_pixels [n_local] int64 sorted
    unique; npix: pixels of the full map; buffer_pixels: piece size of the
    whole-map collectives used at set-up and for broadcasts (bounds memory);
    owner [n_local] int: the lowest rank observing each local pixel, when
    known (from the overlap plan); computed here otherwise. ``vectors``: the
    kernels of the dot products (the run's ``Kernels.vectors``; default the
    numpy reference, :mod:`mapmaker.kernels.vectors`).
    """

    def __init__(
        self,
        comm: MPI.Comm,
        local_pixels: np.ndarray,
        npix: int,
        buffer_pixels: int = 1 << 16,
        owner: np.ndarray | None = None,
        vectors: ModuleType | None = None,
    ):
        self.comm = comm
        self.vectors = vectors or numpy_vectors
        self.rank = comm.Get_rank()
        self.local_pixels = np.asarray(local_pixels, dtype=np.int64)
        if np.any(np.diff(self.local_pixels) <= 0):
            raise ValueError("local_pixels must be sorted and unique")
        self.npix = int(npix)
        self.buffer_pixels = int(max(1, min(buffer_pixels, npix)))
        self.n_local = len(self.local_pixels)
        if owner is not None and len(owner) != self.n_local:
            raise ValueError(f"owner has {len(owner)} entries for {self.n_local} local pixels")
        self.owned = (self._lowest_observer() if owner is None else np.asarray(owner)) == self.rank
        self.n_owned = int(self.owned.sum())
        # 0/1 weights make the owned-only sums one pass without copies; None when every pixel is owned.
        self._owned_weight = None if self.n_owned == self.n_local else self.owned.astype(np.float64)
        self.n_observed = int(comm.allreduce(self.n_owned, op=MPI.SUM))

    def _pieces(self):
        """(global start, global end, local first, local end) of each whole-map piece."""
        starts = np.append(np.arange(0, self.npix, self.buffer_pixels), self.npix)
        bounds = np.searchsorted(self.local_pixels, starts)
        for i in range(len(starts) - 1):
            yield int(starts[i]), int(starts[i + 1]), int(bounds[i]), int(bounds[i + 1])

    def _lowest_observer(self) -> np.ndarray:
        """Lowest rank observing each local pixel, [n_local] int32 (buffered Allreduce MIN, once)."""
        size = self.comm.Get_size()
        owner = np.empty(self.n_local, dtype=np.int32)
        buffer = np.empty(self.buffer_pixels, dtype=np.int32)
        for start, end, first, last in self._pieces():
            piece = buffer[: end - start]
            piece.fill(size)
            piece[self.local_pixels[first:last] - start] = self.rank
            self.comm.Allreduce(MPI.IN_PLACE, piece, op=MPI.MIN)
            owner[first:last] = piece[self.local_pixels[first:last] - start]
        return owner

    @cached_property
    def spread_owned(self) -> np.ndarray:
        """[n_local] bool: a partition of the observed pixels like :attr:`owned` (each on exactly one of the
        ranks observing it), spread over those ranks instead of all given to the lowest.

        Pixel p goes to its (p mod m)-th observer of m. Where every rank sees nearly the whole sky (a
        satellite split by time), :attr:`owned` puts almost every pixel on rank 0; this gives each rank
        about its share. For per-pixel state read every iteration (the two-level preconditioner's
        ``A Z``); the dot products and the gather keep the owned rows. Collective, once (cached): one buffered
        ``Allreduce(BOR)`` of the observers' bit sets, ceil(ranks / 64) 8-byte words a pixel.
        """
        size = self.comm.Get_size()
        if size == 1:
            return np.ones(self.n_local, dtype=bool)
        word, bit = divmod(self.rank, 64)
        spread = np.empty(self.n_local, dtype=bool)
        buffer = np.empty((self.buffer_pixels, (size + 63) // 64), dtype=np.uint64)
        for start, end, first, last in self._pieces():
            piece = buffer[: end - start]
            piece.fill(0)
            at = self.local_pixels[first:last] - start
            piece[at, word] = np.uint64(1) << np.uint64(bit)
            self.comm.Allreduce(MPI.IN_PLACE, piece, op=MPI.BOR)
            spread[first:last] = spread_choice(piece[at], self.rank, self.local_pixels[first:last])
        return spread

    def local_index(self, pixels: np.ndarray) -> np.ndarray:
        """Positions of global pixel ids (all present locally) in ``local_pixels``, int64."""
        return np.searchsorted(self.local_pixels, pixels).astype(np.int64, copy=False)

    def _global_sum(self, local_value: float) -> float:
        return self._global_sums(local_value)[0]

    def _global_sums(self, *local_values: float) -> tuple[float, ...]:
        """Sums over all ranks of a few numbers: one ``Allreduce``."""
        total = np.array(local_values, dtype=np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
        return tuple(float(value) for value in total)

    def sum_owned(self, values: np.ndarray) -> float:
        """Sum over all ranks of ``values`` [n_local, ...] restricted to owned pixels."""
        return self._global_sum(np.sum(values[self.owned]))

    def dot(self, a: np.ndarray, b: np.ndarray) -> float:
        """Global dot product of two consistent pixel vectors [n_local, k], each pixel counted once."""
        return self._global_sum(self.vectors.dot(a, b, self._owned_weight))

    def dot_and_norm(self, r: np.ndarray, z: np.ndarray) -> tuple[float, float]:
        """``(dot(r, z), dot(r, r))`` with one pass over ``r`` and one ``Allreduce`` (PCG's two per iteration)."""
        along, norm = self._global_sums(*self.vectors.dot_and_norm(r, z, self._owned_weight))
        return along, norm

    def gather_owned_rows(
        self,
        values: np.ndarray,
        receive: Callable[[np.ndarray, np.ndarray], None] | None,
        root: int = 0,
    ) -> None:
        """Collective: hand every owned pixel's row to ``receive(ids, rows)`` on ``root``, a piece at a time.

        values [n_local, k] float64, consistent across ranks. On root,
        ``receive`` gets the global ids [m] int64 and rows [m, k] float64 of at
        most ``buffer_pixels`` owned pixels per call, every observed pixel
        exactly once (root's own first, then each rank's in rank order); it is
        ignored elsewhere. Root never holds more than one piece of another
        rank's rows, so whatever it builds from them (typed full-sky arrays,
        say) is its only map-sized memory.
        """
        values = np.asarray(values, dtype=np.float64)
        k = values.shape[1]
        owned = np.flatnonzero(self.owned)
        size = self.comm.Get_size()
        if self.rank != root:
            self.comm.send(len(owned), dest=root, tag=_GATHER_TAG)
            for first in range(0, len(owned), self.buffer_pixels):
                rows = owned[first : first + self.buffer_pixels]
                self.comm.Send(np.ascontiguousarray(self.local_pixels[rows]), dest=root, tag=_GATHER_TAG)
                self.comm.Send(np.ascontiguousarray(values[rows]), dest=root, tag=_GATHER_TAG)
            return
        if receive is None:
            raise TypeError("gather_owned_rows: root needs a receive callable")
        for first in range(0, len(owned), self.buffer_pixels):
            rows = owned[first : first + self.buffer_pixels]
            receive(self.local_pixels[rows], values[rows])
        ids = np.empty(self.buffer_pixels, dtype=np.int64)
        rows = np.empty((self.buffer_pixels, k), dtype=np.float64)
        for source in range(size):
            if source == root:
                continue
            count = self.comm.recv(source=source, tag=_GATHER_TAG)
            for first in range(0, count, self.buffer_pixels):
                n = min(self.buffer_pixels, count - first)
                self.comm.Recv(ids[:n], source=source, tag=_GATHER_TAG)
                self.comm.Recv(rows[:n], source=source, tag=_GATHER_TAG)
                receive(ids[:n], rows[:n])

    def broadcast_from_root(self, full: np.ndarray | None, k: int, root: int = 0) -> np.ndarray:
        """This rank's rows [n_local, k] of a full map ``full`` [npix, k] held by ``root``.

        The map travels in pieces of ``buffer_pixels`` pixels (Bcast), so no
        rank other than root ever holds more than one piece of it.
        """
        if self.rank == root and full is None:
            raise TypeError("broadcast_from_root: root needs the full map")
        local = np.empty((self.n_local, k), dtype=np.float64)
        buffer = np.empty((self.buffer_pixels, k), dtype=np.float64)
        for start, end, first, last in self._pieces():
            piece = buffer[: end - start]
            if full is not None and self.rank == root:
                piece[:] = full[start:end]
            self.comm.Bcast(piece, root=root)
            local[first:last] = piece[self.local_pixels[first:last] - start]
        return local
