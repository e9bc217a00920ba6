"""The two-level preconditioner: block-diagonal plus a coarse-space correction (deflation).

After Grigori, Stompor & Szydlarski, "A two-level preconditioner for
cosmic microwave background map-making", SC'12 (and Szydlarski et al.,
A&A 572, A39, 2014): the block-diagonal preconditioner ``M_BD`` leaves a
few slow modes of ``M_BD A`` -- map patterns whose time stream falls in
the 1/f part of the noise, which N^-1 nearly ignores -- and PCG spends
its late iterations on them (the plateau of the residual history). A
coarse space ``Z`` holding those modes is solved exactly at every
iteration.

The coarse space. Grigori et al. build ``Z`` from the noise model: one
column per stationary interval, ``M_BD P^T diag(N^-1) 1_interval`` (its
offset seen in the map). Measured on the satellite example (6 h, 26
block-diagonal iterations to 1e-6): per-interval offsets give 20
iterations, 6 offsets per interval (10-minute baselines) 15, 30 per
interval 15; the slow modes are large-scale *map* patterns, not offsets.
Piecewise-constant I, Q, U on the pixels of a coarse HEALPix grid
(``solver.coarse_nside``) give 14 iterations at coarse nside 2 (144
columns) and 11 at nside 4 (480 observed), so that is the coarse space
here (default coarse nside 4: the set-up grows with the columns): column
``(c, s)`` is 1 in Stokes ``s`` of every solved fine pixel inside coarse
pixel ``c`` (NESTED parents of the RING fine pixels).
``solver.coarse_stokes = "I"`` keeps the I columns alone (``stokes=1``):
a third of the columns, of ``A Z`` and of the set-up. The 1/f stripes
are total-power offsets, so at nside 512 the I columns hold what deflation
removes (60 Hz, 2 ranks, coarse nside 1: 13 iterations either way, set-up
5.9 s against 16.7 s, and the solve 7.1 s against IQU's 7.5 and
block-diagonal's 7.8; docs/results/solvers-nside512.md), while the
satellite example at nside 64 keeps 14 iterations with I alone against 10
with IQU at coarse nside 4: its polarised slow modes need the Q and U
columns.
Being an aggregation, ``Z^T v`` is a sum of rows into K bins and ``Z y`` a gather
(:mod:`mapmaker.kernels.coarse_space`).

The preconditioner is A-DEF2 (Tang, Nabben, Vuik & Erlangga, J. Sci.
Comput. 39, 340, 2009), started from ``x0 = Z E^-1 Z^T b``:

    M r = M_BD r + Z E^-1 (Z^T r - (A Z)^T M_BD r),   E = Z^T A Z  [K, K]

With that start every residual stays A-orthogonal to the coarse space,
and A-DEF2 is then as robust as the symmetric balancing preconditioner
(same iterates in exact arithmetic) at one map-sized pass per iteration
instead of two. ``A Z`` [K, n_held, 3] is kept in single precision at
this rank's share of the observed pixels only
(:attr:`~mapmaker.parallel.distributed.DistributedPixels.spread_owned`:
each observed pixel on one of the ranks observing it, spread evenly, where
the owners of the dot products would put nearly all of a satellite's sky
on rank 0): the only state that grows with the map (``12 n_held K``
bytes; 28 MiB per 100 coarse columns at nside 64's 49,152 pixels, shared
out evenly between the ranks), read once per iteration. Single precision is
plenty there: ``M`` stays one fixed linear map, and PCG's residual
recursion never sees it; the start's exact residual ``b - A x0`` takes
one operator application.

The additive form (``solver.preconditioner = "two-level-additive"``),
``M r = M_BD r + Z E^-1 Z^T r`` from the same start, needs ``E`` alone: no
``A Z`` is held or read, and an iteration costs what a block-diagonal one
does plus one ``Allreduce`` of K numbers. It does not deflate the coarse
modes exactly, so PCG takes more iterations than with A-DEF2 (at
coarse nside 4 on the satellite example: 13 against 10 to 1e-6, 27
block-diagonal; at nside 512 with coarse nside 2, 20 against
block-diagonal's 17), but each is cheaper, and so is reading its cached
set-up: A-DEF2 reads ``A Z`` (329 MB at 576 columns) every iteration and
from the coarse file every realisation (1.5 s at 1 rank under load,
against 0.07 s for ``E`` alone; docs/results/solvers.md).

The default, ``solver.preconditioner = "auto"`` (:func:`choose_preconditioner`),
is A-DEF2 when its set-up is shared through the coarse cache and its ``A Z``
fits :data:`AUTO_COARSE_BYTES` per rank, and block-diagonal otherwise: a
one-off realisation pays no set-up it cannot pay back. Once the coarse
operator is cached, fewer iterations are not always less time: each A-DEF2
iteration also reads ``A Z``, and at nside 512 and 14 samples a pixel its
13 iterations took 8.8 s against block-diagonal's 16 in 7.9 s
(docs/results/solvers-nside512.md). So the realisations that read the file
time both (:func:`choose_by_timing`): the first solves with A-DEF2, the next
with block-diagonal, each recording its seconds beside the coarse file
(:mod:`mapmaker.solve.coarsefile`), and the rest solve with the faster. Both
give the map to the solve's tolerance, so a trial costs only its time.

Set-up: ``A Z`` is K applications of the PCG operator, each reduced over
ranks through the solve's own :class:`~mapmaker.parallel.reduction.PixelReduction`.
Column ``(c, s)`` is zero in ``P Z`` on every stationary interval that never
visits coarse pixel ``c``, so each application runs over the intervals that
do (on the satellite example 117 of 192 coarse pixels per 1-hour interval:
about 0.6 of an iteration per column). That is the count of (column,
visited interval) transforms that forming ``E`` interval by interval from
dense ``P Z`` blocks would make too: the FFTs, not the bookkeeping, set the
cost, and only a smaller coarse space would lower it. ``A Z`` and ``E``
depend on the pointing, the cut, the detectors' noise model (its PSD) and
the rank count,
never on the noise draw or the sky: they are the same for every realisation
of a campaign. :class:`CoarseOperator` holds them, and
:mod:`mapmaker.solve.coarsefile` keeps them in a file that the first
realisation writes and the others read (``realize --coarse-cache``).

Distribution. Every rank holds the whole (small) coarse space: ``E``,
``E``'s Cholesky factor and the K-vectors. ``Z^T v`` and ``(A Z)^T u``
sum this rank's *held* pixels (each shared pixel counted once, on one
rank) and one ``Allreduce`` of K numbers per iteration
completes them; ``A Z``'s columns are consistent across ranks after their
reduction, so ``Z y`` needs no communication.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import healpy as hp
import numpy as np
import scipy.linalg
from mpi4py import MPI

from mapmaker.kernels.implementation import Kernels
from mapmaker.parallel.distributed import DistributedPixels
from mapmaker.parallel.reduction import PixelReduction

# (x [n_local, 3], out, coarse pixel whose visiting intervals suffice or None) -> A x, not yet reduced
Operator = Callable[[np.ndarray, np.ndarray, int | None], np.ndarray]


@dataclass
class CoarseOperator:
    """What the coarse space costs to set up, for one rank: ``E = Z^T A Z`` and this rank's rows of ``A Z``.

    matrix [K, K] float64 (K^-1 per unit of Z), the same on every rank;
    columns [K, 3 n_held] float32: ``A Z`` at this rank's held pixels
    (the order of ``DistributedPixels.spread_owned`` in ``local_pixels``), Stokes
    fastest. Independent of the data: shareable by every realisation of a
    campaign (:mod:`mapmaker.solve.coarsefile`).
    """

    matrix: np.ndarray
    columns: np.ndarray

    @property
    def n_columns(self) -> int:
        return int(self.matrix.shape[0])


class TwoLevelPreconditioner:
    """A-DEF2 on a coarse HEALPix aggregation space; :meth:`apply` is ``M``, :meth:`start` gives ``x0, b - A x0``.

    Collective construction. ``local_pixels`` [n_local] int64 sorted RING
    ids of the map at ``nside``; ``cut`` [n_local] bool (pixels out of the
    solve: no coarse column touches them); ``inverse_blocks`` [n_local, 3, 3]
    (K^2), applied by ``kernels.blocks.apply``: the block-diagonal
    preconditioner (``kernels.coarse``: the coarse space's sums and gathers);
    ``apply_operator(x, out, visiting)`` this rank's share
    of ``P^T N^-1 P x`` (K^-1) before the reduction, which ``reduction`` then
    sums, over the stationary intervals that visit the coarse pixels
    ``visiting`` (None: all intervals), and ``visited()`` [n_coarse_pixels]
    bool the coarse pixels (NESTED at ``coarse_nside``) that this rank's
    samples visit. ``operator``: a :class:`CoarseOperator` made before (a
    file's); None builds it (:attr:`built` says which happened).
    ``additive``: the additive coarse correction ``M = M_BD + Z E^-1 Z^T``
    (module doc) instead of A-DEF2; it keeps no ``A Z``. ``stokes``: the
    columns per coarse pixel, 3 (I, Q, U) or 1 (I alone).
    """

    def __init__(
        self,
        *,
        pixels: DistributedPixels,
        reduction: PixelReduction,
        nside: int,
        coarse_nside: int,
        cut: np.ndarray,
        inverse_blocks: np.ndarray,
        kernels: Kernels,
        apply_operator: Operator,
        operator: CoarseOperator | None = None,
        additive: bool = False,
        stokes: int = 3,
    ):
        self.pixels = pixels
        self.comm = pixels.comm
        self.reduction = reduction
        self.inverse_blocks = inverse_blocks
        self.apply_blocks = kernels.blocks.apply
        self.space = kernels.coarse
        self.apply_operator = apply_operator
        self.additive = bool(additive)
        self.nside = int(nside)
        self.coarse_nside = min(int(coarse_nside), int(nside))
        n_local = pixels.n_local
        self.parent = coarse_parents(pixels.local_pixels, self.nside, self.coarse_nside)
        n_coarse = 12 * self.coarse_nside**2
        solved = ~np.asarray(cut, dtype=bool)
        seen = np.zeros(n_coarse, dtype=np.int64)
        seen[np.unique(self.parent[solved])] = 1
        self.comm.Allreduce(MPI.IN_PLACE, seen, op=MPI.MAX)
        self.active = np.flatnonzero(seen)
        if stokes not in (1, 3):
            raise ValueError(f"stokes must be 3 (IQU columns) or 1 (I), got {stokes}")
        self.stokes = stokes
        # Column of each (pixel, Stokes): stokes * (rank of its parent among the observed coarse pixels) + s; K when
        # cut or when s is not among the coarse space's Stokes parameters (Q and U of an I-only space).
        self.n_columns = stokes * len(self.active)
        rank_of = np.full(n_coarse, -1, dtype=np.int64)
        rank_of[self.active] = np.arange(len(self.active))
        column = stokes * rank_of[self.parent][:, None] + np.arange(3)[None, :]
        column[:, stokes:] = self.n_columns
        column[~solved] = self.n_columns
        # 4-byte indices while they fit: the iteration's passes read them.
        index_type = np.int32 if 3 * n_local < 2**31 else np.int64
        self.column = column.reshape(-1).astype(index_type)  # [3 n_local]
        held = np.zeros((n_local, 3), dtype=bool)
        held[pixels.spread_owned] = True
        # The flat rows whose sums this rank contributes: each shared pixel counted once, on the rank holding it.
        self._held_rows = np.flatnonzero(held.reshape(-1)).astype(index_type)
        self._held_columns = self.column[self._held_rows]
        self._gathered = np.empty(len(self._held_rows), dtype=np.float32)  # M_BD r at the held rows, for (A Z)^T
        self.built = operator is None
        self.operator = self._build() if operator is None else operator
        if self.operator.columns.shape != (self.n_columns, self.rows_held) or self.operator.n_columns != self.n_columns:
            raise ValueError(
                f"coarse operator of shape {self.operator.matrix.shape} / {self.operator.columns.shape}, expected "
                f"{self.n_columns} columns over {self.rows_held} held rows"
            )
        self.factor = scipy.linalg.cho_factor(self.operator.matrix)
        self._both = np.empty(2 * self.n_columns)

    def _build(self) -> CoarseOperator:
        """Collective: ``A Z`` column by column (one operator application over the intervals that visit the
        column's coarse pixel, and one reduction each), ``E`` from its double-precision columns."""
        n_local = self.pixels.n_local
        columns = np.empty((self.n_columns, self.rows_held), dtype=np.float32)
        coarse = np.zeros((self.n_columns, self.n_columns))
        unit = np.zeros((n_local, 3))
        flat_unit = unit.reshape(-1)
        product = np.empty((n_local, 3))
        flat_product = product.reshape(-1)
        for k in range(self.n_columns):
            flat_unit[:] = self.column == k
            self.apply_operator(unit, product, self.active[k // self.stokes])
            self.reduction.reduce(product)
            # E[:, k] = Z^T (A z_k) over held rows (summed over ranks below); A z_k kept at held rows.
            coarse[:, k] = self._restrict(product)
            if not self.additive:
                columns[k] = flat_product[self._held_rows]
        self.comm.Allreduce(MPI.IN_PLACE, coarse, op=MPI.SUM)
        # Symmetric to round-off; made exactly so for Cholesky.
        return CoarseOperator(matrix=0.5 * (coarse + coarse.T), columns=columns)

    @property
    def rows_held(self) -> int:
        """Rows of ``A Z`` this rank keeps: its held (pixel, Stokes) rows for A-DEF2, none for the additive form."""
        return 0 if self.additive else len(self._held_rows)

    @property
    def coarse_matrix(self) -> np.ndarray:
        return self.operator.matrix

    @property
    def bytes_held(self) -> int:
        """Memory of the coarse space on this rank: A Z, E and its factor (bytes)."""
        return int(self.operator.columns.nbytes + 2 * self.operator.matrix.nbytes)

    def _restrict(self, v: np.ndarray) -> np.ndarray:
        """This rank's share of ``Z^T v`` [K] (held rows) for v [n_local, 3]."""
        return self.space.restrict(v, self._held_rows, self._held_columns, self.n_columns)

    def _prolong_add(self, y: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out += Z y`` for y [K]; out [n_local, 3]."""
        return self.space.prolong_add(y, self.column, out)

    def start(self, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Collective: the coarse solution ``x0 = Z E^-1 Z^T b`` [n_local, 3] and its residual ``b - A x0``
        (one operator application and one reduction)."""
        restricted = self._restrict(b)
        self.comm.Allreduce(MPI.IN_PLACE, restricted, op=MPI.SUM)
        y = scipy.linalg.cho_solve(self.factor, restricted)
        x0 = self._prolong_add(y, np.zeros_like(b))
        product = np.empty_like(b)
        self.apply_operator(x0, product, None)
        self.reduction.reduce(product)
        return x0, b - product

    def apply(self, residual: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Collective: ``M r`` into out [n_local, 3] (K^2 K^-1 = K).

        A-DEF2: one map-sized pass over A Z, one Allreduce of 2K numbers. Additive: ``M_BD r + Z E^-1 Z^T r``,
        one Allreduce of K numbers and no pass over A Z.
        """
        smoothed = self.apply_blocks(self.inverse_blocks, residual, out=out)
        if self.additive:
            restricted = self._restrict(residual)
            self.comm.Allreduce(MPI.IN_PLACE, restricted, op=MPI.SUM)
            return self._prolong_add(scipy.linalg.cho_solve(self.factor, restricted), smoothed)
        k = self.n_columns
        self._both[:k] = self.space.restrict_and_gather(residual, smoothed, self._held_rows, self._held_columns, k,
                                                        self._gathered)
        self._both[k:] = self.operator.columns @ self._gathered
        self.comm.Allreduce(MPI.IN_PLACE, self._both, op=MPI.SUM)
        y = scipy.linalg.cho_solve(self.factor, self._both[:k] - self._both[k:])
        return self._prolong_add(y, smoothed)


# The most A Z (bytes per rank) that preconditioner "auto" holds: a memory limit only, since the trials
# (choose_by_timing) decide whether reading it every iteration pays. 2 GiB leaves a rank of this machine
# (2 x 11.7 GiB) or of a cluster's 4 GiB a core room for its samples. The satellite example's 576 columns
# (coarse nside 4) at nside 64 take 329 MB on one rank; at nside 512 coarse nside 1 takes 1.2 GB on one
# rank and 0.6 GB on each of 2, and the default coarse nside 4 about 20 GB (block-diagonal is chosen).
AUTO_COARSE_BYTES = 2 * 2**30


# What auto compares once the coarse operator is cached, in the order the trials run.
TIMED_PRECONDITIONERS = ("two-level", "block-diagonal")


@dataclass(frozen=True)
class SolveTiming:
    """One realisation's solve under ``auto`` with the coarse operator cached: what :func:`choose_by_timing` compares."""

    preconditioner: str  # one of TIMED_PRECONDITIONERS
    seconds: float  # choosing, the coarse set-up (the file's read and the start) and PCG, on the slowest rank (s)
    iterations: int


class Choice(NamedTuple):
    """The preconditioner a run solves with, why, and whether its time is recorded for auto's comparison."""

    preconditioner: str
    why: str
    timed: bool = False


def choose_by_timing(timings: Sequence[SolveTiming]) -> Choice:
    """Auto's choice once the coarse operator is cached: each of :data:`TIMED_PRECONDITIONERS` until it has been
    timed on a realisation of the problem (a trial, timed), then the one of smaller median seconds."""
    seconds = {name: [t.seconds for t in timings if t.preconditioner == name] for name in TIMED_PRECONDITIONERS}
    for name in TIMED_PRECONDITIONERS:
        if not seconds[name]:
            return Choice(name, f"trial: no realisation of this problem has solved with {name} yet", timed=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    fastest = min(TIMED_PRECONDITIONERS, key=medians.__getitem__)
    return Choice(fastest, "the faster on realisations of this problem: " + ", ".join(
        f"{name} {medians[name]:.2f} s ({len(seconds[name])} timed)" for name in TIMED_PRECONDITIONERS))


def choose_preconditioner(
    requested: str, *, cached: bool, realizations: int, coarse_bytes: int, timings: Sequence[SolveTiming] = (),
) -> Choice:
    """The preconditioner a run solves with, and why: ``requested`` unless it is ``"auto"``.

    ``auto`` considers A-DEF2 (``"two-level"``) when its coarse operator is shared -- ``cached``: a coarse cache
    file exists, or the run writes one that ``realizations`` > 1 realisations of the campaign will read --
    and its ``A Z`` takes at most :data:`AUTO_COARSE_BYTES` on every rank (``coarse_bytes``, the largest
    over ranks); otherwise block-diagonal, which has no set-up to pay back. The run that builds the file
    solves with A-DEF2; the runs that read it choose by ``timings`` (:func:`choose_by_timing`).
    """
    if requested != "auto":
        return Choice(requested, "as the spec says")
    if coarse_bytes > AUTO_COARSE_BYTES:
        return Choice("block-diagonal", f"A Z would take {coarse_bytes / 2**20:.0f} MiB on a rank, over the "
                                        f"{AUTO_COARSE_BYTES / 2**20:.0f} MiB the two-level set-up may hold")
    if not cached and realizations < 2:
        return Choice("block-diagonal", "no coarse cache to read and no other realisation to share one built here")
    if not cached:
        return Choice("two-level", f"its coarse operator is built once into the coarse cache for {realizations} "
                                   "realisations")
    return choose_by_timing(timings)


def coarse_parents(local_pixels: np.ndarray, nside: int, coarse_nside: int) -> np.ndarray:
    """NESTED id at ``coarse_nside`` [n] int64 of each RING pixel ``local_pixels`` [n] at ``nside``.

    NESTED ids share their leading bits with their parent's, so the parent is a shift away.
    """
    if len(local_pixels) == 0:
        return np.zeros(0, dtype=np.int64)
    shift = 2 * (int(nside).bit_length() - int(coarse_nside).bit_length())
    return np.asarray(hp.ring2nest(nside, local_pixels), dtype=np.int64) >> shift
