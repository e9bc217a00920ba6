"""The per-iteration pixel reduction, behind one interface.

Every rank holds values for the pixels it observes (its sorted
``local_pixels``); a reduction replaces each value by its sum over all the
ranks that observe that pixel. Strategies differ only in how the sums travel:

* ``allreduce`` -- the paper's baseline (section 3.2): the whole map in
  buffers of ``n_b`` pixels, each buffer filled with the local values (zero
  elsewhere) and summed with one ``MPI_Allreduce``.
* ``alltoallv`` -- the paper's method (section 3.3), driven by the overlap
  plan: pack the values of the pixels shared with each rank, one
  ``MPI_Alltoallv``, add what arrives (self excluded).
* ``butterfly`` -- sparse recursive doubling in log2 p' exchanges, any p
  (ranks above the largest power of two p' fold into partners); each step
  carries only the pixels the partner's remaining subtree observes
  (:func:`mapmaker.parallel.overlap.butterfly_schedule`).
* ``hybrid`` -- the paper's suggested improvement: pixels observed by at
  least tau ranks are summed by one compact buffered Allreduce, the rest by
  the Alltoallv; tau chosen by the alpha-beta model (:mod:`mapmaker.parallel.commodel`).
* ``neighbor`` -- the Alltoallv's exchange as an MPI-3 neighbourhood
  collective over a distributed graph of each rank's neighbours
  (``Neighbor_alltoallv``; persistent, MPI-4 ``Neighbor_alltoallv_init``,
  where the library offers it).
* ``pairwise`` -- the same blocks by ``Sendrecv`` in XOR order (seed 002).
* ``alltoallv-overlap``, ``neighbor-overlap`` -- the two with the exchange
  started non-blocking (``Ialltoallv``, ``Ineighbor_alltoallv`` or the
  persistent ``Start``) once the shared rows are final, and completed after
  the caller has finished the rows only this rank observes
  (:meth:`OverlapMixin.start` / :meth:`OverlapMixin.finish`).
* ``auto`` -- the strategy with the lowest modeled campaign cost for this
  plan (:func:`mapmaker.parallel.commodel.select_strategy`); one rank: ``allreduce``.

Counters are kept per call so that the result can report bytes and messages
per rank per iteration; how bytes are counted is stated by ``bytes_counted``:
exactly the bytes this rank hands to MPI for the plan-based strategies, the
Rabenseifner model for the Allreduce.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from types import ModuleType
from typing import ClassVar, Protocol, cast

import numpy as np
from mpi4py import MPI

from mapmaker.kernels import exchange as numpy_exchange
from mapmaker.parallel import commodel
from mapmaker.parallel.overlap import OverlapPlan, butterfly_schedule
from schemas.spec import STRATEGY_NAMES

VALUE_BYTES = 8
# MPI-4 persistent neighbourhood collectives: mpi4py >= 4 built against an MPI-4 library (MPICH >= 4.0).
PERSISTENT_NEIGHBOR = hasattr(MPI.Topocomm, "Neighbor_alltoallv_init") and MPI.Get_version() >= (4, 0)


def flat_rows(rows: np.ndarray, k: int) -> np.ndarray:
    """Positions in a C-contiguous [n, k] array, flattened, of the given rows: [len(rows) * k] int64.

    1-D ``np.take`` / ``np.put`` / ``bincount`` on these are several times
    faster than 2-D fancy indexing of rows.
    """
    return (np.asarray(rows, dtype=np.int64)[:, None] * k + np.arange(k, dtype=np.int64)[None, :]).reshape(-1)


class FlatCache(dict):
    """Flat positions per k, computed on first use: ``cache(k, name, rows)``.

    Kept only for the PCG's k = 3 (every iteration): other k (the 12 columns of the hit and
    preconditioner blocks, reduced once) are computed and dropped, 8 k bytes per shared pixel that
    would otherwise stay for the whole solve (~300 bytes per local pixel for the butterfly at k = 12).
    """

    CACHED_K = 3

    def __call__(self, k: int, name: str, rows: np.ndarray) -> np.ndarray:
        if k != self.CACHED_K:
            return flat_rows(rows, k)
        key = (k, name)
        if key not in self:
            self[key] = flat_rows(rows, k)
        return self[key]


class ReductionUnavailable(ValueError):
    """A reduction strategy that this version does not implement (yet)."""


class PixelReduction(ABC):
    """Sum of local pixel values over the ranks that share each pixel, in place.

    comm: the communicator every rank of the solve belongs to;
    local_pixels [n_local] int64: sorted unique global pixel ids of this rank.
    """

    name: ClassVar[str]
    bytes_counted: ClassVar[str]
    selection: commodel.Selection | None = None  # when chosen by auto (or tau by the model, for hybrid)
    details: dict[str, float] | None = None

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
        self._check(local_values)
        self._count(*self._reduce(local_values))
        return local_values

    def _check(self, local_values: np.ndarray) -> None:
        if local_values.ndim != 2 or len(local_values) != len(self.local_pixels):
            raise ValueError(f"expected local values [{len(self.local_pixels)}, k], got {local_values.shape}")
        if local_values.dtype != np.float64 or not local_values.flags.c_contiguous:
            raise ValueError("local values must be a C-contiguous float64 array")

    def _count(self, nbytes: int, messages: int) -> None:
        self.bytes_sent, self.messages_sent = nbytes, messages
        self.calls += 1
        self.total_bytes += nbytes
        self.total_messages += messages

    # Overlap variants split reduce() into start() and finish(); the blocking strategies do not.
    overlaps: ClassVar[bool] = False

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
        self.buffer_pixels = int(max(1, min(buffer_pixels, npix)))
        self._piece_starts = np.append(np.arange(0, self.npix, self.buffer_pixels), self.npix)
        # Local pixels of piece i are local_pixels[bounds[i]:bounds[i + 1]].
        self._bounds = np.searchsorted(self.local_pixels, self._piece_starts)
        self._buffer = np.zeros(0)
        self._flat = FlatCache()

    def _reduce(self, local_values: np.ndarray) -> tuple[int, int]:
        size = self.comm.Get_size()
        if size == 1:  # the sum over one rank is its own values: no buffer passes (8 ms a call at nside 256)
            return 0, 0
        k = local_values.shape[1]
        if self._buffer.size != self.buffer_pixels * k:
            self._buffer = np.empty(self.buffer_pixels * k, dtype=np.float64)
            self._flat = FlatCache()
        values = local_values.reshape(-1)
        sent_bytes = 0.0
        messages = 0
        for i in range(len(self._piece_starts) - 1):
            start, end = int(self._piece_starts[i]), int(self._piece_starts[i + 1])
            first, last = self._bounds[i], self._bounds[i + 1]
            buffer = self._buffer[: (end - start) * k]
            offsets = self._flat(k, f"piece{i}", self.local_pixels[first:last] - start)
            buffer.fill(0.0)
            np.put(buffer, offsets, values[first * k : last * k])
            self.comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
            values[first * k : last * k] = np.take(buffer, offsets)
            if size > 1:
                sent_bytes += 2.0 * buffer.size * (size - 1) / size * buffer.itemsize
                messages += 2 * math.ceil(math.log2(size))
        return round(sent_bytes), messages


MAX_ELEMENTS = (1 << 31) - 1  # doubles per MPI count or displacement: 32-bit int


class AlltoallvReduction(PixelReduction):
    """The paper's sparse reduction: one ``MPI_Alltoallv`` of the shared pixels only (section 3.3).

    For each neighbour j (ascending), the values of the pixels shared with j
    (ascending) are packed into one block; the same pixels come back from j
    in the same order and are added to the values as they were before the
    exchange, block after block (``exchange``: the kernels that pack and add
    the rows, :mod:`mapmaker.kernels.exchange` or its compiled twin, the run's
    ``Kernels.exchange``). ``exchanged`` [n_local] bool restricts the exchange to some
    pixels (the light ones of ``hybrid``): multiplicity is a property of the
    pixel, so both ends of a pair agree. When a block would exceed
    ``max_elements`` doubles (32-bit counts and displacements) the exchange
    runs in rounds of at most that many elements per rank.
    """

    name = "alltoallv"
    bytes_counted = (
        "exact: 8 k bytes per shared pixel value this rank passes to MPI_Alltoallv (self excluded); "
        "messages: the non-empty blocks it sends (one per neighbour and round)"
    )

    def __init__(self, comm: MPI.Comm, local_pixels: np.ndarray, plan: OverlapPlan, *, exchanged: np.ndarray | None = None,
                 max_elements: int = MAX_ELEMENTS, exchange: ModuleType | None = None):
        super().__init__(comm, local_pixels)
        self.exchange = exchange or numpy_exchange
        size = comm.Get_size()
        # 1. each neighbour's rows, in rank order: the send (and receive) layout.
        rows, counts = [], np.zeros(size, dtype=np.int64)
        for n, other in enumerate(plan.neighbours.tolist()):
            shared = plan.shared_with(n).astype(np.int64)
            if exchanged is not None:
                shared = shared[exchanged[shared]]
            rows.append(shared)
            counts[other] = len(shared)
        self.index = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        self.counts = counts
        self.offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        # 2. rounds: every rank must call Alltoallv the same number of times.
        self.max_elements = int(max_elements)
        peers = int(np.count_nonzero(counts))
        self._max_peers = int(comm.allreduce(peers, op=MPI.MAX))
        self._max_rows = int(comm.allreduce(int(counts.max()) if size else 0, op=MPI.MAX))

    def _reduce(self, local_values: np.ndarray) -> tuple[int, int]:
        if self._max_rows == 0:
            return 0, 0
        _, received, messages = self._start(local_values)
        self._wait()
        self._add(local_values, received)
        return len(self.index) * local_values.shape[1] * VALUE_BYTES, messages

    def _rounds(self, k: int) -> tuple[int, int]:
        rows_per_round = max(1, self.max_elements // (k * max(1, self._max_peers)))
        return rows_per_round, -(-self._max_rows // rows_per_round)

    def _start(self, local_values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Pack the shared rows and start their exchange; returns (packed, received, messages).

        One round: the exchange is posted by :meth:`_post` (non-blocking in
        the overlap variants) and completed by :meth:`_wait`. Several rounds
        (blocks above ``max_elements`` doubles) run blocking here.
        """
        k = local_values.shape[1]
        packed = self.exchange.gather_rows(local_values, self.index, np.empty((len(self.index), k)))
        received = np.empty_like(packed)
        rows_per_round, rounds = self._rounds(k)
        if rounds == 1:
            self._post(packed, received, self.counts, self.offsets, k)
            return packed, received, int(np.count_nonzero(self.counts))
        messages = 0
        for r in range(rounds):
            counts = np.clip(self.counts - r * rows_per_round, 0, rows_per_round)
            messages += int(np.count_nonzero(counts))
            displacements = np.concatenate([[0], np.cumsum(counts)[:-1]])
            # the r-th slice of every neighbour's block
            starts = self.offsets + r * rows_per_round
            positions = np.repeat(starts - displacements, counts) + np.arange(int(counts.sum()))
            recv = np.empty((int(counts.sum()), k))
            self._post(packed[positions], recv, counts, displacements, k, blocking=True)
            received[positions] = recv
        return packed, received, messages

    def _post(self, send: np.ndarray, recv: np.ndarray, counts: np.ndarray, displacements: np.ndarray, k: int,
              blocking: bool = False) -> None:
        """Exchange blocks of ``counts[j]`` rows with every rank j (rows of k doubles)."""
        self.comm.Alltoallv(
            [send, (counts * k).astype(np.int32), (displacements * k).astype(np.int32), MPI.DOUBLE],
            [recv, (counts * k).astype(np.int32), (displacements * k).astype(np.int32), MPI.DOUBLE],
        )

    def _wait(self) -> None:
        """Complete what :meth:`_post` started (nothing for the blocking collective)."""

    def _add(self, local_values: np.ndarray, received: np.ndarray) -> None:
        """Add every received row to its local pixel, in the order received (neighbour by neighbour)."""
        if len(received):
            self.exchange.add_rows(local_values, self.index, received)


