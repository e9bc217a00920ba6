"""The overlap plan: which pixels each rank shares with which other rank (MADmap, section 3.3).

Built once per (scan key, rank count) and reused by every realisation: it
depends only on which pixels each rank observes. One rank's part
(:class:`OverlapPlan`) holds, for its sorted local pixels:

* ``multiplicity`` -- how many ranks observe each local pixel (itself included);
* ``owner`` -- the lowest rank observing each local pixel (dot products and
  gathers count a shared pixel once, at its owner);
* for every other rank j sharing pixels with it (``neighbours``), the sorted
  local indices of the shared pixels (``shared_index[shared_offsets[n]:
  shared_offsets[n + 1]]``): what the Alltoallv reduction exchanges;
* the *butterfly interest set*: the pixels this rank holds at some step of
  the sparse recursive-doubling reduction, each with two bit masks that say
  which ranks of the butterfly observe it (see :func:`butterfly_schedule`).

Building (:func:`build_overlap_plan`, collective; the numbered steps of the
paper's Figure 3):

1. the map is cut into ranges of ``buffer_pixels`` pixels; for each range
   every rank contributes its (sorted) pixel ids in the range to an
   ``Allgatherv`` -- in several pieces when the range holds more than
   ``max_ids`` ids in all, so that no count or displacement overflows 32 bits
   and no rank holds more than ``max_ids`` received ids at a time;
2. *sift*: each rank looks every received id up in a table of the range
   (its local index or -1), so membership costs O(1) per id; hits give the
   shared pixels per source rank, every id gives the range's multiplicity and
   the butterfly masks;
3. *index set-up*: the hits are grouped by source rank into the shared lists.

Because a range is complete after its round, each rank knows every pixel's
multiplicity and observers there without ever holding a whole-map array.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

WIRE_DTYPE = np.int32  # pixel ids on the wire: npix < 2**31 for nside <= 8192
DEFAULT_MAX_IDS = 1 << 24  # received ids held at a time by the allgather (64 MiB of int32)
OWN_SELF = 1  # interest_own bit: this rank observes the pixel
OWN_FOLDED = 2  # interest_own bit: the extra rank folded into this one observes it (and shares it)


# --------------------------------------------------------------------------- the per-rank plan


@dataclass
class OverlapPlan:
    """One rank's part of the overlap plan; arrays documented in the module docstring.

    local_pixels [n_local] int64 sorted unique; multiplicity, owner [n_local]
    int32; neighbours [n_nb] int32 ascending (self excluded); shared_offsets
    [n_nb + 1] int64; shared_index [n_shared] int32; interest_pixels [n_int]
    int64 sorted; interest_low, interest_high [n_int] uint32; interest_own
    [n_int] uint8 (OWN_SELF | OWN_FOLDED).
    """

    rank: int
    size: int
    npix: int
    local_pixels: np.ndarray
    multiplicity: np.ndarray
    owner: np.ndarray
    neighbours: np.ndarray
    shared_offsets: np.ndarray
    shared_index: np.ndarray
    interest_pixels: np.ndarray
    interest_low: np.ndarray
    interest_high: np.ndarray
    interest_own: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)
    histogram: np.ndarray | None = None  # [p + 1] pixels observed by m ranks (same on every rank), when built here

    @property
    def n_local(self) -> int:
        return len(self.local_pixels)

    @property
    def n_shared(self) -> int:
        """sum over j != i of o_ij: pixel values this rank sends per Alltoallv."""
        return len(self.shared_index)

    def shared_with(self, n: int) -> np.ndarray:
        """Local indices shared with ``neighbours[n]``, ascending."""
        return self.shared_index[self.shared_offsets[n] : self.shared_offsets[n + 1]]

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays that the plan file stores, by name."""
        return {name: getattr(self, name) for name in PLAN_ARRAYS}


PLAN_ARRAYS = {
    "local_pixels": "<i8",
    "multiplicity": "<i4",
    "owner": "<i4",
    "neighbours": "<i4",
    "shared_offsets": "<i8",
    "shared_index": "<i4",
    "interest_pixels": "<i8",
    "interest_low": "<u4",
    "interest_high": "<u4",
    "interest_own": "u1",
}


