"""The kernel registry: every kernel family in its two implementations, ``"fast"`` and ``"numpy"``.

``"fast"`` (numba + ducc0, the default) and ``"numpy"`` (the reference) take
the same arguments and give the same results -- pixels exactly, everything
else to 1e-10 relative (tests/unit/test_mapmaker_fast_kernels.py checks
every kernel and a whole solve). Callers hold a :class:`Kernels` from
:func:`get` and call its families; nothing else looks at an implementation's
name. The numpy modules never import numba or ducc0, so ``"numpy"`` runs
without JIT compilation.

The fast kernels are compiled by numba on first use and cached on disk
(``cache=True``, in ``__pycache__`` beside the sources): the first process on
a machine pays the compilation (about 20-40 s for all of them on this
project's 2-core machine), every later one loads them in about a second.
``python -m mapmaker.kernels.implementation`` (run by ``scripts/bootstrap``)
removes the old caches (:func:`forget_compiled`: why) and compiles them
ahead; :func:`warm_up` does it at the start of a run and says how long it took.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

NAMES = ("fast", "numpy")
DEFAULT = "fast"

# family -> module of mapmaker.kernels per implementation. What each family's module provides:
#   boresight   satellite(times_s, **angles), ground(times_s, **angles) -> quaternions [n, 4]
#   pointing    detector_pointing(q_boresight, q_detector, nside) -> pixels [n], weights [n, 3]
#   projection  P: project_map_to_tod; P^T: accumulate_tod_to_map, accumulate_tod_to_rows (of some rows' samples);
#               first_visit_order, permute_rows (pixel rows)
#   blocks      3x3 blocks: accumulate_blocks, rcond, invert, apply (the preconditioner)
#   noise       N^-1 per stationary interval: inverse_noise_filters, apply_inverse_noise, apply_inverse_white
#   operator    the PCG operator P^T N^-1 P: apply_inverse_noise_operator, apply_white_operator
#   coarse      the two-level preconditioner's coarse space: restrict, restrict_and_gather, prolong_add
#   exchange    a pixel reduction's shared rows: gather_rows (packed to send), add_rows (received, added)
#   vectors     PCG's map-sized passes: dot, dot_and_norm (owned-weighted), step (x and r), conjugate (p)
FAMILIES: dict[str, dict[str, str]] = {
    "boresight": {"numpy": "boresight", "fast": "pointing_fast"},
    "pointing": {"numpy": "pointing", "fast": "pointing_fast"},
    "projection": {"numpy": "projection", "fast": "projection_fast"},
    "blocks": {"numpy": "preconditioner", "fast": "preconditioner_fast"},
    "noise": {"numpy": "noise", "fast": "noise_fast"},
    "operator": {"numpy": "operator", "fast": "operator_fast"},
    "coarse": {"numpy": "coarse_space", "fast": "coarse_space_fast"},
    "exchange": {"numpy": "exchange", "fast": "exchange_fast"},
    "vectors": {"numpy": "vectors", "fast": "vectors_fast"},
}
COMPILED = {"numpy": False, "fast": True}


@dataclass(frozen=True)
class Kernels:
    """One implementation's kernels, looked up once per run (the families of :data:`FAMILIES`)."""

    name: str
    compiled: bool  # numba: numba's threads apply, warm_up compiles, visit-order pixel rows pay
    boresight: ModuleType
    pointing: ModuleType
    projection: ModuleType
    blocks: ModuleType
    noise: ModuleType
    operator: ModuleType
    coarse: ModuleType
    exchange: ModuleType
    vectors: ModuleType


def get(name: str = DEFAULT) -> Kernels:
    """The kernels called ``name`` (``"fast"`` or ``"numpy"``)."""
    if name not in NAMES:
        raise ValueError(f"unknown kernels {name!r}; choose one of {', '.join(NAMES)}")
    # Imported by name, on demand: the fast modules import numba (~0.5 s and ~30 MiB per process),
    # which a "numpy" run never pays.
    modules = {
        family: importlib.import_module(f"mapmaker.kernels.{implementations[name]}")
        for family, implementations in FAMILIES.items()
    }
    return Kernels(name=name, compiled=COMPILED[name], **modules)


