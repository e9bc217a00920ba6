"""The alpha-beta model of the pixel reductions (MADmap sections 3.2-3.3), and the choice it makes for ``auto``.

A message of n bytes costs alpha + n beta. Per reduction call of k values
per pixel on p ranks (``ceil(log2 p)`` written lg p; 8-byte values):

* ``allreduce`` (Rabenseifner, buffered in pieces of n_b pixels):
  per piece of n pixels 2 lg p alpha + 2 n k 8 (p - 1) / p beta;
* ``alltoallv``: rank i sends 8 k sum_j o_ij bytes in one message per
  neighbour (MPICH's Alltoallv posts only non-empty blocks; the paper's
  p alpha bounds it for implementations that do not skip them); the slowest
  rank sets the time: max_i (alpha m_i + beta b_i);
* ``butterfly``: per step the slowest pair, max_u (alpha + beta b_u),
  summed over the lg p' steps, plus the fold and unfold of the ranks above p';
* ``hybrid`` (the paper's own suggestion, section 3.3): pixels observed by at
  least tau ranks go through one compact buffered Allreduce of |H_tau|
  pixels, the others through the Alltoallv; tau is chosen by this model;
* preprocessing (once per campaign): the buffered allgather of pixel ids,
  per range 2 lg p alpha (counts, then ids) plus beta times the ids received
  (4 bytes each; n_all - n_i for rank i) and 8 (p - 1) bytes of counts, and
  the sift, ``sift_s_per_id`` for each of the n_all ids every rank examines.

The figures per rank (:class:`OverlapFigures`) are exact: at run time they
come from the plan (:func:`figures_from_plan`, collective), for projections
from a serial simulation (:mod:`mapmaker.parallel.overlap_model`). Bytes and messages
follow the counting of :mod:`mapmaker.parallel.reduction` to the byte.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mapmaker.parallel.overlap import butterfly_schedule, butterfly_shape
from schemas.calibration import SiteCalibration

VALUE_BYTES = 8
ID_BYTES = 4  # pixel ids travel as int32 in the preprocessing allgather
DEFAULT_SIFT_S_PER_ID = 5.0e-8  # the lookup-table sift on this project's machine: 40-90 ns per id (load 0-5)
PAPER_ITERATIONS = 50  # the paper's runs, "a typical number for mapping polarized data"
# Ties go to the simpler (earlier); an overlap variant only wins where it hides something.
STRATEGY_ORDER = (
    "allreduce", "alltoallv", "neighbor", "pairwise", "hybrid", "butterfly", "alltoallv-overlap", "neighbor-overlap"
)


def ceil_log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


@dataclass(frozen=True)
class LinkCost:
    alpha_s: float
    beta_s_per_byte: float

    def __call__(self, messages, nbytes):
        return self.alpha_s * messages + self.beta_s_per_byte * nbytes


@dataclass(frozen=True)
class Machine:
    """alpha and beta per operation, and the sift speed; ``name`` says where they come from."""

    name: str
    p2p: LinkCost
    allreduce: LinkCost
    alltoallv: LinkCost
    allgather: LinkCost
    sift_s_per_id: float = DEFAULT_SIFT_S_PER_ID
    neighbor: LinkCost | None = None  # Neighbor_alltoallv; None: the Alltoallv's figures
    pairwise: LinkCost | None = None  # XOR-ordered Sendrecv; None: the point-to-point figures

    @property
    def neighbor_link(self) -> LinkCost:
        return self.neighbor or self.alltoallv

    @property
    def pairwise_link(self) -> LinkCost:
        return self.pairwise or self.p2p

    @classmethod
    def uniform(cls, alpha_s: float, beta_s_per_byte: float, name: str, sift_s_per_id: float = DEFAULT_SIFT_S_PER_ID) -> Machine:
        link = LinkCost(alpha_s, beta_s_per_byte)
        return cls(name, link, link, link, link, sift_s_per_id)

    @classmethod
    def from_calibration(cls, calibration: SiteCalibration, name: str | None = None) -> Machine:
        def link(fit) -> LinkCost:
            return LinkCost(fit.alpha_s, fit.beta_s_per_byte)

        return cls(
            name or f"calibration of {calibration.site} ({calibration.host}, {calibration.ranks} ranks, {calibration.created})",
            link(calibration.p2p),
            link(calibration.allreduce),
            link(calibration.alltoallv),
            link(calibration.allgather),
            calibration.sift_s_per_id,
            link(calibration.neighbor) if calibration.neighbor else None,
            link(calibration.pairwise) if calibration.pairwise else None,
        )


# The paper's Table 2 for Franklin (Cray XT4): MPI latency 8.15 us, point-to-point bandwidth 1.65 GB/s.
FRANKLIN = Machine.uniform(8.15e-6, 1.0 / 1.65e9, "Franklin (paper Table 2: 8.15 us, 1.65 GB/s)")
DEFAULT_MACHINE = FRANKLIN


def load_machine(path) -> Machine:
    """The :class:`Machine` of a calibration file (``calibrate --out``)."""
    return Machine.from_calibration(SiteCalibration.model_validate_json(Path(path).read_text()))


def hybrid_thresholds(size: int) -> np.ndarray:
    """Candidate tau: 2, 3, 4, 6, 8, 12, ... up to p (pixels observed by >= tau ranks are 'heavy')."""
    values = {2, 3}
    power = 4
    while power <= max(size, 4):
        values.update({power, 3 * power // 2})
        power *= 2
    return np.array(sorted(v for v in values if v <= max(size, 2)), dtype=np.int64)


# --------------------------------------------------------------------------- per-rank figures


@dataclass
class OverlapFigures:
    """Exact per-rank traffic of every strategy for one decomposition (rows = pixel values, before x k).

    n_local, shared (sum_j o_ij), neighbours [p]; butterfly [p, K + 1] rows
    sent per step and, last, in the fold (extra ranks) or unfold (their
    partners); thresholds [T]; light_shared, light_neighbours [p, T]: the
    Alltoallv part of ``hybrid`` for each tau; heavy_pixels [T]: |H_tau|.
    ``neighbours_exact`` is False when the model sampled ranks for the
    neighbour counts (very large p); then -1 marks unknown entries.
    """

    size: int
    npix: int
    n_local: np.ndarray
    shared: np.ndarray
    neighbours: np.ndarray
    butterfly: np.ndarray
    thresholds: np.ndarray
    light_shared: np.ndarray
    light_neighbours: np.ndarray
    heavy_pixels: np.ndarray
    neighbours_exact: bool = True
    histogram: np.ndarray | None = None

    @property
    def total_local(self) -> int:
        return int(self.n_local.sum())


def figure_row(plan) -> np.ndarray:
    """One rank's figures from its plan, as the int64 row that :func:`figures_from_rows` assembles."""
    thresholds = hybrid_thresholds(plan.size)
    schedule = butterfly_schedule(plan)
    butterfly = np.zeros(butterfly_shape(plan.size)[1] + 1, dtype=np.int64)
    counts = schedule.send_counts()
    if schedule.is_extra:
        butterfly[-1] = counts[0]
    else:
        butterfly[:] = counts
    multiplicity = plan.multiplicity.astype(np.int64)
    light_shared = [int(((multiplicity - 1) * (multiplicity < tau)).sum()) for tau in thresholds]
    if len(plan.neighbours):
        least = np.minimum.reduceat(multiplicity[plan.shared_index], plan.shared_offsets[:-1])
    else:
        least = np.zeros(0, dtype=np.int64)
    light_neighbours = [int((least < tau).sum()) for tau in thresholds]
    owned = plan.owner == plan.rank
    owned_heavy = [int((owned & (multiplicity >= tau)).sum()) for tau in thresholds]
    return np.concatenate(
        [[plan.n_local, plan.n_shared, len(plan.neighbours)], butterfly, light_shared, light_neighbours, owned_heavy]
    ).astype(np.int64)


