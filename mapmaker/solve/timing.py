"""Wall-clock accounting of one rank: split into calc, comm and io, and into the realisation's stages."""
from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import get_args

from schemas.result import Stage

KINDS = ("calc", "comm", "io")

# The stages of a realisation, in the order they run (schemas.result.RealizationResult.stages):
# sky synthesis (or the user map read), pointing (each rank's cache), distribution (pixel owners, the
# reduction, the 3x3 blocks and the cut, the sky's broadcast), simulate (d simulated and b = P^T N^-1 d),
# coarse (the two-level preconditioner's set-up), solve (PCG), gather (the maps on root), products
# (mask, coupling, spectra and bandpowers) and write (the product files).
STAGES: tuple[str, ...] = get_args(Stage)


class Timers:
    """Seconds spent per kind; ``with timers("comm"): ...`` adds the block's wall time.

    ``with timers.stage("solve"): ...`` adds the block's wall time to that stage as well (stages do not
    nest; kinds nest inside stages).
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.stages: dict[str, float] = {}
        self.started = time.perf_counter()

    @contextmanager
    def __call__(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[kind] += time.perf_counter() - start

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - start

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def peak_memory_mib() -> float:
    """Peak resident set size of this process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