def warm_up(name: str = DEFAULT) -> float:
    """Compile (or load from the cache) every kernel of ``name`` on tiny inputs; returns the seconds it took."""
    started = time.perf_counter()
    kernels = get(name)
    if not kernels.compiled:
        return 0.0
    times = np.arange(4, dtype=np.float64)
    q = kernels.boresight.satellite(times, start_longitude=0.0, drift_rate=1e-7, precession_rate=1e-3,
                                    precession_angle=0.7, spin_rate=0.1, spin_angle=0.8)
    kernels.boresight.ground(times, site_latitude=-0.4, elevation=0.8, azimuth_min=0.0, azimuth_max=1.0,
                             azimuth_rate=0.01, start_lst=0.0, earth_rotation=True)
    pixels, weights = kernels.pointing.detector_pointing(q, np.array([1.0, 0.0, 0.0, 0.0]), 1)
    kernels.pointing.vec2pix(1, weights[:, 0], weights[:, 1], weights[:, 2])
    local_map = np.ones((12, 3))
    starts, lengths = np.array([0], dtype=np.int64), np.array([4], dtype=np.int64)
    index = pixels.astype(np.int32)  # the pointing cache's index type (see mapmaker.kernels.pixels)
    kernels.projection.first_visit_order(index.copy(), 12)
    for order_type in (np.int32, np.int64):  # visit order's order and position take local_index's type
        kernels.projection.permute_rows(local_map, np.arange(12, dtype=order_type))
        # the set-up's blocks, each half of [n, 12] written as a strided view
        kernels.projection.permute_rows(np.ones((12, 6)), np.arange(12, dtype=order_type), np.empty((12, 12))[:, :6])
    filters = kernels.noise.inverse_noise_filters([np.ones(3), np.ones(3)], {0: 4, 1: 5})
    kernels.noise.CirculantFilter(np.ones(5), 8, four_step_from=0).apply(np.ones(8))  # the four-step kernels
    # float32: the cached weights (solver.pointing = "cached"); float64: recomputed ones.
    for sample_weights in (weights.astype(np.float32), weights):
        tod = kernels.projection.project_map_to_tod(local_map, index, sample_weights)
        kernels.projection.accumulate_tod_to_map(tod, index, sample_weights, 12)
        kernels.projection.accumulate_tod_to_rows(tod, index, sample_weights, np.ones(12, dtype=bool), True, local_map.copy())
        kernels.blocks.accumulate_blocks(index, sample_weights, 12)
        kernels.blocks.accumulate_blocks(index, sample_weights, 12, np.ones(4))
        kernels.noise.apply_inverse_noise(tod, starts, lengths, np.zeros(1, dtype=np.int64), filters)
        kernels.operator.apply_inverse_noise_operator(local_map, index, sample_weights, starts, lengths,
                                                      np.zeros(1, dtype=np.int64), filters)
        kernels.operator.apply_white_operator(local_map, index, sample_weights, starts, lengths, np.ones(1))
    kernels.blocks.rcond(np.ones((12, 12))[:, :6])  # the set-up's geometric half of its [n, 12] blocks
    kernels.blocks.apply(np.ones((12, 3, 3)), local_map)
    rows = np.arange(36, dtype=np.int32)  # the coarse space's flat rows and columns (int32 below 2^31 rows)
    kernels.coarse.restrict_and_gather(local_map, local_map, rows, rows % 4, 3, np.empty(36, dtype=np.float32))
    kernels.coarse.restrict(local_map, rows, rows % 4, 3)
    kernels.coarse.prolong_add(np.ones(3), rows % 4, local_map)
    shared = np.arange(12, dtype=np.int64)  # a reduction's shared rows (int64), of the maps and of the [n, 12] blocks
    kernels.exchange.add_rows(local_map, shared, kernels.exchange.gather_rows(local_map, shared, np.empty((12, 3))))
    for weight in (None, np.ones(12)):  # owned-weighted on several ranks, not on one
        kernels.vectors.dot(local_map, local_map, weight)
        kernels.vectors.dot_and_norm(local_map, local_map, weight)
    kernels.vectors.step(local_map, local_map.copy(), local_map.copy(), local_map.copy(), 0.5, np.empty((12, 3)))
    kernels.vectors.conjugate(local_map, local_map.copy(), 0.5)
    kernels.noise.apply_inverse_noise(np.ones(5), starts, lengths + 1, np.ones(1, dtype=np.int64), filters)
    return time.perf_counter() - started


def forget_compiled(folder: Path = Path(__file__).parent) -> int:
    """Remove numba's on-disk caches (``__pycache__/*.nbi``, ``*.nbc``) of the kernels in ``folder``; return how many went.

    numba invalidates a cached function when its own source file changes, not when a function it
    inlines from another module does (``rows``, ``prefetch``, ``streaming`` are inlined into the
    projection and operator kernels), so a copy upgraded in place could keep running the old
    code. The ahead-of-time compile (``python -m mapmaker.kernels.implementation``, which
    ``scripts/bootstrap`` runs after every install) starts from nothing instead.
    """
    cached = [*folder.glob("__pycache__/*.nbi"), *folder.glob("__pycache__/*.nbc")]
    for path in cached:
        path.unlink(missing_ok=True)
    return len(cached)


if __name__ == "__main__":
    forgotten = forget_compiled()
    print(f"mapmaker: fast kernels compiled and cached in {warm_up('fast'):.1f} s ({forgotten} older cache files removed)")
