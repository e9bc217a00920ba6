"""The per-iteration pixel reduction, behind one interface.

Every rank holds values for the pixels it observes (its sorted
``local_pixels``); a reduction replaces each value by its sum over all the
ranks that observe that pixel. Strategies differ only in how the sums travel:

* ``allreduce`` -- the paper's baseline (section 3.2): the whole map in
  buffers of ``n_b`` pixels, each buffer filled with the local values (zero
  elsewhere) and summed with one ``MPI_Allreduce``.
* ``alltoallv``, ``butterfly`` -- the next issue: plan-driven exchange of
  shared pixels only. They plug in as subclasses of :class:`PixelReduction`
  registered in ``STRATEGIES``; ``make_reduction`` passes them the overlap
  ``plan``.
* ``auto`` -- resolves to ``allreduce`` until an alpha-beta model exists to
  choose by; the result records the requested and the resolved name.

Counters are kept per call so that the result can report bytes and messages
per rank per iteration; how bytes are counted is stated by ``bytes_counted``.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI


class ReductionUnavailable(ValueError):
    """A reduction strategy that this version does not implement (yet)."""


class PixelReduction(ABC):
    """Sum of local pixel values over the ranks that share each pixel, in place.

    comm: the communicator every rank of the solve belongs to;
    local_pixels [n_local] int64: sorted unique global pixel ids of this rank.
    """

    name: ClassVar[str]
    bytes_counted: ClassVar[str]

    def __init__(self, comm: MPI.Comm, local_pixels: np.ndarray):
        self.comm = comm
        self.local_pixels = np.asarray(local_pixels, dtype=np.int64)
        self.calls = 0
        self.bytes_sent = 0  # by this rank in the last call
        self.messages_sent = 0  # by this rank in the last call
        self.total_bytes = 0
        self.total_messages = 0

    def reduce(self, local_values: np.ndarray) -> np.ndarray:
        """Sum ``local_values [n_local, k]`` float64 over ranks, in place; returns it.

        Collective: every rank calls it with the same k.
        """
        if local_values.ndim != 2 or len(local_values) != len(self.local_pixels):
            raise ValueError(f"expected local values [{len(self.local_pixels)}, k], got {local_values.shape}")
        if local_values.dtype != np.float64 or not local_values.flags.c_contiguous:
            raise ValueError("local values must be a C-contiguous float64 array")
        self.bytes_sent, self.messages_sent = self._reduce(local_values)
        self.calls += 1
        self.total_bytes += self.bytes_sent
        self.total_messages += self.messages_sent
        return local_values

    @abstractmethod
    def _reduce(self, local_values: np.ndarray) -> tuple[int, int]:
        """Do the reduction in place; return (bytes, messages) this rank sent."""


class AllreduceReduction(PixelReduction):
    """The buffered Allreduce over the whole map (the paper's baseline).

    For each piece of ``buffer_pixels`` global pixels: fill a buffer with
    this rank's values for the pixels it holds in the piece and zero
    elsewhere, ``Allreduce(SUM)`` it in place, copy the sums back out.
    """

    name = "allreduce"
    bytes_counted = (
        "Rabenseifner model of MPI_Allreduce: per buffer of n elements on p ranks each rank sends "
        "2 n (p - 1) / p * 8 bytes in 2 ceil(log2 p) messages; summed over the ceil(npix / n_b) buffers"
    )

    def __init__(self, comm: MPI.Comm, local_pixels: np.ndarray, npix: int, buffer_pixels: int):
        super().__init__(comm, local_pixels)
        self.npix = int(npix)
        self.buffer_pixels = int(min(buffer_pixels, npix))
        self._piece_starts = np.append(np.arange(0, self.npix, self.buffer_pixels), self.npix)
        # Local pixels of piece i are local_pixels[bounds[i]:bounds[i + 1]].
        self._bounds = np.searchsorted(self.local_pixels, self._piece_starts)
        self._buffer = np.zeros(0)

    def _reduce(self, local_values: np.ndarray) -> tuple[int, int]:
        k = local_values.shape[1]
        if self._buffer.size != self.buffer_pixels * k:
            self._buffer = np.empty(self.buffer_pixels * k, dtype=np.float64)
        size = self.comm.Get_size()
        sent_bytes = 0.0
        messages = 0
        for i in range(len(self._piece_starts) - 1):
            start, end = int(self._piece_starts[i]), int(self._piece_starts[i + 1])
            first, last = self._bounds[i], self._bounds[i + 1]
            buffer = self._buffer[: (end - start) * k].reshape(end - start, k)
            offsets = self.local_pixels[first:last] - start
            buffer.fill(0.0)
            buffer[offsets] = local_values[first:last]
            self.comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
            local_values[first:last] = buffer[offsets]
            if size > 1:
                sent_bytes += 2.0 * buffer.size * (size - 1) / size * buffer.itemsize
                messages += 2 * math.ceil(math.log2(size))
        return int(round(sent_bytes)), messages


STRATEGIES: dict[str, type[PixelReduction]] = {"allreduce": AllreduceReduction}
KNOWN_STRATEGIES = ("allreduce", "alltoallv", "butterfly")


def resolve_strategy(requested: str) -> str:
    """The strategy a request runs with: ``auto`` -> ``allreduce`` (no cost model yet).

    Raises :class:`ReductionUnavailable` for a known name this version lacks.
    """
    if requested == "auto":
        return "allreduce"
    if requested not in KNOWN_STRATEGIES:
        raise ReductionUnavailable(f"unknown reduction {requested!r}; choose one of auto, {', '.join(KNOWN_STRATEGIES)}")
    if requested not in STRATEGIES:
        raise ReductionUnavailable(
            f"reduction {requested!r} is not implemented in this version; use 'allreduce' or 'auto'"
        )
    return requested


def make_reduction(
    name: str,
    comm: MPI.Comm,
    local_pixels: np.ndarray,
    *,
    npix: int,
    buffer_pixels: int,
    plan: Any = None,
) -> PixelReduction:
    """Build the reduction ``name`` (``auto`` resolved by :func:`resolve_strategy`) for this rank's pixels.

    ``plan`` is the overlap plan plan-driven strategies will need; the
    Allreduce baseline ignores it.
    """
    strategy = resolve_strategy(name)
    if strategy == "allreduce":
        return AllreduceReduction(comm, local_pixels, npix, buffer_pixels)
    return STRATEGIES[strategy](comm, local_pixels, npix=npix, buffer_pixels=buffer_pixels, plan=plan)  # type: ignore[call-arg]