def figures_from_rows(rows: np.ndarray, npix: int) -> OverlapFigures:
    """:class:`OverlapFigures` from every rank's :func:`figure_row`, [p, width]."""
    size = len(rows)
    thresholds = hybrid_thresholds(size)
    t = len(thresholds)
    b0 = 3
    l0 = b0 + butterfly_shape(size)[1] + 1
    return OverlapFigures(
        size=size,
        npix=npix,
        n_local=rows[:, 0],
        shared=rows[:, 1],
        neighbours=rows[:, 2],
        butterfly=rows[:, b0:l0],
        thresholds=thresholds,
        light_shared=rows[:, l0 : l0 + t],
        light_neighbours=rows[:, l0 + t : l0 + 2 * t],
        heavy_pixels=rows[:, l0 + 2 * t : l0 + 3 * t].sum(axis=0),
    )


def figures_from_plan(comm, plan) -> OverlapFigures:
    """Collective: every rank's exact figures from its plan, gathered to all (identical on every rank)."""
    row = figure_row(plan)
    rows = np.empty((comm.Get_size(), len(row)), dtype=np.int64)
    comm.Allgather(row, rows)
    return figures_from_rows(rows, plan.npix)


def figures_from_plans(plans: list) -> OverlapFigures:
    """The same figures from every rank's plan held in one process (tests, serial cross-checks)."""
    return figures_from_rows(np.array([figure_row(plan) for plan in plans], dtype=np.int64), plans[0].npix)