# --------------------------------------------------------------------------- butterfly geometry


def butterfly_shape(size: int) -> tuple[int, int]:
    """(p', K): the largest power of two p' <= size and K = log2 p' (steps of recursive doubling)."""
    steps = max(size, 1).bit_length() - 1
    return 1 << steps, steps


def virtual_rank(rank: int, size: int) -> int:
    """Rank in the recursive-doubling group: ranks >= p' fold into rank - p'."""
    base, _ = butterfly_shape(size)
    return rank - base if rank >= base else rank


def highest_bit(values: np.ndarray) -> np.ndarray:
    """floor(log2 v) for v > 0, -1 for 0; int64 (exact: frexp gives the binary exponent)."""
    _, exponent = np.frexp(np.asarray(values, dtype=np.float64))
    return np.where(np.asarray(values) > 0, exponent.astype(np.int64) - 1, -1)


def lowest_bit(values: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit for v > 0, -1 for 0; int64."""
    v = np.asarray(values, dtype=np.int64)
    return highest_bit(v & -v)


# --------------------------------------------------------------------------- step 1: the allgather schedule


def gather_schedule(counts: np.ndarray, max_ids: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pieces of one range's Allgatherv so that none receives more than ``max_ids`` ids in all.

    counts [p] int64: ids each rank contributes to the range. Returns a list
    of (starts [p], lengths [p]) int64: in piece n rank s sends its ids
    ``starts[s] .. starts[s] + lengths[s]`` (within its range slice). Sources
    are packed in rank order; a source larger than ``max_ids`` is split.
    Every rank computes the same schedule from the same counts.
    """
    counts = np.asarray(counts, dtype=np.int64)
    size = len(counts)
    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    starts, lengths = np.zeros(size, np.int64), np.zeros(size, np.int64)
    total = 0
    for source in np.flatnonzero(counts).tolist():
        done = 0
        while done < counts[source]:
            take = min(int(counts[source]) - done, max_ids)
            if total + take > max_ids or lengths[source]:
                pieces.append((starts, lengths))
                starts, lengths = np.zeros(size, np.int64), np.zeros(size, np.int64)
                total = 0
            starts[source], lengths[source] = done, take
            total += take
            done += take
    if total or not pieces:
        pieces.append((starts, lengths))
    return pieces


# --------------------------------------------------------------------------- step 2: sift


class OverlapSifter:
    """Sift of every received id against one rank's pixels, range by range (pure numpy, no MPI).

    Feed each range with :meth:`start_range`, then :meth:`sift` for every
    piece of ids received for it (any order of pieces, ids of one source
    ascending within a piece), then :meth:`finish_range`; :meth:`plan` gives
    the result. The MPI builder and the serial tests use this same code.
    """

    def __init__(self, rank: int, size: int, npix: int, local_pixels: np.ndarray):
        self.rank, self.size, self.npix = rank, size, int(npix)
        self.local_pixels = np.asarray(local_pixels, dtype=np.int64)
        self.multiplicity = np.ones(len(self.local_pixels), dtype=np.int32)
        self.owner = np.full(len(self.local_pixels), rank, dtype=np.int32)
        self.histogram = np.zeros(size + 1, dtype=np.int64)
        self._pair_sources: list[np.ndarray] = []
        self._pair_index: list[np.ndarray] = []
        self._interest: list[tuple[np.ndarray, ...]] = []
        self.base, self.steps = butterfly_shape(size)
        self.virtual = virtual_rank(rank, size)
        self.folds = rank >= self.base  # an extra rank: folded into virtual_rank, no interest set
        self.partner_extra = rank + self.base if rank + self.base < size else -1
        # Per source: virtual XOR distance d to this rank; its lowest and highest set bit (-1 for d = 0).
        sources = np.arange(size)
        virtual = np.where(sources >= self.base, sources - self.base, sources)
        distance = virtual ^ self.virtual
        self._low_class = lowest_bit(distance).astype(np.int8)
        self._high_class = highest_bit(distance).astype(np.int8)
        self._is_extra = sources >= self.base
        # Bit tables over every mask value the K steps can produce: lowest and highest set bit.
        masks = np.arange(1 << self.steps, dtype=np.int64)
        self._lowest_table = lowest_bit(masks).astype(np.int8)
        self._highest_table = highest_bit(masks).astype(np.int8)

    def start_range(self, start: int, end: int) -> None:
        """Begin the range of global pixel ids [start, end)."""
        self.start, self.end = int(start), int(end)
        n = self.end - self.start
        self.first, self.last = (int(i) for i in np.searchsorted(self.local_pixels, [start, end]))
        self.lookup = np.full(n, -1, dtype=np.int64)
        self.lookup[self.local_pixels[self.first : self.last] - start] = np.arange(self.first, self.last)
        self.range_multiplicity = np.zeros(n, dtype=np.int32)
        # Butterfly masks [2, n], row 1 from the extra ranks: those count only for pixels they share.
        self.low = np.zeros((2, n), dtype=np.uint32)
        self.high = np.zeros((2, n), dtype=np.uint32)
        self.own = np.zeros((2, n), dtype=np.uint8)

    def sift(self, ids: np.ndarray, sources: np.ndarray, lengths: np.ndarray) -> None:
        """ids [n] (global, in this range) from ``sources`` [m] in blocks of ``lengths`` [m]."""
        if len(ids) == 0:
            return
        offsets = np.asarray(ids, dtype=np.int64) - self.start
        sources = np.asarray(sources, dtype=np.int64)
        source_of = np.repeat(sources.astype(np.int32), lengths)
        self.range_multiplicity += np.bincount(offsets, minlength=len(self.lookup)).astype(np.int32)
        # Shared pixels: the received ids that are also this rank's (O(1) lookup per id).
        local = self.lookup[offsets]
        hit = (local >= 0) & (source_of != self.rank)
        if hit.any():
            self._pair_sources.append(source_of[hit])
            self._pair_index.append(local[hit].astype(np.int32))
            np.minimum.at(self.owner, local[hit], source_of[hit])
        if self.folds:
            return
        # Butterfly masks. Sources come in blocks; a block sets one bit of each mask, so the ids are
        # grouped by (extra?, bit) and each group is one idempotent |= (duplicates write the same value).
        ends = np.cumsum(lengths)
        for block, source in enumerate(sources.tolist()):
            if self._low_class[source] < 0:  # this rank itself, or the extra folded into it
                row = int(self._is_extra[source])
                self.own[row, offsets[ends[block] - lengths[block] : ends[block]]] |= OWN_FOLDED if row else OWN_SELF
        low_of = np.repeat(self._low_class[sources], lengths)
        high_of = np.repeat(self._high_class[sources], lengths)
        extra_of = np.repeat(self._is_extra[sources], lengths)
        for row in (0, 1):
            chosen = extra_of if row else ~extra_of
            if not chosen.any():
                continue
            for bit in range(self.steps):
                picked = offsets[chosen & (low_of == bit)]
                if len(picked):
                    self.low[row, picked] |= np.uint32(1 << bit)
                picked = offsets[chosen & (high_of == bit)]
                if len(picked):
                    self.high[row, picked] |= np.uint32(1 << bit)

    def finish_range(self) -> None:
        """Multiplicities, histogram and the butterfly interest set of the range."""
        multiplicity = self.range_multiplicity
        self.multiplicity[self.first : self.last] = multiplicity[self.local_pixels[self.first : self.last] - self.start]
        self.histogram += np.bincount(multiplicity, minlength=self.size + 1)[: self.size + 1]
        if self.folds:
            return
        seen = np.flatnonzero(multiplicity)
        # An extra rank folds only the pixels it shares; its private pixels never leave it.
        shared = multiplicity[seen] >= 2
        low = self.low[0, seen] | np.where(shared, self.low[1, seen], 0).astype(np.uint32)
        high = self.high[0, seen] | np.where(shared, self.high[1, seen], 0).astype(np.uint32)
        own = self.own[0, seen] | np.where(shared, self.own[1, seen], 0).astype(np.uint8)
        first_step, last_step = interest_bounds(low, high, own, self.steps, self._lowest_table, self._highest_table)
        keep = first_step < last_step
        if keep.any():
            self._interest.append((seen[keep] + self.start, low[keep], high[keep], own[keep]))

    def plan(self) -> OverlapPlan:
        """Step 3, index set-up: group the shared pixels by source rank."""
        sources = np.concatenate(self._pair_sources) if self._pair_sources else np.zeros(0, np.int32)
        index = np.concatenate(self._pair_index) if self._pair_index else np.zeros(0, np.int32)
        # Ranges come in increasing pixel order and ids of one source ascend within a range,
        # so a stable sort by source leaves each neighbour's indices ascending.
        order = np.argsort(sources, kind="stable")
        sources, index = sources[order], index[order]
        neighbours, first = np.unique(sources, return_index=True)
        offsets = np.append(first, len(sources)).astype(np.int64)
        if self._interest:
            pixels, low, high, own = (np.concatenate(parts) for parts in zip(*self._interest, strict=True))
        else:
            pixels, low, high, own = np.zeros(0, np.int64), np.zeros(0, np.uint32), np.zeros(0, np.uint32), np.zeros(0, np.uint8)
        return OverlapPlan(
            rank=self.rank,
            size=self.size,
            npix=self.npix,
            local_pixels=self.local_pixels,
            multiplicity=self.multiplicity,
            owner=self.owner,
            neighbours=neighbours.astype(np.int32),
            shared_offsets=offsets,
            shared_index=index.astype(np.int32),
            interest_pixels=pixels.astype(np.int64),
            interest_low=low.astype(np.uint32),
            interest_high=high.astype(np.uint32),
            interest_own=own.astype(np.uint8),
            histogram=self.histogram.copy(),
        )


def interest_bounds(low: np.ndarray, high: np.ndarray, own: np.ndarray, steps: int,
                    lowest_table: np.ndarray | None = None, highest_table: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(g, t) of each pixel for one rank u of the butterfly; the pixel is in u's working set after step m iff g <= m < t.

    g = -1 if u (virtually) observes the pixel, else the lowest step whose
    group holds an observer (lowest bit of ``high``); t = K if u observes it,
    else the highest bit of ``low`` (the last step after which some rank that
    receives u's partial sums still observes it). No observer: g = K (never).
    The optional tables give the lowest/highest bit of every K-bit mask.
    """
    mine = own > 0
    low_high = highest_table[low] if highest_table is not None else highest_bit(low)
    high_low = lowest_table[high] if lowest_table is not None else lowest_bit(high)
    g = np.where(mine, -1, np.where(high > 0, high_low, steps))
    t = np.where(mine, steps, low_high)
    return g, t


def plan_from_pixel_sets(rank: int, pixel_sets: list[np.ndarray], npix: int, buffer_pixels: int = 1 << 16) -> OverlapPlan:
    """Rank ``rank``'s plan from every rank's sorted pixel set, serially (tests, cross-checks).

    The same sift as :func:`build_overlap_plan`, fed range by range from the
    given sets instead of an Allgatherv.
    """
    size = len(pixel_sets)
    sifter = OverlapSifter(rank, size, npix, pixel_sets[rank])
    for start in range(0, npix, buffer_pixels):
        end = min(start + buffer_pixels, npix)
        sifter.start_range(start, end)
        pieces = [s[np.searchsorted(s, start) : np.searchsorted(s, end)] for s in pixel_sets]
        lengths = np.array([len(piece) for piece in pieces])
        sifter.sift(np.concatenate(pieces), np.arange(size), lengths)
        sifter.finish_range()
    return sifter.plan()


# --------------------------------------------------------------------------- the collective builder


def build_overlap_plan(comm, local_pixels: np.ndarray, npix: int, buffer_pixels: int, *, max_ids: int = DEFAULT_MAX_IDS) -> OverlapPlan:
    """Collective: every rank's :class:`OverlapPlan` from its sorted unique ``local_pixels``.

    buffer_pixels: pixels per range of the buffered allgather (the paper's
    n_b); max_ids: most ids one Allgatherv piece gathers. ``timings`` of the
    result holds the seconds of this rank's ``allgather``, ``sift`` and
    ``index`` phases.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    local_pixels = np.asarray(local_pixels, dtype=np.int64)
    if npix >= 2**31:
        raise ValueError("pixel ids travel as int32: npix must be below 2**31")
    if len(local_pixels) and (np.any(np.diff(local_pixels) <= 0) or local_pixels[0] < 0 or local_pixels[-1] >= npix):
        raise ValueError("local_pixels must be sorted, unique and within the map")
    buffer_pixels = int(max(1, min(buffer_pixels, npix)))
    sifter = OverlapSifter(rank, size, npix, local_pixels)
    wire = local_pixels.astype(WIRE_DTYPE)
    gather_s = sift_s = 0.0
    my_count = np.zeros(1, dtype=np.int64)
    counts = np.zeros(size, dtype=np.int64)
    sources = np.arange(size)
    for start in range(0, npix, buffer_pixels):
        end = min(start + buffer_pixels, npix)
        # 1. how many ids each rank has in the range, then the ids in pieces.
        tick = time.perf_counter()
        first, last = np.searchsorted(local_pixels, [start, end])
        my_count[0] = last - first
        comm.Allgather(my_count, counts)
        gather_s += time.perf_counter() - tick
        sifter.start_range(start, end)
        for piece_starts, piece_lengths in gather_schedule(counts, max_ids):
            tick = time.perf_counter()
            received = np.empty(int(piece_lengths.sum()), dtype=WIRE_DTYPE)
            displacements = np.concatenate([[0], np.cumsum(piece_lengths)[:-1]])
            mine = wire[first + piece_starts[rank] : first + piece_starts[rank] + piece_lengths[rank]]
            comm.Allgatherv(
                mine, [received, piece_lengths.astype(np.int32), displacements.astype(np.int32), MPI.INT32_T]
            )
            gather_s += time.perf_counter() - tick
            # 2. sift the piece.
            tick = time.perf_counter()
            present = piece_lengths > 0
            sifter.sift(received, sources[present], piece_lengths[present])
            sift_s += time.perf_counter() - tick
        tick = time.perf_counter()
        sifter.finish_range()
        sift_s += time.perf_counter() - tick
    # 3. index set-up.
    tick = time.perf_counter()
    plan = sifter.plan()
    plan.timings = {"allgather": gather_s, "sift": sift_s, "index": time.perf_counter() - tick}
    return plan


# --------------------------------------------------------------------------- the butterfly schedule


@dataclass
class ButterflyStep:
    """One exchange of the sparse recursive doubling: send ``send`` rows of the working array, add into ``receive``."""

    partner: int
    send: np.ndarray  # [n_send] int64 positions in the interest set
    receive: np.ndarray  # [n_receive] int64 positions in the interest set


@dataclass
class ButterflySchedule:
    """One rank's part of the butterfly reduction (any p; see :func:`butterfly_schedule`).

    Extra ranks (rank >= p') only fold: they send ``fold_local`` rows of their
    local values to ``fold_partner`` and get the sums back. Other ranks keep
    a working array over their interest set: own rows at ``own_local`` ->
    ``own_work``; the folded extra's rows arrive at ``fold_work``; K steps;
    the sums are read back from ``own_work`` and sent to the extra from
    ``fold_work``.
    """

    rank: int
    size: int
    n_work: int
    fold_partner: int = -1  # the extra rank folded into this one, or this extra's partner; -1: none
    fold_local: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # extra: local rows it folds
    fold_work: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # partner: where they go
    own_local: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    own_work: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    steps: list[ButterflyStep] = field(default_factory=list)

    @property
    def is_extra(self) -> bool:
        return self.rank >= butterfly_shape(self.size)[0]

    def send_counts(self) -> list[int]:
        """Rows this rank sends in each message slot: fold (extras) or steps + unfold (others)."""
        if self.is_extra:
            return [len(self.fold_local)]
        return [len(step.send) for step in self.steps] + [len(self.fold_work)]


def butterfly_schedule(plan: OverlapPlan) -> ButterflySchedule:
    """The sparse recursive-doubling reduction of one rank, from its plan.

    Let p' be the largest power of two <= p and K = log2 p'. Ranks e >= p'
    fold the pixels they share into q = e - p' and get the sums back at the
    end; among the p' others (with e's pixels counted as q's), at step
    m = 0..K-1 rank u exchanges with v = u XOR 2^m. After step m, u holds the
    partial sums over its group G_m(u) = {s : s >> (m+1) == u >> (m+1)} for
    the pixels that some rank in T_m(u) = {s : s mod 2^(m+1) == u mod 2^(m+1)}
    observes -- exactly the ranks that will later receive u's sums. So at
    step m u sends v the pixels that its group G_(m-1)(u) observes (g <= m-1)
    and some rank of T_m(v) observes (bit m of ``interest_low``), and receives
    those that T_m(u) observes (t >= m+1) and G_(m-1)(v) observes (bit m of
    ``interest_high``). After K steps G = everyone and T = {u}: u holds the
    full sums of its own pixels.
    """
    rank, size = plan.rank, plan.size
    base, steps = butterfly_shape(size)
    if rank >= base:
        fold = np.flatnonzero(plan.multiplicity >= 2).astype(np.int64)
        return ButterflySchedule(rank, size, n_work=0, fold_partner=rank - base, fold_local=fold)
    pixels = plan.interest_pixels
    own_local = np.arange(plan.n_local, dtype=np.int64)
    own_work = np.searchsorted(pixels, plan.local_pixels).astype(np.int64)
    if plan.n_local and not np.array_equal(pixels[np.minimum(own_work, len(pixels) - 1)], plan.local_pixels):
        raise ValueError("the plan's butterfly interest set lacks some of the rank's own pixels")
    g, t = interest_bounds(plan.interest_low, plan.interest_high, plan.interest_own, steps)
    schedule = ButterflySchedule(rank, size, n_work=len(pixels), own_local=own_local, own_work=own_work)
    extra = rank + base
    if extra < size:
        schedule.fold_partner = extra
        schedule.fold_work = np.flatnonzero(plan.interest_own & OWN_FOLDED).astype(np.int64)
    virtual = rank
    for m in range(steps):
        bit = np.uint32(1 << m)
        send = np.flatnonzero((g <= m - 1) & ((plan.interest_low & bit) > 0)).astype(np.int64)
        receive = np.flatnonzero((t >= m + 1) & ((plan.interest_high & bit) > 0)).astype(np.int64)
        schedule.steps.append(ButterflyStep(partner=virtual ^ (1 << m), send=send, receive=receive))
    return schedule


def simulate_butterfly(schedules: list[ButterflySchedule], values: list[np.ndarray]) -> list[np.ndarray]:
    """Run every rank's schedule in one process (tests): returns each rank's reduced values [n_local, k]."""
    size = len(schedules)
    base, steps = butterfly_shape(size)
    out = [v.copy() for v in values]
    work = [np.zeros((s.n_work, v.shape[1])) for s, v in zip(schedules, values, strict=True)]
    for u in range(base):
        work[u][schedules[u].own_work] = values[u][schedules[u].own_local]
    for e in range(base, size):
        q = schedules[e].fold_partner
        work[q][schedules[q].fold_work] += values[e][schedules[e].fold_local]
    for m in range(steps):
        sent = [work[u][schedules[u].steps[m].send].copy() for u in range(base)]
        for u in range(base):
            step = schedules[u].steps[m]
            incoming = sent[step.partner]
            if len(incoming) != len(step.receive):
                raise AssertionError(f"step {m}: rank {u} expects {len(step.receive)} rows, partner sends {len(incoming)}")
            work[u][step.receive] += incoming
    for u in range(base):
        out[u][schedules[u].own_local] = work[u][schedules[u].own_work]
    for e in range(base, size):
        q = schedules[e].fold_partner
        out[e][schedules[e].fold_local] = work[q][schedules[q].fold_work]
    return out


def multiplicity_histogram_pairs(histogram: np.ndarray) -> list[list[int]]:
    """[[m, pixels observed by exactly m ranks], ...] for m >= 1 with a non-zero count."""
    return [[int(m), int(c)] for m, c in enumerate(histogram) if m >= 1 and c > 0]


def ceil_log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0