class NeighborReduction(AlltoallvReduction):
    """The Alltoallv's exchange as an MPI-3 neighbourhood collective (Hoefler's sparse collectives, paper 3.3).

    A distributed graph topology (``Create_dist_graph_adjacent``) joins each
    rank to the ranks it shares pixels with (the plan's ``neighbours``, the
    same list both ways: sharing is symmetric), with ``reorder=True`` so
    that the library may renumber ranks to place neighbours close (MPICH
    keeps the numbering). ``Neighbor_alltoallv`` then takes counts for the
    neighbours only: O(neighbours) set-up per call instead of O(p). Blocks
    follow the order the neighbours were given in, whatever the renumbering.
    Persistent (MPI-4 ``Neighbor_alltoallv_init``, bound once per k to fixed
    buffers) when the library offers it and one round suffices; ``mode``
    says which ran.
    """

    name = "neighbor"
    _request: MPI.Request | None  # the started exchange, between _start and _wait
    bytes_counted = (
        "exact: 8 k bytes per shared pixel value this rank passes to MPI_Neighbor_alltoallv (the Alltoallv's "
        "bytes); messages: the non-empty blocks (one per neighbour and round)"
    )

    def __init__(self, comm: MPI.Comm, local_pixels: np.ndarray, plan: OverlapPlan, *, max_elements: int = MAX_ELEMENTS,
                 persistent: bool = True, exchange: ModuleType | None = None):
        super().__init__(comm, local_pixels, plan, max_elements=max_elements, exchange=exchange)
        self.neighbours = plan.neighbours.astype(np.int64)
        listed = self.neighbours.tolist()
        # a graph topology is built on an intracommunicator (COMM_WORLD or a split of it): Comm's stub lacks it
        self.graph = cast(MPI.Intracomm, comm).Create_dist_graph_adjacent(listed, listed, reorder=True)
        self.persistent = bool(persistent and PERSISTENT_NEIGHBOR)
        self._persistent: dict[int, tuple[MPI.Prequest, np.ndarray, np.ndarray]] = {}
        self.mode = "persistent" if self.persistent else "non-persistent"
        self.details = {"persistent": float(self.persistent)}

    def close(self) -> None:
        """Free the persistent requests and the graph communicator (MPICH reports them at finalize otherwise)."""
        if MPI.Is_finalized():
            return
        for request, _, _ in self._persistent.values():
            request.Free()
        self._persistent.clear()
        if self.graph != MPI.COMM_NULL:
            self.graph.Free()

    def __del__(self) -> None:
        graph = getattr(self, "graph", None)
        if graph is not None:
            self.close()

    def _post(self, send: np.ndarray, recv: np.ndarray, counts: np.ndarray, displacements: np.ndarray, k: int,
              blocking: bool = False) -> None:
        mine_counts = (counts[self.neighbours] * k).astype(np.int32)
        mine_displacements = (displacements[self.neighbours] * k).astype(np.int32)
        self.graph.Neighbor_alltoallv(
            [send, mine_counts, mine_displacements, MPI.DOUBLE], [recv, mine_counts, mine_displacements, MPI.DOUBLE]
        )

    def _start(self, local_values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        k = local_values.shape[1]
        if not self.persistent or self._rounds(k)[1] > 1:
            return super()._start(local_values)
        if k not in self._persistent:
            packed, received = np.empty((len(self.index), k)), np.empty((len(self.index), k))
            counts = (self.counts[self.neighbours] * k).astype(np.int32)
            displacements = (self.offsets[self.neighbours] * k).astype(np.int32)
            request = self.graph.Neighbor_alltoallv_init(
                [packed, counts, displacements, MPI.DOUBLE], [received, counts, displacements, MPI.DOUBLE]
            )
            self._persistent[k] = (request, packed, received)
        request, packed, received = self._persistent[k]
        self.exchange.gather_rows(local_values, self.index, packed)
        request.Start()
        self._request = request
        return packed, received, int(np.count_nonzero(self.counts))

    def _wait(self) -> None:
        request = getattr(self, "_request", None)
        if request is not None:
            request.Wait()
            self._request = None


class _PlanExchange(Protocol):
    """What :class:`OverlapMixin` uses of the plan-driven strategy it is mixed into (:class:`AlltoallvReduction`)."""

    local_pixels: np.ndarray
    index: np.ndarray
    _max_rows: int
    _pending: tuple[np.ndarray, np.ndarray, int] | None

    def _check(self, local_values: np.ndarray) -> None: ...
    def _count(self, nbytes: int, messages: int) -> None: ...
    def _start(self, local_values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]: ...
    def _wait(self) -> None: ...
    def _add(self, local_values: np.ndarray, received: np.ndarray) -> None: ...


class OverlapMixin:
    """Overlap variant of a plan-driven strategy: :meth:`start` posts the exchange, :meth:`finish` completes it.

    Between the two the caller finishes the rows only this rank observes
    (the solve accumulates their samples' P^T then): the shared rows must be
    final at :meth:`start` (they are packed there) and left alone until
    :meth:`finish`, which adds the received sums. The messages, bytes and
    sums are the blocking twin's; only the waiting moves. MPICH progresses a
    non-blocking collective inside MPI calls (or on an asynchronous progress
    thread, ``MPIR_CVAR_ASYNC_PROGRESS=1``): what hides is what the library
    progresses while the caller computes.
    """

    overlaps = True
    _pending: tuple[np.ndarray, np.ndarray, int] | None = None

    @property
    def shared_rows(self: _PlanExchange) -> np.ndarray:
        """[n_local] bool: the rows the exchange sends and adds into (the others are this rank's alone)."""
        rows = np.zeros(len(self.local_pixels), dtype=bool)
        rows[self.index] = True
        return rows

    def start(self: _PlanExchange, local_values: np.ndarray) -> None:
        self._check(local_values)
        if self._max_rows == 0:
            self._pending = (local_values, np.zeros((0, local_values.shape[1])), 0)
            return
        _, received, messages = self._start(local_values)
        self._pending = (local_values, received, messages)

    def finish(self: _PlanExchange) -> np.ndarray:
        if self._pending is None:
            raise RuntimeError("finish() without start()")
        local_values, received, messages = self._pending
        self._pending = None
        if self._max_rows:  # posted, even with nothing of this rank's in it
            self._wait()
            self._add(local_values, received)
        nbytes = len(self.index) * local_values.shape[1] * VALUE_BYTES if self._max_rows else 0
        self._count(nbytes, messages)
        return local_values


class AlltoallvOverlapReduction(OverlapMixin, AlltoallvReduction):
    """``alltoallv`` with the exchange posted by ``MPI_Ialltoallv`` and completed after the private rows."""

    name = "alltoallv-overlap"
    _request: MPI.Request | None  # the posted exchange and its buffers, between _post and _wait
    _buffers: tuple[np.ndarray, np.ndarray] | None
    bytes_counted = AlltoallvReduction.bytes_counted.replace("MPI_Alltoallv", "MPI_Ialltoallv")

    def _post(self, send: np.ndarray, recv: np.ndarray, counts: np.ndarray, displacements: np.ndarray, k: int,
              blocking: bool = False) -> None:
        if blocking:
            return super()._post(send, recv, counts, displacements, k)
        self._buffers = (send, recv)  # kept alive until the wait
        self._request = self.comm.Ialltoallv(
            [send, (counts * k).astype(np.int32), (displacements * k).astype(np.int32), MPI.DOUBLE],
            [recv, (counts * k).astype(np.int32), (displacements * k).astype(np.int32), MPI.DOUBLE],
        )

    def _wait(self) -> None:
        request = getattr(self, "_request", None)
        if request is not None:
            request.Wait()
            self._request, self._buffers = None, None


class NeighborOverlapReduction(OverlapMixin, NeighborReduction):
    """``neighbor`` with the exchange started (persistent ``Start`` or ``Ineighbor_alltoallv``) before the private rows."""

    name = "neighbor-overlap"
    bytes_counted = NeighborReduction.bytes_counted

    def _post(self, send: np.ndarray, recv: np.ndarray, counts: np.ndarray, displacements: np.ndarray, k: int,
              blocking: bool = False) -> None:
        if blocking:
            return super()._post(send, recv, counts, displacements, k)
        mine_counts = (counts[self.neighbours] * k).astype(np.int32)
        mine_displacements = (displacements[self.neighbours] * k).astype(np.int32)
        self._buffers = (send, recv)
        self._request = self.graph.Ineighbor_alltoallv(
            [send, mine_counts, mine_displacements, MPI.DOUBLE], [recv, mine_counts, mine_displacements, MPI.DOUBLE]
        )


class PairwiseReduction(AlltoallvReduction):
    """The Alltoallv's blocks exchanged pairwise in XOR order (seed 002's transposition study).

    At step s = 1 .. P - 1 (P the power of two >= p) rank i swaps its block
    with rank i XOR s by one ``Sendrecv`` when the two share pixels (both
    ends know it from the plan, so empty pairs skip the step): every step is
    a perfect matching, no rank waits on two partners at once. The library's
    Alltoallv chooses its own schedule; which wins depends on the machine,
    so ``calibrate`` measures both and the model chooses.
    """

    name = "pairwise"
    bytes_counted = (
        "exact: 8 k bytes per shared pixel value this rank sends by MPI_Sendrecv (the Alltoallv's bytes); "
        "messages: one per neighbour and round"
    )
    TAG = 24

    def _post(self, send: np.ndarray, recv: np.ndarray, counts: np.ndarray, displacements: np.ndarray, k: int,
              blocking: bool = False) -> None:
        rank, size = self.comm.Get_rank(), self.comm.Get_size()
        steps = 1 << max(size - 1, 0).bit_length()
        send_flat, recv_flat = send.reshape(-1), recv.reshape(-1)
        for step in range(1, steps):
            partner = rank ^ step
            if partner >= size or counts[partner] == 0:
                continue
            a, b = int(displacements[partner]) * k, int(displacements[partner] + counts[partner]) * k
            self.comm.Sendrecv([send_flat[a:b], MPI.DOUBLE], dest=partner, sendtag=self.TAG,
                               recvbuf=[recv_flat[a:b], MPI.DOUBLE], source=partner, recvtag=self.TAG)


class ButterflyReduction(PixelReduction):
    """Sparse recursive doubling, log2 p' exchanges for any p (:func:`mapmaker.parallel.overlap.butterfly_schedule`).

    Ranks e >= p' (the largest power of two) send the pixels they share to
    e - p' first and get the sums back last; the p' others keep a working
    array over their interest set and, at step m, swap with rank XOR 2^m the
    partial sums of the pixels the partner's remaining subtree observes.
    Empty messages are not sent: both ends know the sizes from the plan.
    """

    name = "butterfly"
    bytes_counted = (
        "exact: 8 k bytes per pixel value this rank sends in the fold, the log2 p' steps and the unfold "
        "(point-to-point); messages: the non-empty sends (pieces of at most 2**31 - 1 doubles)"
    )
    # Message tags: FOLD, UNFOLD, and STEP + step. The pieces of one message share its tag: MPI matches
    # messages of one sender, tag and communicator in the order they were posted. All far below 32767, the
    # largest tag every MPI must accept (MPI_TAG_UB is 2^21 - 1 on Cray MPICH, 2^19 - 1 on Intel MPI 2021).
    FOLD, UNFOLD, STEP = 1, 2, 16

    def __init__(self, comm: MPI.Comm, local_pixels: np.ndarray, plan: OverlapPlan, *, max_elements: int = MAX_ELEMENTS):
        super().__init__(comm, local_pixels)
        self.schedule = butterfly_schedule(plan)
        self.max_elements = int(max_elements)
        self._flat = FlatCache()

    def _pieces(self, n: int):
        step = max(1, self.max_elements)
        return [(start, min(start + step, n)) for start in range(0, n, step)]

    def _exchange(self, partner: int, send: np.ndarray | None, receive: np.ndarray | None, tag: int) -> tuple[int, int]:
        """Send ``send`` to and receive ``receive`` from ``partner``, in pieces; returns (bytes, messages) sent."""
        requests = []
        sent = messages = 0
        if receive is not None and receive.size:
            flat = receive.reshape(-1)
            for a, b in self._pieces(flat.size):
                requests.append(self.comm.Irecv([flat[a:b], MPI.DOUBLE], source=partner, tag=tag))
        if send is not None and send.size:
            flat = np.ascontiguousarray(send).reshape(-1)
            for a, b in self._pieces(flat.size):
                requests.append(self.comm.Isend([flat[a:b], MPI.DOUBLE], dest=partner, tag=tag))
                sent += (b - a) * VALUE_BYTES
                messages += 1
        MPI.Request.Waitall(requests)
        return sent, messages

    def _reduce(self, local_values: np.ndarray) -> tuple[int, int]:
        s, flat = self.schedule, self._flat
        k = local_values.shape[1]
        values = local_values.reshape(-1)
        if s.is_extra:
            # fold into the partner, then wait for the sums.
            rows = flat(k, "fold_local", s.fold_local)
            folded = np.take(values, rows)
            b1, m1 = self._exchange(s.fold_partner, folded, None, self.FOLD)
            sums = np.empty_like(folded)
            self._exchange(s.fold_partner, None, sums, self.UNFOLD)
            values[rows] = sums
            return b1, m1
        work = np.zeros(s.n_work * k)
        own = flat(k, "own_work", s.own_work)
        work[own] = values  # own_local is every local row, in order
        sent = messages = 0
        if s.fold_partner >= 0 and len(s.fold_work):
            incoming = np.empty(len(s.fold_work) * k)
            self._exchange(s.fold_partner, None, incoming, self.FOLD)
            work[flat(k, "fold_work", s.fold_work)] += incoming
        for m, step in enumerate(s.steps):
            incoming = np.empty(len(step.receive) * k)
            outgoing = np.take(work, flat(k, f"send{m}", step.send))
            b, n = self._exchange(step.partner, outgoing, incoming, self.STEP + m)
            work[flat(k, f"receive{m}", step.receive)] += incoming
            sent, messages = sent + b, messages + n
        values[:] = np.take(work, own)
        if s.fold_partner >= 0 and len(s.fold_work):
            b, n = self._exchange(s.fold_partner, np.take(work, flat(k, "fold_work", s.fold_work)), None, self.UNFOLD)
            sent, messages = sent + b, messages + n
        return sent, messages


class HybridReduction(PixelReduction):
    """The paper's suggestion (section 3.3): heavy pixels by a compact Allreduce, the rest by Alltoallv.

    Pixels observed by at least ``threshold`` ranks ("heavy", the set H) are
    numbered 0 .. |H| - 1 in pixel order (each owner contributes its heavy
    pixels to one Allgatherv at set-up) and summed with the buffered
    Allreduce over that compact vector; the others are exchanged by an
    :class:`AlltoallvReduction` restricted to them. Many-rank pixels are
    what make every rank a neighbour of every other in the Alltoallv.
    """

    name = "hybrid"
    bytes_counted = (
        "the Allreduce of the |H| heavy pixels counted by the Rabenseifner model (2 n (p-1)/p * 8 bytes in "
        "2 ceil(log2 p) messages per buffer) plus the exact bytes and blocks of the Alltoallv of the light ones"
    )

    def __init__(self, comm: MPI.Comm, local_pixels: np.ndarray, plan: OverlapPlan, *, threshold: int, buffer_pixels: int,
                 max_elements: int = MAX_ELEMENTS, exchange: ModuleType | None = None):
        super().__init__(comm, local_pixels)
        self.threshold = int(threshold)
        heavy = plan.multiplicity >= self.threshold
        self.light = AlltoallvReduction(comm, local_pixels, plan, exchanged=~heavy, max_elements=max_elements,
                                        exchange=exchange)
        owned_heavy = np.ascontiguousarray(self.local_pixels[heavy & (plan.owner == comm.Get_rank())])
        counts = np.array(comm.allgather(len(owned_heavy)), dtype=np.int64)
        everyone = np.empty(int(counts.sum()), dtype=np.int64)
        comm.Allgatherv(
            [owned_heavy, MPI.INT64_T],
            [everyone, counts.astype(np.int32), np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32), MPI.INT64_T],
        )
        heavy_ids = np.sort(everyone)
        self.n_heavy = len(heavy_ids)
        self.heavy_local = np.flatnonzero(heavy)
        self.heavy = None
        if self.n_heavy:
            positions = np.searchsorted(heavy_ids, self.local_pixels[self.heavy_local])
            self.heavy = AllreduceReduction(comm, positions, self.n_heavy, buffer_pixels)
        self.details = {"threshold": float(self.threshold), "heavy_pixels": float(self.n_heavy)}
        self._flat = FlatCache()

    def _reduce(self, local_values: np.ndarray) -> tuple[int, int]:
        sent, messages = self.light._reduce(local_values)
        if self.heavy is not None:
            k = local_values.shape[1]
            positions = self._flat(k, "heavy", self.heavy_local)
            values = local_values.reshape(-1)
            rows = np.take(values, positions).reshape(-1, k)
            b, n = self.heavy._reduce(rows)
            values[positions] = rows.reshape(-1)
            sent, messages = sent + b, messages + n
        return sent, messages