# --------------------------------------------------------------------------- costs


@dataclass
class StrategyCost:
    """Modeled cost of one reduction call (k values per pixel): the counted traffic and the alpha-beta time."""

    strategy: str
    bytes_max: float
    bytes_mean: float
    messages_max: float
    messages_mean: float
    seconds: float
    details: dict[str, float] = field(default_factory=dict)


def allreduce_traffic(n_pixels: int, buffer_pixels: int, k: int, size: int) -> tuple[int, int, int]:
    """(bytes, messages, pieces) one rank is counted for a buffered Allreduce of n_pixels x k values.

    Exactly the counting of :class:`mapmaker.parallel.reduction.AllreduceReduction`.
    """
    if n_pixels <= 0 or size <= 1:
        pieces = -(-n_pixels // max(1, min(buffer_pixels, n_pixels))) if n_pixels > 0 else 0
        return 0, 0, pieces
    piece = max(1, min(buffer_pixels, n_pixels))
    sent = 0.0
    pieces = 0
    for start in range(0, n_pixels, piece):
        n = min(piece, n_pixels - start)
        sent += 2.0 * n * k * (size - 1) / size * VALUE_BYTES
        pieces += 1
    return round(sent), pieces * 2 * ceil_log2(size), pieces


def _spread(values: np.ndarray) -> tuple[float, float]:
    known = values[values >= 0] if np.any(values >= 0) else np.zeros(1)
    return float(known.max()), float(known.mean())


def strategy_costs(
    figures: OverlapFigures, machine: Machine, *, k: int = 3, buffer_pixels: int = 1 << 16, hideable_s: float = 0.0
) -> dict[str, StrategyCost]:
    """Modeled traffic and time of every strategy for one call with k values per pixel.

    ``hideable_s``: seconds of computation per call that an overlap variant
    can run while its messages travel (the private rows' share of the
    operator); 0 models no overlap at all.
    """
    p = figures.size
    costs: dict[str, StrategyCost] = {}

    nbytes, messages, _ = allreduce_traffic(figures.npix, buffer_pixels, k, p)
    costs["allreduce"] = StrategyCost("allreduce", nbytes, nbytes, messages, messages, machine.allreduce(messages, nbytes))

    costs["alltoallv"] = _alltoallv_cost("alltoallv", figures.shared, figures.neighbours, k, machine.alltoallv)
    costs["neighbor"] = _alltoallv_cost("neighbor", figures.shared, figures.neighbours, k, machine.neighbor_link)
    costs["pairwise"] = _alltoallv_cost("pairwise", figures.shared, figures.neighbours, k, machine.pairwise_link)
    for name, twin in OVERLAP_TWINS.items():
        costs[name] = overlap_cost(name, costs[twin], hideable_s)

    rows = figures.butterfly
    send_bytes = rows * k * VALUE_BYTES
    sends = (rows > 0).astype(np.int64)
    seconds = 0.0
    if p > 1:
        step_times = machine.p2p(sends, send_bytes).max(axis=0)
        seconds = float(step_times[:-1].sum() + 2.0 * step_times[-1])  # fold and unfold move the same rows
    per_rank_bytes, per_rank_messages = send_bytes.sum(axis=1), sends.sum(axis=1)
    costs["butterfly"] = StrategyCost(
        "butterfly",
        float(per_rank_bytes.max()),
        float(per_rank_bytes.mean()),
        float(per_rank_messages.max()),
        float(per_rank_messages.mean()),
        seconds,
        {"steps": float(rows.shape[1] - 1)},
    )

    best = None
    for tau in figures.thresholds:
        option = hybrid_cost(figures, machine, int(tau), k=k, buffer_pixels=buffer_pixels)
        if best is None or option.seconds < best.seconds:
            best = option
    if best is None:  # one rank: nothing shared
        best = StrategyCost("hybrid", 0, 0, 0, 0, 0.0, {"threshold": 2.0, "heavy_pixels": 0.0})
    costs["hybrid"] = best
    return costs


def hybrid_cost(figures: OverlapFigures, machine: Machine, threshold: int, *, k: int = 3, buffer_pixels: int = 1 << 16) -> StrategyCost:
    """``hybrid`` with a given threshold tau (one of ``figures.thresholds``)."""
    j = int(np.flatnonzero(figures.thresholds == threshold)[0])
    light = _alltoallv_cost("hybrid", figures.light_shared[:, j], figures.light_neighbours[:, j], k, machine.alltoallv)
    heavy = int(figures.heavy_pixels[j])
    h_bytes, h_messages, _ = allreduce_traffic(heavy, buffer_pixels, k, figures.size)
    return StrategyCost(
        "hybrid",
        light.bytes_max + h_bytes,
        light.bytes_mean + h_bytes,
        light.messages_max + h_messages,
        light.messages_mean + h_messages,
        light.seconds + machine.allreduce(h_messages, h_bytes),
        {"threshold": float(threshold), "heavy_pixels": float(heavy)},
    )


# Each overlap variant and its blocking twin (same messages and bytes).
OVERLAP_TWINS = {"alltoallv-overlap": "alltoallv", "neighbor-overlap": "neighbor"}


def overlap_cost(name: str, blocking: StrategyCost, hideable_s: float) -> StrategyCost:
    """An overlap variant: its twin's traffic; the time its twin's exceeds the computation it hides behind.

    Exposed seconds = max(0, t_blocking - hideable_s): the overlap can hide
    at most the computation that runs while the messages travel.
    """
    hidden = min(blocking.seconds, max(hideable_s, 0.0))
    return StrategyCost(
        name, blocking.bytes_max, blocking.bytes_mean, blocking.messages_max, blocking.messages_mean,
        blocking.seconds - hidden, {**blocking.details, "hidden_s": hidden},
    )


def _alltoallv_cost(name: str, shared: np.ndarray, neighbours: np.ndarray, k: int, link: LinkCost) -> StrategyCost:
    """Per rank alpha m_i + beta b_i, the slowest rank: the Alltoallv, the neighbourhood collective, the pairwise
    exchange (its m_i Sendrecv one after another) -- each with its own link figures."""
    send_bytes = shared * k * VALUE_BYTES
    messages = np.asarray(neighbours)
    known = messages >= 0
    times = link(np.where(known, messages, 0), send_bytes)
    b_max, b_mean = _spread(send_bytes)
    m_max, m_mean = _spread(messages)
    seconds = float(times.max()) if len(times) else 0.0
    if not known.all():  # ranks whose neighbour count the model sampled: bound them by the sampled maximum
        seconds = max(seconds, float(link(m_max, send_bytes.max())))
    return StrategyCost(name, b_max, b_mean, m_max, m_mean, seconds)


def preprocessing_cost(figures: OverlapFigures, machine: Machine, buffer_pixels: int) -> dict[str, float]:
    """Modeled seconds of the one-time preprocessing: buffered allgather and sift (slowest rank)."""
    p = figures.size
    if p <= 1:
        return {"allgather_s": 0.0, "sift_s": 0.0, "total_s": 0.0, "allgather_bytes": 0.0}
    piece = max(1, min(buffer_pixels, figures.npix))
    ranges = -(-figures.npix // piece)
    received = ID_BYTES * (figures.total_local - int(figures.n_local.min())) + 8 * (p - 1) * ranges
    allgather = machine.allgather(2 * ranges * ceil_log2(p), received)
    sift = machine.sift_s_per_id * figures.total_local
    return {"allgather_s": allgather, "sift_s": sift, "total_s": allgather + sift, "allgather_bytes": float(received)}


# --------------------------------------------------------------------------- the choice for auto


@dataclass
class Workload:
    """How the reduction will be used: calls per realisation and realisations sharing one preprocessing."""

    realizations: int
    iterations: int
    buffer_pixels: int
    hideable_s: float = 0.0  # computation per PCG iteration an overlap variant can hide behind (s)

    @classmethod
    def of_spec(cls, spec) -> Workload:
        """The campaign's realisations; iterations = min(solver.max_iter, 50), the paper's typical PCG count."""
        return cls(spec.realizations, min(spec.solver.max_iter, PAPER_ITERATIONS), spec.solver.allreduce_buffer_pixels)


@dataclass
class Selection:
    requested: str
    chosen: str
    reason: str
    machine: str
    iterations: int
    realizations: int
    modeled: dict[str, dict[str, float]]


def campaign_costs(figures: OverlapFigures, machine: Machine, workload: Workload) -> dict[str, dict[str, float]]:
    """Per strategy: traffic and seconds per iteration (k = 3), preprocessing, and the campaign total.

    A realisation makes one call with k = 12 (hit and preconditioner blocks)
    and iterations + 1 with k = 3 (b, then one per PCG iteration); the
    preprocessing is paid once per campaign by every strategy but allreduce.
    """
    per_iteration = strategy_costs(
        figures, machine, k=3, buffer_pixels=workload.buffer_pixels, hideable_s=workload.hideable_s
    )
    blocks = strategy_costs(figures, machine, k=12, buffer_pixels=workload.buffer_pixels)
    preprocessing = preprocessing_cost(figures, machine, workload.buffer_pixels)["total_s"]
    out = {}
    for name in STRATEGY_ORDER:
        cost = per_iteration[name]
        realisation = blocks[name].seconds + (workload.iterations + 1) * cost.seconds
        pre = 0.0 if name == "allreduce" else preprocessing
        out[name] = {
            "bytes_per_iteration": cost.bytes_max,
            "messages_per_iteration": cost.messages_max,
            "seconds_per_iteration": cost.seconds,
            "preprocessing_s": pre,
            "campaign_s": workload.realizations * realisation + pre,
            **cost.details,
        }
    return out


def select_strategy(figures: OverlapFigures, machine: Machine, workload: Workload, requested: str = "auto") -> Selection:
    """The strategy with the lowest modeled campaign total (ties to the simpler, in STRATEGY_ORDER)."""
    modeled = campaign_costs(figures, machine, workload)
    chosen = min(STRATEGY_ORDER, key=lambda name: (modeled[name]["campaign_s"], STRATEGY_ORDER.index(name)))
    runner_up = min((n for n in STRATEGY_ORDER if n != chosen), key=lambda n: modeled[n]["campaign_s"])
    reason = (
        f"lowest modeled campaign communication: {modeled[chosen]['campaign_s']:.3g} s over {workload.realizations} "
        f"realisation(s) x ({workload.iterations} + 2) reductions with the preprocessing paid once; next "
        f"{runner_up} {modeled[runner_up]['campaign_s']:.3g} s ({machine.name})"
    )
    return Selection(requested, chosen, reason, machine.name, workload.iterations, workload.realizations, modeled)


# --------------------------------------------------------------------------- ranks x threads, and the paper's Figure 6


def per_node(machine: Machine, ranks_per_node: int) -> Machine:
    """``machine`` with ``ranks_per_node`` ranks sharing one node's network interface.

    A fit of one rank per node (Table 2's ping-pong, a calibration of
    ranks on separate nodes) is the bandwidth one rank gets alone; when
    every rank of a node sends at once, each gets 1 / ranks_per_node of it:
    beta x ranks_per_node, alpha unchanged. Fewer, fatter ranks (threads per
    rank) share the interface among fewer senders. The paper's Franklin fit
    agrees: 0.86 / 0.25 = 3.4 for its Allreduce at 1 against 4 ranks per node.
    """
    factor = max(1, int(ranks_per_node))

    def scaled(link: LinkCost) -> LinkCost:
        return LinkCost(link.alpha_s, link.beta_s_per_byte * factor)

    def scaled_optional(link: LinkCost | None) -> LinkCost | None:
        return None if link is None else scaled(link)

    return Machine(
        f"{machine.name}, {factor} rank(s) per node sharing its interface",
        scaled(machine.p2p), scaled(machine.allreduce), scaled(machine.alltoallv), scaled(machine.allgather),
        machine.sift_s_per_id, scaled_optional(machine.neighbor), scaled_optional(machine.pairwise),
    )


def scale_figures(figures: OverlapFigures, factor: float, npix: int) -> OverlapFigures:
    """The figures of the same scan at a finer pixelisation: pixel counts x ``factor``, ``npix`` pixels.

    An area scaling (the overlap fractions, multiplicities and neighbour
    sets of the coarser map kept): exact for sets that are unions of whole
    coarse pixels, an upper bound for the thin strips a few detectors trace.
    """

    def times(values: np.ndarray) -> np.ndarray:
        return np.rint(np.asarray(values) * factor).astype(np.int64)

    return OverlapFigures(
        size=figures.size, npix=int(npix), n_local=times(figures.n_local), shared=times(figures.shared),
        neighbours=figures.neighbours, butterfly=times(figures.butterfly), thresholds=figures.thresholds,
        light_shared=times(figures.light_shared), light_neighbours=figures.light_neighbours,
        heavy_pixels=times(figures.heavy_pixels), neighbours_exact=figures.neighbours_exact,
    )


@dataclass(frozen=True)
class PaperSystem:
    """One platform of the paper (Table 2) and its Figure-6 measurement at 16,384 cores."""

    name: str
    latency_s: float  # Table 2, measured MPI latency (4-byte messages)
    bandwidth_bytes_s: float  # Table 2, measured MPI point-to-point bandwidth
    cores_per_socket: int
    sockets_per_node: int
    threaded_ranks: int  # processes of the threaded run at 16,384 cores (one per socket; issue 24's counts)
    paper_speedup: float  # Figure 6: communication, unthreaded Allreduce / threaded Allgather

    @property
    def cores_per_node(self) -> int:
        return self.cores_per_socket * self.sockets_per_node

    def machine(self) -> Machine:
        return Machine.uniform(self.latency_s, 1.0 / self.bandwidth_bytes_s, f"{self.name} (paper Table 2)")


PAPER_CORES = 16384
PAPER_MAP_VALUES = 150_000_000  # N_p: "150 million", the I, Q, U values of the Planck map (section 3.3)
PAPER_SYSTEMS = (
    PaperSystem("Franklin", 8.15e-6, 1.65e9, 4, 1, 4096, 8.3),
    PaperSystem("Jaguar", 8.26e-6, 1.60e9, 6, 2, 2730, 116.0),
    PaperSystem("Pleiades-H", 1.32e-6, 1.66e9, 4, 2, 4096, 12.7),
    PaperSystem("Pleiades-W", 1.83e-6, 3.13e9, 6, 2, 2730, 22.3),
    PaperSystem("Hopper", 1.40e-6, 5.95e9, 12, 2, 2730, 10.8),  # a Magny-Cours die of 6 cores per process
)
# Section 5.1: the sustained bandwidths Figure 5's fit found on Franklin (bytes/s).
FRANKLIN_SUSTAINED = {"allreduce_unthreaded": 0.25e9, "allreduce_threaded": 0.86e9,
                      "allgather_unthreaded": 0.58e9, "allgather_threaded": 1.15e9}


def franklin_sustained(threaded: bool) -> Machine:
    """Franklin with Figure 5's sustained bandwidths: Allreduce and the Alltoallv (the paper's Allgather fit)."""
    kind = "threaded" if threaded else "unthreaded"
    allreduce = LinkCost(8.15e-6, 1.0 / FRANKLIN_SUSTAINED[f"allreduce_{kind}"])
    exchange = LinkCost(8.15e-6, 1.0 / FRANKLIN_SUSTAINED[f"allgather_{kind}"])
    return Machine(f"Franklin, Figure 5 sustained ({kind})", exchange, allreduce, exchange, exchange)


def figure6_row(system: PaperSystem, original: OverlapFigures, optimized: OverlapFigures, *,
                buffer_pixels: int = 1 << 16) -> dict[str, float | str]:
    """The model's Figure-6 speedup for one system: unthreaded Allreduce on 16,384 ranks against the
    threaded Alltoallv (the paper's 'Allgather' method) on ``system.threaded_ranks`` ranks, per iteration.

    ``original`` / ``optimized``: the scan's figures at those rank counts, scaled to the paper's map.
    Three readings: Table 2's alpha and beta alone (threads change the rank count only); ranks x threads
    (beta x ranks per node: 16,384 / nodes against one rank per socket); and, for Franklin, Figure 5's
    sustained bandwidths. Also the best of every strategy at the threaded rank count (ranks x threads).
    """
    table2 = system.machine()
    threads = system.cores_per_socket if system.threaded_ranks * system.cores_per_socket == PAPER_CORES else (
        PAPER_CORES // system.threaded_ranks)
    unthreaded_node = per_node(table2, system.cores_per_node)
    threaded_node = per_node(table2, max(1, system.cores_per_node // threads))

    def pair(before: Machine, after: Machine) -> tuple[float, float, dict[str, StrategyCost]]:
        slow = strategy_costs(original, before, k=3, buffer_pixels=buffer_pixels)["allreduce"].seconds
        fast = strategy_costs(optimized, after, k=3, buffer_pixels=buffer_pixels)
        return slow, fast["alltoallv"].seconds, fast

    slow_t2, fast_t2, _ = pair(table2, table2)
    slow_node, fast_node, every = pair(unthreaded_node, threaded_node)
    best = min((name for name in STRATEGY_ORDER if name != "allreduce"), key=lambda n: every[n].seconds)
    row: dict[str, float | str] = {
        "system": system.name,
        "unthreaded_ranks": PAPER_CORES,
        "threaded_ranks": system.threaded_ranks,
        "threads_per_rank": threads,
        "paper_speedup": system.paper_speedup,
        "allreduce_s_table2": slow_t2,
        "alltoallv_s_table2": fast_t2,
        "speedup_table2": slow_t2 / fast_t2,
        "allreduce_s_per_node": slow_node,
        "alltoallv_s_per_node": fast_node,
        "speedup_per_node": slow_node / fast_node,
        "best_strategy": best,
        "best_s_per_node": every[best].seconds,
        "best_speedup_per_node": slow_node / every[best].seconds,
    }
    if system.name == "Franklin":
        slow_f, fast_f, _ = pair(franklin_sustained(False), franklin_sustained(True))
        row.update({"allreduce_s_figure5": slow_f, "alltoallv_s_figure5": fast_f, "speedup_figure5": slow_f / fast_f})
    return row
