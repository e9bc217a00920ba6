"""The kernel switch: ``"fast"`` (numba + ducc0, the default) or ``"numpy"`` (the reference).

Both implementations take the same arguments and give the same results --
pixels exactly, everything else to 1e-10 relative (tests/unit/test_mapmaker_fast_kernels.py
checks every kernel and a whole solve). The numpy modules never import numba
or ducc0, so ``"numpy"`` runs without JIT compilation.

The fast kernels are compiled by numba on first use and cached on disk
(``cache=True``, in ``__pycache__`` beside the sources): the first process on
a machine pays the compilation (about 20-40 s for all of them on this
project's 2-core machine), every later one loads them in about a second.
``python -m mapmaker.kernels.implementation`` (run by ``scripts/bootstrap``)
compiles them ahead; :func:`warm_up` does it at the start of a run and
says how long it took.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType

import numpy as np

NAMES = ("fast", "numpy")
DEFAULT = "fast"


@dataclass(frozen=True)
class Kernels:
    """One implementation's kernels, looked up once per run."""

    name: str
    boresight: ModuleType  # satellite(times_s, **angles), ground(times_s, **angles) -> [n, 4]
    pointing: ModuleType  # detector_pointing(q_boresight, q_detector, nside)
    projection: ModuleType  # project_map_to_tod, accumulate_tod_to_map
    blocks: ModuleType  # accumulate_blocks, apply

    @property
    def fast(self) -> bool:
        return self.name == "fast"


def get(name: str = DEFAULT) -> Kernels:
    """The kernels called ``name`` (``"fast"`` or ``"numpy"``)."""
    if name == "numpy":
        from mapmaker.kernels import boresight, pointing, preconditioner, projection

        return Kernels("numpy", boresight, pointing, projection, preconditioner)
    if name == "fast":
        from mapmaker.kernels import pointing_fast, preconditioner_fast, projection_fast

        return Kernels("fast", pointing_fast, pointing_fast, projection_fast, preconditioner_fast)
    raise ValueError(f"unknown kernels {name!r}; choose one of {', '.join(NAMES)}")


def warm_up(name: str = DEFAULT) -> float:
    """Compile (or load from the cache) every kernel of ``name`` on tiny inputs; returns the seconds it took."""
    started = time.perf_counter()
    if name != "fast":
        return 0.0
    from mapmaker.kernels import noise_fast, operator_fast

    kernels = get(name)
    times = np.arange(4, dtype=np.float64)
    q = kernels.boresight.satellite(times, start_longitude=0.0, drift_rate=1e-7, precession_rate=1e-3,
                                    precession_angle=0.7, spin_rate=0.1, spin_angle=0.8)
    kernels.boresight.ground(times, site_latitude=-0.4, elevation=0.8, azimuth_min=0.0, azimuth_max=1.0,
                             azimuth_rate=0.01, start_lst=0.0, earth_rotation=True)
    pixels, weights = kernels.pointing.detector_pointing(q, np.array([1.0, 0.0, 0.0, 0.0]), 1)
    kernels.pointing.vec2pix(1, weights[:, 0], weights[:, 1], weights[:, 2])
    local_map = np.ones((12, 3))
    starts, lengths = np.array([0], dtype=np.int64), np.array([4], dtype=np.int64)
    for index in (pixels.astype(np.int32),):  # the cache's index type (see mapmaker.solve.local_data)
        kernels.projection.first_visit_order(index.copy(), 12)
        tod = kernels.projection.project_map_to_tod(local_map, index, weights)
        kernels.projection.accumulate_tod_to_map(tod, index, weights, 12)
        blocks = kernels.blocks.accumulate_blocks(index, weights, 12)
        kernels.blocks.accumulate_blocks(index, weights, 12, np.ones(4))
        kernels.blocks.apply(np.ones((12, 3, 3)), local_map)
        circulant = [noise_fast.CirculantFilter(np.ones(3), 4), noise_fast.CirculantFilter(np.ones(3), 5)]
        noise_fast.CirculantFilter(np.ones(5), 8, four_step_from=0).apply(np.ones(8))  # the four-step kernels
        noise_fast.apply_inverse_noise(tod, starts, lengths, np.zeros(1, dtype=np.int64), circulant)
        noise_fast.apply_inverse_noise(np.ones(5), starts, lengths + 1, np.ones(1, dtype=np.int64), circulant)
        operator_fast.apply_inverse_noise_operator(local_map, index, weights, starts, lengths,
                                                   np.zeros(1, dtype=np.int64), circulant)
        operator_fast.apply_white_operator(local_map, index, weights, starts, lengths, np.ones(1))
    del blocks
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"mapmaker: fast kernels compiled and cached in {warm_up('fast'):.1f} s")