# The strategies with start() and finish() (overlaps True)
OverlapReduction = AlltoallvOverlapReduction | NeighborOverlapReduction

STRATEGIES: dict[str, type[PixelReduction]] = {
    "allreduce": AllreduceReduction,
    "alltoallv": AlltoallvReduction,
    "butterfly": ButterflyReduction,
    "hybrid": HybridReduction,
    "neighbor": NeighborReduction,
    "pairwise": PairwiseReduction,
    "alltoallv-overlap": AlltoallvOverlapReduction,
    "neighbor-overlap": NeighborOverlapReduction,
}
KNOWN_STRATEGIES = STRATEGY_NAMES
PLAN_STRATEGIES = tuple(name for name in STRATEGY_NAMES if name != "allreduce")
# Each overlap variant and the blocking strategy it shares messages, bytes and sums with.
BLOCKING_TWIN = {"alltoallv-overlap": "alltoallv", "neighbor-overlap": "neighbor"}


def resolve_strategy(requested: str) -> str:
    """Check a requested name: a strategy or ``auto`` (resolved later, by :func:`make_reduction`, from the plan).

    Raises :class:`ReductionUnavailable` for an unknown name.
    """
    if requested != "auto" and requested not in KNOWN_STRATEGIES:
        raise ReductionUnavailable(f"unknown reduction {requested!r}; choose one of auto, {', '.join(KNOWN_STRATEGIES)}")
    if requested != "auto" and requested not in STRATEGIES:
        raise ReductionUnavailable(f"reduction {requested!r} is not implemented in this version")
    return requested


def needs_plan(requested: str, size: int) -> bool:
    """Whether ``requested`` on ``size`` ranks needs the overlap plan (auto does, to choose)."""
    return size > 1 and requested != "allreduce"


def make_reduction(
    name: str,
    comm: MPI.Comm,
    local_pixels: np.ndarray,
    *,
    npix: int,
    buffer_pixels: int,
    plan: OverlapPlan | None = None,
    machine: commodel.Machine | None = None,
    workload: commodel.Workload | None = None,
    max_elements: int = MAX_ELEMENTS,
    hybrid_threshold: int | None = None,
    exchange: ModuleType | None = None,
) -> PixelReduction:
    """Build the reduction ``name`` for this rank's pixels (collective).

    ``plan`` (this rank's :class:`mapmaker.parallel.overlap.OverlapPlan`) is needed by
    the plan-based strategies; ``auto`` chooses with it (and falls back to
    ``allreduce`` without one);
    ``machine`` (:class:`mapmaker.parallel.commodel.Machine`, default the paper's
    Franklin figures) and ``workload`` (:class:`mapmaker.parallel.commodel.Workload`)
    drive ``auto`` and the threshold of ``hybrid`` (``hybrid_threshold``
    forces one). ``max_elements`` caps the doubles per MPI message. ``exchange``: the kernels that pack
    and add the shared rows of the plan-driven strategies (the run's ``Kernels.exchange``; default the
    numpy reference, :mod:`mapmaker.kernels.exchange`).
    """
    reduction: PixelReduction
    requested = resolve_strategy(name)
    size = comm.Get_size()
    if not needs_plan(requested, size):
        reduction = AllreduceReduction(comm, local_pixels, npix, buffer_pixels)
        if requested == "auto":
            reduction.selection = commodel.Selection(
                "auto", "allreduce", "one rank: nothing to communicate", "none", 0, 0, {}
            )
        return reduction
    if plan is None and requested == "auto":
        reduction = AllreduceReduction(comm, local_pixels, npix, buffer_pixels)
        reduction.selection = commodel.Selection(
            "auto", "allreduce", "no overlap plan to model the others with: the Allreduce needs none", "none", 0, 0, {}
        )
        return reduction
    if plan is None:
        raise ValueError(f"reduction {requested!r} on {size} ranks needs the overlap plan")
    machine = machine or commodel.DEFAULT_MACHINE
    workload = workload or commodel.Workload(1, commodel.PAPER_ITERATIONS, buffer_pixels)
    selection: commodel.Selection | None = None
    strategy = requested
    if requested in ("auto", "hybrid"):
        figures = commodel.figures_from_plan(comm, plan)
        selection = commodel.select_strategy(figures, machine, workload, requested)
        if requested == "hybrid":
            hybrid = selection.modeled["hybrid"]
            selection.chosen = "hybrid"
            selection.reason = (
                f"threshold {hybrid['threshold']:.0f} ({hybrid['heavy_pixels']:.0f} heavy pixels) has the lowest "
                f"modeled time per iteration, {hybrid['seconds_per_iteration']:.3g} s; alltoallv alone "
                f"{selection.modeled['alltoallv']['seconds_per_iteration']:.3g} s ({machine.name})"
            )
        strategy = selection.chosen if requested == "auto" else requested
    if strategy == "allreduce":
        reduction = AllreduceReduction(comm, local_pixels, npix, buffer_pixels)
    elif strategy == "alltoallv":
        reduction = AlltoallvReduction(comm, local_pixels, plan, max_elements=max_elements, exchange=exchange)
    elif strategy == "butterfly":
        reduction = ButterflyReduction(comm, local_pixels, plan, max_elements=max_elements)
    elif strategy in ("neighbor", "pairwise", "alltoallv-overlap", "neighbor-overlap"):
        # these four are AlltoallvReduction's subclasses, built from the plan alone
        reduction = cast(type[AlltoallvReduction], STRATEGIES[strategy])(
            comm, local_pixels, plan, max_elements=max_elements, exchange=exchange
        )
    else:
        # hybrid, requested or chosen by the model: either way the selection was made above
        assert selection is not None
        threshold = hybrid_threshold or int(selection.modeled["hybrid"]["threshold"])
        reduction = HybridReduction(
            comm, local_pixels, plan, threshold=threshold, buffer_pixels=buffer_pixels, max_elements=max_elements,
            exchange=exchange,
        )
    reduction.selection = selection
    return reduction
